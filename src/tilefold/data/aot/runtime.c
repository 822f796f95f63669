/* The C runtime of an exported artifact (tilefold_model.h), compiled into its library after
 * the step program's tables, which `tilefold/aot/c_abi.py` writes as C arrays ahead of this
 * text. It does what tilefold/artifact/load.py does from Python: checks the CPU's features
 * and data.bin's size and digest64 (digest64.h), maps the constants copy-on-write, allocates
 * the other buffers, writes the pointer words and array headers, fills the int64 table and
 * runs the whole model as one call of tf_replay. libc and libpthread only.
 */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "digest64.h"
#include "tilefold_model.h"

void tf_replay(int64_t *table);
int32_t tilefold_pool_init(void);
int32_t tilefold_pool_start(int32_t size, const int32_t *cpus, const uint64_t *worker_cpus,
                            int64_t spin_ns);

enum { KIND_DATA, KIND_WORKSPACE, KIND_INPUT, KIND_OUTPUT, KIND_STATUS };
enum { ARG_VALUE, ARG_ADDRESS, ARG_OBJECT, ARG_FUNCTION };

struct tf_model {
  uint8_t *data; /* data.bin, mapped privately */
  size_t data_bytes;
  uint8_t *buffers[TF_NBUFFERS + 1]; /* + 1: no array is empty */
  uint8_t *workspace; /* every other buffer, in one zeroed anonymous mapping */
  size_t workspace_bytes;
  int64_t *headers[TF_NOBJECTS + 1];
  int64_t table[TF_NENTRIES + 1];
};

static __thread char tf_message[512];

static int tf_fail(int status, const char *format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(tf_message, sizeof tf_message, format, args);
  va_end(args);
  return status;
}

const char *tf_last_error(void) { return tf_message; }

/* ---- checks ---- */

/* Whether /proc/cpuinfo's flags list `flag` as a whole word. */
static int tf_has_flag(const char *flags, const char *flag) {
  size_t n = strlen(flag);
  for (const char *p = strstr(flags, flag); p; p = strstr(p + 1, flag))
    if ((p == flags || p[-1] == ' ' || p[-1] == '\t') && (p[n] == ' ' || p[n] == '\n' ||
                                                          p[n] == '\0'))
      return 1;
  return 0;
}

static int tf_check_cpu(void) {
  char line[8192];
  const char *flags = NULL;
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0) {
      flags = strchr(line, ':');
      break;
    }
  if (f) fclose(f);
  for (int i = 0; i < TF_NFLAGS; i++)
    if (!flags || !tf_has_flag(flags + 1, tf_flags[i]))
      return tf_fail(TF_ERROR_CPU, "this CPU lacks %s, which the code exported for %s uses",
                     tf_flags[i], tf_target);
  return TF_OK;
}

static int tf_map_data(tf_model *m, const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/data.bin", dir);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return tf_fail(TF_ERROR_FILE, "%s: cannot open it", path);
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size != TF_DATA_BYTES) {
    close(fd);
    return tf_fail(TF_ERROR_CORRUPT, "%s: %lld bytes, the library was exported with %lld",
                   path, (long long)st.st_size, (long long)TF_DATA_BYTES);
  }
  if (TF_DATA_BYTES > 0) {
    void *p = mmap(NULL, TF_DATA_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      close(fd);
      return tf_fail(TF_ERROR_FILE, "%s: cannot map it", path);
    }
    m->data = p;
    m->data_bytes = TF_DATA_BYTES;
  }
  close(fd);
  if (tf_digest64(m->data, m->data_bytes) != tf_data_digest64)
    return tf_fail(TF_ERROR_CORRUPT, "%s: digest64 differs from the one it was exported with "
                   "(altered or damaged after export)", path);
  return TF_OK;
}

/* ---- the native pool: started once per library ---- */

int tf_claim_pool(void) {
  static int claimed;
  return !__atomic_exchange_n(&claimed, 1, __ATOMIC_SEQ_CST);
}

static void tf_start_pool(void) {
  if (!tf_claim_pool()) return;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const char *given = getenv("TILEFOLD_NUM_THREADS");
  int size = given && atoi(given) > 0 ? atoi(given) : (int)(cpus > 0 ? cpus : 1);
  if (size > TF_MAX_THREADS) size = TF_MAX_THREADS;
  int32_t unpinned[TF_MAX_THREADS];
  uint64_t none[16] = {0};
  for (int i = 0; i < size; i++) unpinned[i] = -1;
  if (tilefold_pool_init() == 0) tilefold_pool_start(size, unpinned, none, 2000000);
}

/* ---- load, run, free ---- */

static uint8_t *tf_at(tf_model *m, int64_t buffer, int64_t offset) {
  return m->buffers[buffer] + offset;
}

int tf_model_load(const char *dir, tf_model **model) {
  if (!model || !dir)
    return tf_fail(TF_ERROR_ARGUMENT, "tf_model_load(dir, &model): NULL given");
  *model = NULL;
  int status = tf_check_cpu();
  if (status != TF_OK) return status;
  tf_model *m = calloc(1, sizeof *m);
  if (!m) return tf_fail(TF_ERROR_MEMORY, "out of memory");
  status = tf_map_data(m, dir);
  if (status != TF_OK) {
    tf_model_free(m);
    return status;
  }
  /* The other buffers: one anonymous mapping, each 64-byte aligned with 64 bytes to spare.
   * Its pages are zero and made on first touch: no memset of what may be 100 MB at load.
   * (Not MADV_HUGEPAGE: where the kernel compacts memory for it on a fault, the default,
   * it made the first call ~100 ms slower.) */
  size_t at = 0, offsets[TF_NBUFFERS + 1];
  for (int i = 0; i < TF_NBUFFERS; i++) {
    offsets[i] = at;
    if (tf_buffers[i][0] != KIND_DATA) at += ((size_t)tf_buffers[i][1] + 127) / 64 * 64;
  }
  if (at > 0) {
    void *p = mmap(NULL, at, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      tf_model_free(m);
      return tf_fail(TF_ERROR_MEMORY, "out of memory for %lld bytes of buffers", (long long)at);
    }
    m->workspace = p;
    m->workspace_bytes = at;
  }
  for (int i = 0; i < TF_NBUFFERS; i++)
    m->buffers[i] = tf_buffers[i][0] == KIND_DATA ? m->data + tf_buffers[i][2]
                                                  : m->workspace + offsets[i];
  for (int i = 0; i < TF_NPOINTERS; i++) {
    int64_t address = (int64_t)tf_at(m, tf_pointers[i][2], tf_pointers[i][3]);
    memcpy(tf_at(m, tf_pointers[i][0], tf_pointers[i][1]), &address, sizeof address);
  }
  for (int i = 0; i < TF_NOBJECTS; i++) {
    int64_t nd = tf_objects[i][2];
    int64_t *h = m->headers[i] = calloc((size_t)(TF_HEADER_WORDS + 2 * nd), sizeof *h);
    if (!h) {
      tf_model_free(m);
      return tf_fail(TF_ERROR_MEMORY, "out of memory");
    }
    memcpy(h + TF_HEADER_WORDS, tf_dims + tf_objects[i][3], (size_t)(2 * nd) * sizeof *h);
    h[TF_HEADER_DATA] = (int64_t)tf_at(m, tf_objects[i][0], tf_objects[i][1]);
    h[TF_HEADER_ND] = nd;
    h[TF_HEADER_DIMS] = (int64_t)(h + TF_HEADER_WORDS);
    h[TF_HEADER_STRIDES] = (int64_t)(h + TF_HEADER_WORDS + nd);
  }
  for (int i = 0; i < TF_NENTRIES; i++) {
    int64_t a = tf_entries[i][1], b = tf_entries[i][2];
    switch (tf_entries[i][0]) {
      case ARG_VALUE: m->table[i] = a; break;
      case ARG_ADDRESS: m->table[i] = (int64_t)tf_at(m, a, b); break;
      case ARG_OBJECT: m->table[i] = (int64_t)m->headers[a]; break;
      default: m->table[i] = (int64_t)tf_functions[a]; break;
    }
  }
  tf_start_pool();
  *model = m;
  return TF_OK;
}

static int tf_check(const tf_tensor *given, const int64_t io[5], int number, const char *side) {
  if (given->dtype != io[2] || given->ndim != io[3] || (io[3] && !given->shape) || !given->data)
    return tf_fail(TF_ERROR_ARGUMENT, "%s %d: dtype %d, rank %d expected (got %d, %d)", side,
                   number, (int)io[2], (int)io[3], given->dtype, given->ndim);
  for (int d = 0; d < io[3]; d++)
    if (given->shape[d] != tf_dims[io[4] + d])
      return tf_fail(TF_ERROR_ARGUMENT, "%s %d: dim %d is %lld, the model takes %lld", side,
                     number, d, (long long)given->shape[d], (long long)tf_dims[io[4] + d]);
  return TF_OK;
}

/* Copy between a C-contiguous array and a strided one (bytes strides), `to_strided` or back. */
static void tf_copy(uint8_t *contiguous, uint8_t *strided, const int64_t *shape,
                    const int64_t *strides, int nd, int64_t item, int to_strided) {
  if (nd == 0) {
    if (to_strided) memcpy(strided, contiguous, (size_t)item);
    else memcpy(contiguous, strided, (size_t)item);
    return;
  }
  int64_t inner = item;
  for (int d = 1; d < nd; d++) inner *= shape[d];
  for (int64_t i = 0; i < shape[0]; i++)
    tf_copy(contiguous + i * inner, strided + i * strides[0], shape + 1, strides + 1, nd - 1,
            item, to_strided);
}

int tf_model_run(tf_model *m, const tf_tensor *inputs, int num_inputs, const tf_tensor *outputs,
                 int num_outputs) {
  if (!m) return tf_fail(TF_ERROR_ARGUMENT, "no model (tf_model_load failed?)");
  if (num_inputs != TF_NINPUTS || num_outputs != TF_NOUTPUTS)
    return tf_fail(TF_ERROR_ARGUMENT, "the model takes %d inputs and %d outputs, not %d and %d",
                   TF_NINPUTS, TF_NOUTPUTS, num_inputs, num_outputs);
  for (int i = 0; i < TF_NINPUTS; i++)
    if (tf_check(&inputs[i], tf_inputs[i], i, "input") != TF_OK) return TF_ERROR_ARGUMENT;
  for (int i = 0; i < TF_NOUTPUTS; i++)
    if (tf_check(&outputs[i], tf_outputs[i], i, "output") != TF_OK) return TF_ERROR_ARGUMENT;
  for (int i = 0; i < TF_NINPUTS; i++) {
    const int64_t *io = tf_inputs[i];
    tf_copy(inputs[i].data, tf_at(m, io[0], io[1]), tf_dims + io[4], tf_dims + io[4] + io[3],
            (int)io[3], tf_itemsize[io[2]], 1);
  }
  tf_replay(m->table);
  for (int i = 0; i < TF_NSTATUS; i++) {
    int64_t *word = (int64_t *)m->buffers[tf_status[i]];
    if (*word) {
      *word = 0;
      return tf_fail(TF_ERROR_INDEX, "an index of a gather or index_put is out of range");
    }
  }
  for (int i = 0; i < TF_NOUTPUTS; i++) {
    const int64_t *io = tf_outputs[i];
    tf_copy(outputs[i].data, tf_at(m, io[0], io[1]), tf_dims + io[4], tf_dims + io[4] + io[3],
            (int)io[3], tf_itemsize[io[2]], 0);
  }
  return TF_OK;
}

void tf_model_free(tf_model *m) {
  if (!m) return;
  for (int i = 0; i < TF_NOBJECTS; i++) free(m->headers[i]);
  if (m->workspace) munmap(m->workspace, m->workspace_bytes);
  if (m->data) munmap(m->data, m->data_bytes);
  free(m);
}
