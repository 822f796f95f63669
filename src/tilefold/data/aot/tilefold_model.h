/* tilefold_model.h: run a model exported by `tilefold export` from C, with no Python.
 *
 * Link against the artifact's kernels-<id>.so (or dlopen it) and pass tf_model_load the
 * artifact's directory: it checks that this CPU has every feature the code uses and that
 * data.bin has the size and digest the library was exported with, before any kernel runs.
 * An artifact exported for a chain of targets (--targets) has one kernels library per target;
 * link any one of them: tf_model_load runs the first target this CPU has (its library loaded
 * and every call handed to it) and fails with TF_ERROR_CPU when it has none.
 * TILEFOLD_ARTIFACT_TARGET names the target to take instead.
 * Every function returns TF_OK or an error code; tf_last_error() says what went wrong.
 */
#ifndef TILEFOLD_MODEL_H
#define TILEFOLD_MODEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum tf_status {
  TF_OK = 0,
  TF_ERROR_FILE = 1,     /* data.bin (or a library of the chain) missing or unreadable */
  TF_ERROR_CORRUPT = 2,  /* data.bin or a chain's library altered after export */
  TF_ERROR_CPU = 3,      /* this CPU lacks a feature the artifact's code uses */
  TF_ERROR_ARGUMENT = 4, /* inputs or outputs of the wrong count, dtype or shape */
  TF_ERROR_MEMORY = 5,   /* out of memory */
  TF_ERROR_INDEX = 6,    /* an index of a gather or index_put was out of range */
  TF_ERROR_SYMBOLIC = 7  /* no longer returned (symbolic-shape artifacts run from C too) */
};

/* Element types, as the manifest names them. */
enum tf_dtype { TF_F64, TF_F32, TF_F16, TF_I64, TF_I32, TF_I8, TF_U8, TF_BOOL };

/* A caller-owned, C-contiguous array. */
typedef struct {
  void *data;
  int32_t dtype;        /* an enum tf_dtype */
  int32_t ndim;
  const int64_t *shape; /* ndim sizes */
} tf_tensor;

typedef struct tf_model tf_model;

int tf_model_load(const char *artifact_dir, tf_model **model);
/* Computes the outputs into the caller's buffers (shapes and dtypes as the manifest lists).
 * One call at a time per model (its buffers are the model's); load it once per thread to
 * run it from several. The library's worker pool (TILEFOLD_NUM_THREADS, default: the online
 * CPUs; not pinned) is started by the first load. */
int tf_model_run(tf_model *model, const tf_tensor *inputs, int num_inputs,
                 const tf_tensor *outputs, int num_outputs);
/* A model exported with state (`donate`: a KV cache) holds it: tf_model_run takes the inputs
 * and returns the outputs other than the state's, and each call reads and writes the state
 * where it lies, never copying it. *state is state `index` (the manifest's order): the
 * model's own buffer (zero at load, C-contiguous, valid until tf_model_free), which the
 * caller may read and write between calls (e.g. set to zero for a new sequence). */
int tf_model_state(tf_model *model, int index, tf_tensor *state);
void tf_model_free(tf_model *model);
/* The message of this thread's last failed call ("" when none failed). */
const char *tf_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
