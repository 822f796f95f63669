/* What both C runtimes of an artifact share (runtime.c: static shapes; runtime_symbolic.c:
 * size classes): error messages, the CPU check, data.bin mapped and digested, the library's
 * pool started once, copies between a caller's tensor and a strided buffer. Included after
 * the step program's tables (TF_NFLAGS, tf_flags, tf_target, TF_DATA_BYTES,
 * tf_data_digest64, TF_MAX_THREADS); libc and libpthread only.
 */
#ifndef TILEFOLD_RUNTIME_COMMON_H
#define TILEFOLD_RUNTIME_COMMON_H

#include <dlfcn.h>
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

enum { KIND_DATA, KIND_WORKSPACE, KIND_INPUT, KIND_OUTPUT, KIND_STATUS };
enum { ARG_VALUE, ARG_ADDRESS, ARG_OBJECT, ARG_FUNCTION };

int32_t tilefold_pool_init(void);
int32_t tilefold_pool_start(int32_t size, const int32_t *cpus, const uint64_t *worker_cpus,
                            int64_t spin_ns);

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

/* The flags of /proc/cpuinfo's first CPU, read into line[n]; "" when there are none. */
static const char *tf_cpu_flags(char *line, int n) {
  const char *flags = NULL;
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && fgets(line, n, f))
    if (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0) {
      flags = strchr(line, ':');
      break;
    }
  if (f) fclose(f);
  return flags ? flags + 1 : "";
}

static int tf_check_cpu(const char *flags) {
  for (int i = 0; i < TF_NFLAGS; i++)
    if (!tf_has_flag(flags, tf_flags[i]))
      return tf_fail(TF_ERROR_CPU, "this CPU lacks %s, which the code exported for %s uses",
                     tf_flags[i], tf_target);
  return TF_OK;
}

/* The first flag of the space-separated `wanted` that `flags` lacks, copied into lack[n]
 * (1), or 0 when it has them all. */
static int tf_lacks(const char *flags, const char *wanted, char *lack, size_t n) {
  for (const char *w = wanted; *w;) {
    size_t len = strcspn(w, " ");
    snprintf(lack, n, "%.*s", (int)len, w);
    if (len && !tf_has_flag(flags, lack)) return 1;
    w += len + (w[len] == ' ');
  }
  return 0;
}

/* The first target of the chain the artifact was exported for (tf_chain_*) whose flags
 * this CPU has; TILEFOLD_ARTIFACT_TARGET names the one to take instead (checked all the
 * same: a test's way to a target the CPU lacks). A negative status when none fits. */
static int tf_pick(const char *flags) {
  const char *forced = getenv("TILEFOLD_ARTIFACT_TARGET");
  int first = 0, last = TF_NCHAIN;
  if (forced && *forced) {
    while (first < TF_NCHAIN && strcmp(tf_chain_names[first], forced) != 0) first++;
    if (first == TF_NCHAIN)
      return -tf_fail(TF_ERROR_ARGUMENT, "TILEFOLD_ARTIFACT_TARGET=%s: not a target this "
                      "artifact was exported for (the first is %s)", forced, tf_chain_names[0]);
    last = first + 1;
  }
  char why[400] = "", lack[64];
  for (int i = first; i < last; i++) {
    if (!tf_lacks(flags, tf_chain_flags[i], lack, sizeof lack)) return i;
    size_t at = strlen(why);
    snprintf(why + at, sizeof why - at, "%s%s lacks %s", at ? "; " : "", tf_chain_names[i],
             lack);
  }
  return -tf_fail(TF_ERROR_CPU, "this CPU runs none of the targets the artifact was exported "
                  "for (%s)", why);
}

/* The pool's size: TILEFOLD_NUM_THREADS, else the online CPUs, at most TF_MAX_THREADS. */
static int tf_threads(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const char *given = getenv("TILEFOLD_NUM_THREADS");
  int size = given && atoi(given) > 0 ? atoi(given) : (int)(cpus > 0 ? cpus : 1);
  return size > TF_MAX_THREADS ? TF_MAX_THREADS : size;
}

/* The digest64 of the n bytes at p, its blocks summed on up to `threads` threads, for the
 * Python loader (tilefold/artifact/load.py), which checks this library's own digest before
 * it loads it, then data.bin's with this before any kernel runs. */
uint64_t tf_digest64_parallel(const uint8_t *p, size_t n, int threads) {
  return tf_digest64_threaded(p, n, threads);
}

/* The block sums of blocks first .. last-1, which loaders of format 2 before
 * tf_digest64_parallel called on threads of their own: kept so that they still digest a
 * newer artifact in C. */
void tf_digest64_sums(const uint8_t *p, size_t n, size_t first, size_t last, uint64_t *sums) {
  tf_digest64_block_sums(p, n, first, last, sums);
}

/* data.bin (TF_DATA_FILE: a chain's target with a plan of its own has data-<k>.bin)
 * mapped privately into *data (its size checked first, then its digest64). */
static int tf_map_data(uint8_t **data, size_t *data_bytes, const char *dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, TF_DATA_FILE);
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
    *data = p;
    *data_bytes = TF_DATA_BYTES;
  }
  close(fd);
  if (tf_digest64_threaded(*data, *data_bytes, tf_threads()) != tf_data_digest64)
    return tf_fail(TF_ERROR_CORRUPT, "%s: digest64 differs from the one it was exported with "
                   "(altered or damaged after export)", path);
  return TF_OK;
}

/* ---- the model ---- */

/* Another library of the chain, which tf_model_load picked for this CPU: the model it
 * loaded and its functions, to which this library's calls go. */
typedef struct {
  void *handle;
  tf_model *model;
  int (*run)(tf_model *, const tf_tensor *, int, const tf_tensor *, int);
  int (*state)(tf_model *, int, tf_tensor *);
  void (*free)(tf_model *);
  const char *(*error)(void);
} tf_forward;

struct tf_model {
  tf_forward *other; /* NULL: this library runs the model */
  uint8_t *data; /* data.bin, mapped privately */
  size_t data_bytes;
  uint8_t *buffers[TF_NBUFFERS + 1]; /* (symbolic: every class's, in turn) + 1: none empty */
  uint8_t *workspace; /* every other buffer, in one zeroed anonymous mapping */
  size_t workspace_bytes;
  int64_t *headers[TF_NOBJECTS + 1];
  int64_t table[TF_NENTRIES + 1];
  uint8_t *state[TF_NSTATE + 1]; /* each state input's one buffer, which every class uses */
#ifdef TF_NCLASSES
  int64_t bound[TF_NCLASSES]; /* the size each class's program is bound at (0: none yet) */
#endif
};

void tf_model_free(tf_model *m) {
  if (!m) return;
  if (m->other) {
    /* The other library stays loaded: its pool's workers live in its code (spinning, then
     * asleep) for as long as the process does, so unmapping it would pull it from under them. */
    m->other->free(m->other->model);
    free(m->other);
    free(m);
    return;
  }
  for (int i = 0; i < TF_NOBJECTS; i++) free(m->headers[i]);
  if (m->workspace) munmap(m->workspace, m->workspace_bytes);
  if (m->data) munmap(m->data, m->data_bytes);
  free(m);
}

/* A status of another library of the chain, its message made this library's. */
static int tf_forwarded(tf_model *m, int status) {
  if (status != TF_OK) tf_fail(status, "%s", m->other->error());
  return status;
}

enum { TF_FORWARDED = -1 }; /* tf_model_start: *model is loaded by another library */

#define TF_MANIFEST_MAX (64 << 20) /* a larger manifest.json is not one tilefold wrote */

/* The manifest's size and digest64 of the part `file` (a library of the chain): the object
 * {"file": "<file>", "bytes": N, ..., "digest64": "<16 hex digits>"} that
 * tilefold/aot/export.py writes (json.dumps, indent=1) in <dir>/manifest.json. */
static int tf_manifest_part(const char *dir, const char *file, long long *bytes,
                            uint64_t *digest) {
  char path[4096], key[512];
  snprintf(path, sizeof path, "%s/manifest.json", dir);
  FILE *f = fopen(path, "rb");
  if (!f) return tf_fail(TF_ERROR_FILE, "%s: cannot open it (the digests of the chain's "
                         "libraries are there)", path);
  long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  char *text = n >= 0 && n <= TF_MANIFEST_MAX ? malloc((size_t)n + 1) : NULL;
  if (!text || fseek(f, 0, SEEK_SET) != 0 || fread(text, 1, (size_t)n, f) != (size_t)n) {
    fclose(f);
    free(text);
    return tf_fail(n > TF_MANIFEST_MAX ? TF_ERROR_CORRUPT : TF_ERROR_FILE,
                   "%s: cannot read it", path);
  }
  fclose(f);
  text[n] = '\0';
  snprintf(key, sizeof key, "\"file\": \"%s\"", file);
  const char *at = strstr(text, key), *end = at ? strchr(at, '}') : NULL;
  const char *size = at ? strstr(at, "\"bytes\": ") : NULL;
  const char *sum = at ? strstr(at, "\"digest64\": \"") : NULL;
  int found = end && size && sum && size < end && sum < end;
  if (found) {
    char *stop;
    *bytes = strtoll(size + strlen("\"bytes\": "), &stop, 10);
    found = *bytes >= 0 && (*stop == ',' || *stop == '\n' || *stop == '}');
    sum += strlen("\"digest64\": \"");
    *digest = strtoull(sum, &stop, 16);
    found = found && stop == sum + 16 && *stop == '"';
  }
  free(text);
  return found ? TF_OK : tf_fail(TF_ERROR_CORRUPT, "%s: no size and digest64 of %s, a library "
                                 "of the chain; export the artifact again", path, file);
}

/* Whether <dir>/<file>, the chain's library `pick`, has the size and digest64 its manifest
 * gives (checked before it is dlopen'ed: a damaged library is never loaded, so none of its
 * code, constructors included, runs). */
static int tf_check_library(const char *dir, int pick, const char *path) {
  long long bytes;
  uint64_t want;
  int status = tf_manifest_part(dir, tf_chain_files[pick], &bytes, &want);
  if (status != TF_OK) return status;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0) return tf_fail(TF_ERROR_FILE, "%s, the code for %s (which this CPU runs): "
                             "missing or unreadable", path, tf_chain_names[pick]);
  if (fstat(fd, &st) != 0 || st.st_size != bytes) {
    close(fd);
    return tf_fail(TF_ERROR_CORRUPT, "%s, the code for %s: %lld bytes, the manifest says %lld "
                   "(truncated or replaced after export); not loaded", path,
                   tf_chain_names[pick], (long long)st.st_size, bytes);
  }
  void *p = bytes > 0 ? mmap(NULL, (size_t)bytes, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
  close(fd);
  if (p == MAP_FAILED) return tf_fail(TF_ERROR_FILE, "%s: cannot map it", path);
  uint64_t got = tf_digest64_threaded(p, (size_t)bytes, tf_threads());
  if (p) munmap(p, (size_t)bytes);
  if (got != want)
    return tf_fail(TF_ERROR_CORRUPT, "%s, the code for %s: digest64 differs from the "
                   "manifest's (altered or damaged after export); not loaded: export the "
                   "artifact again", path, tf_chain_names[pick]);
  return TF_OK;
}

/* *model loaded by the chain's library `pick`, which this library's calls then go to, once
 * its size and digest64 are the manifest's (tf_check_library; its tf_model_load then checks
 * its own flags and data.bin). This library's own file is the dynamic linker's to load: it
 * is not digested. */
static int tf_forward_load(const char *dir, int pick, tf_model **model) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, tf_chain_files[pick]);
  int checked = tf_check_library(dir, pick, path);
  if (checked != TF_OK) return checked;
  tf_forward f = {0};
  int (*load)(const char *, tf_model **) = NULL;
  if (!(f.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
    return tf_fail(TF_ERROR_FILE, "%s, the code for %s (which this CPU runs): cannot load it "
                   "(%s)", path, tf_chain_names[pick], dlerror());
  *(void **)&load = dlsym(f.handle, "tf_model_load");
  *(void **)&f.run = dlsym(f.handle, "tf_model_run");
  *(void **)&f.state = dlsym(f.handle, "tf_model_state");
  *(void **)&f.free = dlsym(f.handle, "tf_model_free");
  *(void **)&f.error = dlsym(f.handle, "tf_last_error");
  tf_model *m = calloc(1, sizeof *m);
  if (!load || !f.run || !f.state || !f.free || !f.error || !m) {
    free(m);
    dlclose(f.handle);
    return tf_fail(TF_ERROR_CORRUPT, "%s: not the library of a tilefold model", path);
  }
  int status = load(dir, &f.model);
  if (status != TF_OK || !(m->other = malloc(sizeof f))) {
    status = status != TF_OK ? tf_fail(status, "%s", f.error()) : tf_fail(TF_ERROR_MEMORY,
                                                                            "out of memory");
    if (f.model) f.free(f.model);
    free(m); /* the library stays loaded: its load may have started its pool (see tf_model_free) */
    return status;
  }
  *m->other = f;
  *model = m;
  return TF_FORWARDED;
}

/* tf_model_load's start: the arguments and the CPU checked (the chain's first target it runs
 * picked: another library's is loaded, TF_FORWARDED), *m allocated with data.bin mapped
 * (*model stays NULL until the caller is done). */
static int tf_model_start(const char *dir, tf_model **model, tf_model **m) {
  if (!model || !dir)
    return tf_fail(TF_ERROR_ARGUMENT, "tf_model_load(dir, &model): NULL given");
  *model = NULL;
  char line[8192];
  const char *flags = tf_cpu_flags(line, sizeof line);
  int pick = tf_pick(flags);
  if (pick < 0) return -pick;
  if (pick != TF_SELF) return tf_forward_load(dir, pick, model);
  int status = tf_check_cpu(flags);
  if (status != TF_OK) return status;
  if (!(*m = calloc(1, sizeof **m))) return tf_fail(TF_ERROR_MEMORY, "out of memory");
  status = tf_map_data(&(*m)->data, &(*m)->data_bytes, dir);
  if (status != TF_OK) tf_model_free(*m);
  return status;
}

/* Every buffer's address: data.bin's at their offsets in it, the others at `offsets` in one
 * anonymous mapping of `bytes`, its pages zero and made on first touch (no memset of what
 * may be 100 MB at load; not MADV_HUGEPAGE: where the kernel compacts memory for it on a
 * fault, the default, it made the first call ~100 ms slower). */
static int tf_place_buffers(tf_model *m, size_t bytes, const size_t *offsets) {
  if (bytes > 0) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return tf_fail(TF_ERROR_MEMORY, "out of memory for %lld bytes of buffers",
                     (long long)bytes);
    m->workspace = p;
    m->workspace_bytes = bytes;
  }
  for (int i = 0; i < TF_NBUFFERS; i++)
    m->buffers[i] = tf_buffers[i][0] == KIND_DATA ? m->data + tf_buffers[i][2]
                                                  : m->workspace + offsets[i];
  return TF_OK;
}

/* The state: each state input's buffer of the first class is its buffer in every class of
 * the `classes` (tf_state_buffers, class by class), placed before any pointer to it is
 * written; zero at load, as the other buffers, and never copied. */
static void tf_share_state(tf_model *m, int classes) {
  for (int j = 0; j < TF_NSTATE; j++) {
    m->state[j] = m->buffers[tf_state_buffers[j]];
    for (int k = 1; k < classes; k++) m->buffers[tf_state_buffers[k * TF_NSTATE + j]] = m->state[j];
  }
}

int tf_model_state(tf_model *m, int index, tf_tensor *state) {
  if (!m || !state) return tf_fail(TF_ERROR_ARGUMENT, "tf_model_state(model, index, &state): "
                                   "NULL given");
  if (m->other) return tf_forwarded(m, m->other->state(m->other->model, index, state));
  if (index < 0 || index >= TF_NSTATE)
    return tf_fail(TF_ERROR_ARGUMENT, "state %d: the model has %d", index, TF_NSTATE);
  const int64_t *spec = tf_state_specs[index];
  state->data = m->state[index];
  state->dtype = (int32_t)spec[0];
  state->ndim = (int32_t)spec[1];
  state->shape = tf_state_dims + spec[2];
  return TF_OK;
}

/* Every array header (what a kernel reads of a NumPy array object), its rank and where its
 * dims and strides lie written; the caller writes its data pointer, dims and strides. */
static int tf_make_headers(tf_model *m) {
  for (int i = 0; i < TF_NOBJECTS; i++) {
    int64_t nd = tf_objects[i][2];
    int64_t *h = m->headers[i] = calloc((size_t)(TF_HEADER_WORDS + 2 * nd), sizeof *h);
    if (!h) return tf_fail(TF_ERROR_MEMORY, "out of memory");
    h[TF_HEADER_ND] = nd;
    h[TF_HEADER_DIMS] = (int64_t)(h + TF_HEADER_WORDS);
    h[TF_HEADER_STRIDES] = (int64_t)(h + TF_HEADER_WORDS + nd);
  }
  return TF_OK;
}

/* A status word a native copy sets on an index out of range: cleared, and the error said. */
static int tf_status_clear(uint8_t *word) {
  int64_t value;
  memcpy(&value, word, sizeof value);
  if (!value) return TF_OK;
  memset(word, 0, sizeof value);
  return tf_fail(TF_ERROR_INDEX, "an index of a gather or index_put is out of range");
}

/* ---- the native pool: started once per library ---- */

int tf_claim_pool(void) {
  static int claimed;
  return !__atomic_exchange_n(&claimed, 1, __ATOMIC_SEQ_CST);
}

static void tf_start_pool(void) {
  if (!tf_claim_pool()) return;
  int size = tf_threads();
  int32_t unpinned[TF_MAX_THREADS];
  uint64_t none[16] = {0};
  for (int i = 0; i < size; i++) unpinned[i] = -1;
  if (tilefold_pool_init() == 0) tilefold_pool_start(size, unpinned, none, 2000000);
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

#endif
