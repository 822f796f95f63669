/* digest64: the fast digest both loaders check each artifact part by (defined, and its choice
 * explained, in tilefold/artifact/format.py; tf_digest64 must give what format.digest64 gives,
 * which tests/aot/test_digest.py checks). Included by runtime.c; libc and libpthread only.
 * Words are read in the host's byte order: artifacts run only on little-endian hosts.
 */
#ifndef TILEFOLD_DIGEST64_H
#define TILEFOLD_DIGEST64_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define TF_DIGEST_BLOCK 32768
#define TF_DIGEST_SEED 0x746966f1d5e3a1b7ULL

static uint64_t tf_digest_keys[TF_DIGEST_BLOCK];
static pthread_once_t tf_digest_once = PTHREAD_ONCE_INIT;

static uint64_t tf_fmix64(uint64_t z) {
  z ^= z >> 33;
  z *= 0xff51afd7ed558ccdULL;
  z ^= z >> 33;
  z *= 0xc4ceb9fe1a85ec53ULL;
  return z ^ (z >> 33);
}

/* K[j]: splitmix64's outputs 1 .. TF_DIGEST_BLOCK from seed 0. */
static void tf_digest_make_keys(void) {
  for (uint64_t j = 0; j < TF_DIGEST_BLOCK; j++) {
    uint64_t z = (j + 1) * 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    tf_digest_keys[j] = z ^ (z >> 31);
  }
}

static uint64_t tf_digest_word(uint64_t w, uint64_t key) {
  uint64_t x = w ^ key;
  return (x & 0xffffffffULL) * (x >> 32) + w;
}

/* One block's sum; the compiler vectorizes it (SSE2's pmuludq multiplies 32-bit halves), so
 * it runs near memory speed; gcc needs -O3 for that. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static uint64_t tf_digest_block(const uint8_t *p, size_t words) {
  uint64_t sum = 0;
  for (size_t j = 0; j < words; j++) {
    uint64_t w;
    memcpy(&w, p + 8 * j, sizeof w);
    sum += tf_digest_word(w, tf_digest_keys[j]);
  }
  return sum;
}

/* The digest64 of the n bytes at p. */
static uint64_t tf_digest64(const uint8_t *p, size_t n) {
  pthread_once(&tf_digest_once, tf_digest_make_keys);
  size_t words = n / 8, rest = n % 8, total = words + (rest > 0);
  uint64_t state = tf_fmix64((uint64_t)n ^ TF_DIGEST_SEED);
  for (size_t start = 0; start < total; start += TF_DIGEST_BLOCK) {
    size_t count = total - start < TF_DIGEST_BLOCK ? total - start : TF_DIGEST_BLOCK;
    size_t whole = count < words - start ? count : words - start;
    uint64_t sum = tf_digest_block(p + 8 * start, whole);
    if (whole < count) { /* the last bytes, zero-padded to a word */
      uint64_t w = 0;
      memcpy(&w, p + 8 * words, rest);
      sum += tf_digest_word(w, tf_digest_keys[whole]);
    }
    state = tf_fmix64(state + sum);
  }
  return state;
}

#endif
