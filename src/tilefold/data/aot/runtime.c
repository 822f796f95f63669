/* The C runtime of an exported artifact (tilefold_model.h), compiled into its library after
 * the step program's tables, which `tilefold/aot/c_abi.py` writes as C arrays ahead of this
 * text. It does what tilefold/artifact/load.py does from Python: checks the CPU's features
 * and data.bin's size and digest64 (digest64.h), maps the constants copy-on-write, allocates
 * the other buffers, writes the pointer words and array headers, fills the int64 table and
 * runs the whole model as one call of tf_replay. libc and libpthread only.
 */
#include "runtime_common.h"

void tf_replay(int64_t *table);


/* ---- load, run, free ---- */

static uint8_t *tf_at(tf_model *m, int64_t buffer, int64_t offset) {
  return m->buffers[buffer] + offset;
}

int tf_model_load(const char *dir, tf_model **model) {
  tf_model *m;
  int status = tf_model_start(dir, model, &m);
  if (status != TF_OK) return status == TF_FORWARDED ? TF_OK : status;
  /* The other buffers: one mapping (tf_place_buffers), each 64-byte aligned with 64 bytes
   * to spare. */
  size_t at = 0, offsets[TF_NBUFFERS + 1];
  for (int i = 0; i < TF_NBUFFERS; i++) {
    offsets[i] = at;
    if (tf_buffers[i][0] != KIND_DATA) at += ((size_t)tf_buffers[i][1] + 127) / 64 * 64;
  }
  if (tf_place_buffers(m, at, offsets) != TF_OK) {
    tf_model_free(m);
    return TF_ERROR_MEMORY;
  }
  tf_share_state(m, 1);
  for (int i = 0; i < TF_NPOINTERS; i++) {
    int64_t address = (int64_t)tf_at(m, tf_pointers[i][2], tf_pointers[i][3]);
    memcpy(tf_at(m, tf_pointers[i][0], tf_pointers[i][1]), &address, sizeof address);
  }
  if (tf_make_headers(m) != TF_OK) {
    tf_model_free(m);
    return TF_ERROR_MEMORY;
  }
  for (int i = 0; i < TF_NOBJECTS; i++) {
    int64_t *h = m->headers[i];
    memcpy(h + TF_HEADER_WORDS, tf_dims + tf_objects[i][3],
           (size_t)(2 * tf_objects[i][2]) * sizeof *h);
    h[TF_HEADER_DATA] = (int64_t)tf_at(m, tf_objects[i][0], tf_objects[i][1]);
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
  if (m->other)
    return tf_forwarded(m, m->other->run(m->other->model, inputs, num_inputs, outputs,
                                         num_outputs));
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
  for (int i = 0; i < TF_NSTATUS; i++)
    if (tf_status_clear(m->buffers[tf_status[i]]) != TF_OK) return TF_ERROR_INDEX;
  for (int i = 0; i < TF_NOUTPUTS; i++) {
    const int64_t *io = tf_outputs[i];
    tf_copy(outputs[i].data, tf_at(m, io[0], io[1]), tf_dims + io[4], tf_dims + io[4] + io[3],
            (int)io[3], tf_itemsize[io[2]], 0);
  }
  return TF_OK;
}

