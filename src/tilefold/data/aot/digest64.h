/* digest64: the fast digest both loaders check each artifact part by (defined, and its choice
 * explained, in tilefold/artifact/format.py; tf_digest64 must give what format.digest64 gives,
 * which tests/aot/test_digest.py checks). Included by runtime_common.h; libc and libpthread
 * only; tf_digest64_threaded splits the blocks over threads, as the NumPy side does.
 * Words are read in the host's byte order: artifacts run only on little-endian hosts.
 */
#ifndef TILEFOLD_DIGEST64_H
#define TILEFOLD_DIGEST64_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
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

/* The sums of blocks first .. last-1 of the n bytes at p (sums[0] the first's). */
static void tf_digest64_block_sums(const uint8_t *p, size_t n, size_t first, size_t last,
                                   uint64_t *sums) {
  pthread_once(&tf_digest_once, tf_digest_make_keys);
  size_t words = n / 8, rest = n % 8, total = words + (rest > 0);
  for (size_t block = first; block < last; block++) {
    size_t start = block * TF_DIGEST_BLOCK;
    size_t count = total - start < TF_DIGEST_BLOCK ? total - start : TF_DIGEST_BLOCK;
    size_t whole = count < words - start ? count : words - start;
    uint64_t sum = tf_digest_block(p + 8 * start, whole);
    if (whole < count) { /* the last bytes, zero-padded to a word */
      uint64_t w = 0;
      memcpy(&w, p + 8 * words, rest);
      sum += tf_digest_word(w, tf_digest_keys[whole]);
    }
    sums[block - first] = sum;
  }
}

/* The blocks' sums chained in order, seeded with the length. */
static uint64_t tf_digest64_chain(size_t n, const uint64_t *sums, size_t blocks) {
  uint64_t state = tf_fmix64((uint64_t)n ^ TF_DIGEST_SEED);
  for (size_t b = 0; b < blocks; b++) state = tf_fmix64(state + sums[b]);
  return state;
}

/* The digest64 of the n bytes at p. */
static uint64_t tf_digest64(const uint8_t *p, size_t n) {
  size_t total = n / 8 + (n % 8 > 0), blocks = (total + TF_DIGEST_BLOCK - 1) / TF_DIGEST_BLOCK;
  uint64_t state = tf_fmix64((uint64_t)n ^ TF_DIGEST_SEED), sum;
  for (size_t b = 0; b < blocks; b++) {
    tf_digest64_block_sums(p, n, b, b + 1, &sum);
    state = tf_fmix64(state + sum);
  }
  return state;
}

typedef struct {
  const uint8_t *p;
  size_t n, first, last;
  uint64_t *sums;
} tf_digest_part;

static void *tf_digest_worker(void *arg) {
  tf_digest_part *part = arg;
  tf_digest64_block_sums(part->p, part->n, part->first, part->last, part->sums + part->first);
  return NULL;
}

#define TF_DIGEST_MAX_THREADS 4

/* tf_digest64 with the blocks' sums split over up to `threads` threads (at most
 * TF_DIGEST_MAX_THREADS, a few blocks each), then chained; serial where threads fail. */
static uint64_t tf_digest64_threaded(const uint8_t *p, size_t n, int threads) {
  size_t total = n / 8 + (n % 8 > 0), blocks = (total + TF_DIGEST_BLOCK - 1) / TF_DIGEST_BLOCK;
  size_t parts = threads < 1 ? 1 : (size_t)threads;
  if (parts > TF_DIGEST_MAX_THREADS) parts = TF_DIGEST_MAX_THREADS;
  if (parts > blocks / 4) parts = blocks / 4;
  uint64_t *sums = parts > 1 ? malloc(blocks * sizeof *sums) : NULL;
  if (!sums) return tf_digest64(p, n);
  pthread_once(&tf_digest_once, tf_digest_make_keys);
  tf_digest_part part[TF_DIGEST_MAX_THREADS];
  pthread_t worker[TF_DIGEST_MAX_THREADS];
  int started[TF_DIGEST_MAX_THREADS] = {0};
  for (size_t i = 0; i < parts; i++) {
    part[i] = (tf_digest_part){p, n, blocks * i / parts, blocks * (i + 1) / parts, sums};
    if (i > 0) started[i] = pthread_create(&worker[i], NULL, tf_digest_worker, &part[i]) == 0;
  }
  tf_digest_worker(&part[0]);
  for (size_t i = 1; i < parts; i++) {
    if (started[i]) pthread_join(worker[i], NULL);
    else tf_digest_worker(&part[i]);
  }
  uint64_t state = tf_digest64_chain(n, sums, blocks);
  free(sums);
  return state;
}

#endif
