/* The C runtime of an exported artifact (tilefold_model.h), compiled into its library after
 * the step program's tables, which `tilefold/aot/c_abi.py` writes as C arrays ahead of this
 * text. It does what tilefold/artifact/load.py does from Python: checks the CPU's features
 * and data.bin's size and digest64 (digest64.h), maps the constants copy-on-write, allocates
 * the other buffers, writes the pointer words and array headers, fills the int64 table and
 * runs the whole model as one call of tf_replay. libc and libpthread only.
 */
#include "runtime_common.h"

void tf_replay(int64_t *table);

struct tf_model {
  uint8_t *data; /* data.bin, mapped privately */
  size_t data_bytes;
  uint8_t *buffers[TF_NBUFFERS + 1]; /* + 1: no array is empty */
  uint8_t *workspace; /* every other buffer, in one zeroed anonymous mapping */
  size_t workspace_bytes;
  int64_t *headers[TF_NOBJECTS + 1];
  int64_t table[TF_NENTRIES + 1];
};

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
  status = tf_map_data(&m->data, &m->data_bytes, dir);
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
