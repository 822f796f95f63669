/* The C runtime of a symbolic-shape artifact: not written yet. Every entry point refuses
 * with TF_ERROR_SYMBOLIC and says so; tilefold.load (Python) runs such an artifact. The
 * library's pool is still claimed once, as in runtime.c, for the Python loader. */
#include <stddef.h>
#include <stdint.h>

#include "tilefold_model.h"

static const char tf_symbolic_message[] =
    "this artifact has symbolic shapes (size classes); the C runtime runs static-shape "
    "artifacts only: run it with tilefold.load from Python, or export it for static shapes";

int tf_claim_pool(void) {
  static int claimed;
  return !__atomic_exchange_n(&claimed, 1, __ATOMIC_SEQ_CST);
}

const char *tf_last_error(void) { return tf_symbolic_message; }

int tf_model_load(const char *dir, tf_model **model) {
  (void)dir;
  if (model) *model = NULL;
  return TF_ERROR_SYMBOLIC;
}

int tf_model_run(tf_model *m, const tf_tensor *inputs, int num_inputs, const tf_tensor *outputs,
                 int num_outputs) {
  (void)m, (void)inputs, (void)num_inputs, (void)outputs, (void)num_outputs;
  return TF_ERROR_SYMBOLIC;
}

void tf_model_free(tf_model *m) { (void)m; }
