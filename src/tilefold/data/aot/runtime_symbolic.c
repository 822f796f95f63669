/* The C runtime of a symbolic-shape artifact (tilefold_model.h): one size class per range of
 * the symbolic dim, each with its own buffers, replay function and program, whose integers
 * are expressions of the size n (`tilefold/aot/c_abi.py` writes the tables ahead of this text,
 * as it does for runtime.c; the Python loader's `_prepare_symbolic` and `_evaluate`,
 * tilefold/artifact/load.py, read the same program from program.json). tf_model_load checks
 * the CPU and data.bin and allocates every class's buffers; tf_model_run takes n from the
 * inputs' symbolic dims (checked: agreeing, within the bounds, every other dim as exported),
 * binds the class's program at n when the class last ran another size (pointer words,
 * patched parameter-block words, array headers, the table), and runs the class's replay.
 *
 * With more than one symbolic dim, each class fits one (n) and holds the others at one size
 * each (tf_class_at): a call runs the class of its sizes of those that holds its n.
 *
 * An expression (tf_exprs: tag, a, b) is a constant a (tag 0), a + b*n (tag 1), or the value
 * for n of a table starting at tf_tabvals[a] for the sizes from b (tag 2). libc and
 * libpthread only.
 */
#include "runtime_common.h"

enum { EXPR_CONSTANT, EXPR_LINEAR, EXPR_TABLE };
/* The columns of tf_classes. */
enum { C_LO, C_HI, C_BUFFER, C_POINTER, C_NPOINTERS, C_PATCH, C_NPATCHES, C_OBJECT, C_NOBJECTS,
       C_ENTRY, C_NENTRIES, C_STATUS, C_NSTATUS, C_COLUMNS };


static int64_t tf_eval(int64_t e, int64_t n) {
  const int64_t *x = tf_exprs[e];
  switch (x[0]) {
    case EXPR_CONSTANT: return x[1];
    case EXPR_LINEAR: return x[1] + x[2] * n;
    default: return tf_tabvals[x[1] + n - x[2]];
  }
}

/* The address `offset` (an expression) bytes into buffer `buffer` of class `k`, or NULL
 * when `size` bytes from there leave the buffer. */
static uint8_t *tf_at(tf_model *m, int k, int64_t buffer, int64_t offset, int64_t n,
                      int64_t size) {
  int64_t b = tf_classes[k][C_BUFFER] + buffer, at = tf_eval(offset, n);
  if (at < 0 || at > tf_buffers[b][1] - size) return NULL;
  return m->buffers[b] + at;
}

int tf_model_load(const char *dir, tf_model **model) {
  tf_model *m;
  int status = tf_model_start(dir, model, &m);
  if (status != TF_OK) return status == TF_FORWARDED ? TF_OK : status;
  /* Each class's buffers at its largest size, zero on first touch (as runtime.c). A call
   * runs one class and workspace never outlives a call, so every class's workspace buffers
   * lie in one region from 0, as large as the largest class needs; the others follow. */
  size_t shared = 0, at = 0, offsets[TF_NBUFFERS + 1];
  for (int k = 0; k < TF_NCLASSES; k++) {
    size_t work = 0;
    int64_t end = k + 1 < TF_NCLASSES ? tf_classes[k + 1][C_BUFFER] : TF_NBUFFERS;
    for (int64_t i = tf_classes[k][C_BUFFER]; i < end; i++)
      if (tf_buffers[i][0] == KIND_WORKSPACE) {
        offsets[i] = work;
        work += ((size_t)tf_buffers[i][1] + 127) / 64 * 64;
      }
    if (work > shared) shared = work;
  }
  at = shared;
  for (int i = 0; i < TF_NBUFFERS; i++)
    if (tf_buffers[i][0] != KIND_DATA && tf_buffers[i][0] != KIND_WORKSPACE) {
      offsets[i] = at;
      at += ((size_t)tf_buffers[i][1] + 127) / 64 * 64;
    }
  if (tf_place_buffers(m, at, offsets) != TF_OK) {
    tf_model_free(m);
    return TF_ERROR_MEMORY;
  }
  tf_share_state(m, TF_NCLASSES);
  if (tf_make_headers(m) != TF_OK) { /* their data pointers, dims and strides: per size */
    tf_model_free(m);
    return TF_ERROR_MEMORY;
  }
  tf_start_pool();
  *model = m;
  return TF_OK;
}

/* Class k's program at size n: what its kernels read of memory and of the table. */
static int tf_bind(tf_model *m, int k, int64_t n) {
  const int64_t *c = tf_classes[k];
  for (int64_t i = c[C_POINTER]; i < c[C_POINTER] + c[C_NPOINTERS]; i++) {
    const int64_t *p = tf_pointers[i];
    uint8_t *word = tf_at(m, k, p[0], p[1], n, 8), *to = tf_at(m, k, p[2], p[3], n, 0);
    if (!word || !to) return tf_fail(TF_ERROR_CORRUPT, "pointer word %lld outside its buffer "
                                     "at size %lld", (long long)i, (long long)n);
    int64_t address = (int64_t)to;
    memcpy(word, &address, sizeof address);
  }
  for (int64_t i = c[C_PATCH]; i < c[C_PATCH] + c[C_NPATCHES]; i++) {
    const int64_t *p = tf_patches[i];
    uint8_t *word = tf_at(m, k, p[0], p[1], n, 8);
    if (!word) return tf_fail(TF_ERROR_CORRUPT, "patch %lld outside its buffer at size %lld",
                              (long long)i, (long long)n);
    int64_t value = tf_eval(p[2], n);
    memcpy(word, &value, sizeof value);
  }
  for (int64_t i = c[C_OBJECT]; i < c[C_OBJECT] + c[C_NOBJECTS]; i++) {
    const int64_t *o = tf_objects[i];
    int64_t *h = m->headers[i];
    uint8_t *data = tf_at(m, k, o[0], o[1], n, 0);
    if (!data) return tf_fail(TF_ERROR_CORRUPT, "array %lld outside its buffer at size %lld",
                              (long long)i, (long long)n);
    h[TF_HEADER_DATA] = (int64_t)data;
    for (int64_t d = 0; d < 2 * o[2]; d++) h[TF_HEADER_WORDS + d] = tf_eval(tf_dims[o[3] + d], n);
  }
  for (int64_t i = c[C_ENTRY]; i < c[C_ENTRY] + c[C_NENTRIES]; i++) {
    const int64_t *e = tf_entries[i];
    switch (e[0]) {
      case ARG_VALUE: m->table[i] = tf_eval(e[1], n); break;
      case ARG_ADDRESS: {
        uint8_t *to = tf_at(m, k, e[1], e[2], n, 0);
        if (!to) return tf_fail(TF_ERROR_CORRUPT, "argument %lld outside its buffer at size "
                                "%lld", (long long)i, (long long)n);
        m->table[i] = (int64_t)to;
        break;
      }
      case ARG_OBJECT: m->table[i] = (int64_t)m->headers[c[C_OBJECT] + e[1]]; break;
      default: m->table[i] = (int64_t)tf_functions[e[1]]; break;
    }
  }
  m->bound[k] = n;
  return TF_OK;
}

/* Whether class k holds the sizes `values[1..]` of the symbols other than the fitted one. */
static int tf_holds(int k, const int64_t *values) {
  for (int j = 0; j < TF_NOUTER; j++)
    if (tf_class_at[k][j] != values[1 + j]) return 0;
  return 1;
}

/* `given` against row `io` of tf_inputs or tf_outputs (buffer, offset, dtype, rank, dims)
 * at size n; its shape and strides evaluated into shape[], strides[]. */
static int tf_check(const tf_tensor *given, const int64_t io[5], int number, const char *side,
                    int64_t n, int64_t *shape, int64_t *strides) {
  if (given->dtype != io[2] || given->ndim != io[3] || (io[3] && !given->shape) || !given->data)
    return tf_fail(TF_ERROR_ARGUMENT, "%s %d: dtype %d, rank %d expected (got %d, %d)", side,
                   number, (int)io[2], (int)io[3], given->dtype, given->ndim);
  for (int d = 0; d < io[3]; d++) {
    shape[d] = tf_eval(tf_dims[io[4] + d], n);
    strides[d] = tf_eval(tf_dims[io[4] + io[3] + d], n);
    if (given->shape[d] != shape[d])
      return tf_fail(TF_ERROR_ARGUMENT, "%s %d: dim %d is %lld, the model takes %lld at %s = "
                     "%lld", side, number, d, (long long)given->shape[d], (long long)shape[d],
                     tf_symbol, (long long)n);
  }
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
  int64_t values[1 + TF_NOUTER]; /* the fitted symbol's size n, then the others' */
  for (int j = 0; j <= TF_NOUTER; j++) values[j] = -1;
  for (int i = 0; i < TF_NSYMDIMS; i++) { /* (input, dim, symbol): the symbolic dims */
    const tf_tensor *t = &inputs[tf_symdims[i][0]];
    int64_t d = tf_symdims[i][1], j = tf_symdims[i][2];
    if (!t->shape || t->ndim != tf_inputs[tf_symdims[i][0]][3])
      return tf_fail(TF_ERROR_ARGUMENT, "input %d: rank %d expected (got %d)",
                     (int)tf_symdims[i][0], (int)tf_inputs[tf_symdims[i][0]][3], t->ndim);
    if (values[j] >= 0 && t->shape[d] != values[j])
      return tf_fail(TF_ERROR_ARGUMENT, "%s is %lld in one input and %lld in input %d",
                     tf_symbol_names[j], (long long)values[j], (long long)t->shape[d],
                     (int)tf_symdims[i][0]);
    values[j] = t->shape[d];
  }
  for (int j = 0; j <= TF_NOUTER; j++)
    if (values[j] < tf_symbol_bounds[j][0] || values[j] > tf_symbol_bounds[j][1])
      return tf_fail(TF_ERROR_ARGUMENT, "%s = %lld is outside the sizes this artifact was "
                     "exported for (%lld to %lld)", tf_symbol_names[j], (long long)values[j],
                     (long long)tf_symbol_bounds[j][0], (long long)tf_symbol_bounds[j][1]);
  int64_t n = values[0];
  int k = 0; /* the first class of the other symbols' sizes holding n */
  while (k < TF_NCLASSES && (n > tf_classes[k][C_HI] || !tf_holds(k, values))) k++;
  if (k == TF_NCLASSES) /* exported for a list of sizes of another symbol: not this one */
    return tf_fail(TF_ERROR_ARGUMENT, "the sizes of %s are not a combination this artifact "
                   "was exported for", TF_NOUTER ? tf_symbol_names[1] : tf_symbol);
  if (n < tf_classes[k][C_LO]) /* exported for a list of sizes: between two of them */
    return tf_fail(TF_ERROR_ARGUMENT, "%s = %lld is not a size this artifact was exported "
                   "for (between %lld and %lld, which it was)", tf_symbol, (long long)n,
                   (long long)tf_classes[k - 1][C_HI], (long long)tf_classes[k][C_LO]);
  int64_t shape[TF_MAX_RANK + 1], strides[TF_MAX_RANK + 1];
  const int64_t(*in)[5] = tf_inputs + k * TF_NINPUTS, (*out)[5] = tf_outputs + k * TF_NOUTPUTS;
  for (int i = 0; i < TF_NINPUTS; i++)
    if (tf_check(&inputs[i], in[i], i, "input", n, shape, strides) != TF_OK)
      return TF_ERROR_ARGUMENT;
  for (int i = 0; i < TF_NOUTPUTS; i++)
    if (tf_check(&outputs[i], out[i], i, "output", n, shape, strides) != TF_OK)
      return TF_ERROR_ARGUMENT;
  if (m->bound[k] != n) {
    int status = tf_bind(m, k, n);
    if (status != TF_OK) {
      m->bound[k] = 0;
      return status;
    }
  }
  for (int i = 0; i < TF_NINPUTS; i++) {
    tf_check(&inputs[i], in[i], i, "input", n, shape, strides);
    uint8_t *to = tf_at(m, k, in[i][0], in[i][1], n, 0);
    if (!to) return tf_fail(TF_ERROR_CORRUPT, "input %d outside its buffer", i);
    tf_copy(inputs[i].data, to, shape, strides, (int)in[i][3], tf_itemsize[in[i][2]], 1);
  }
  tf_replays[k](m->table + tf_classes[k][C_ENTRY]);
  for (int64_t i = tf_classes[k][C_STATUS]; i < tf_classes[k][C_STATUS] +
       tf_classes[k][C_NSTATUS]; i++) {
    if (tf_status_clear(m->buffers[tf_classes[k][C_BUFFER] + tf_status[i]]) != TF_OK)
      return TF_ERROR_INDEX;
  }
  for (int i = 0; i < TF_NOUTPUTS; i++) {
    tf_check(&outputs[i], out[i], i, "output", n, shape, strides);
    uint8_t *from = tf_at(m, k, out[i][0], out[i][1], n, 0);
    if (!from) return tf_fail(TF_ERROR_CORRUPT, "output %d outside its buffer", i);
    tf_copy(outputs[i].data, from, shape, strides, (int)out[i][3], tf_itemsize[out[i][2]], 0);
  }
  return TF_OK;
}

