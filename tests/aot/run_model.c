/* A C program running an exported artifact through tilefold_model.h (tests/aot/test_c_abi.py,
 * test_symbolic.py, test_state.py):
 *   run_model DIR [-s STATE_IN STATE_OUT] SIDE:DTYPE:DIMS:FILE ... [-- SIDE:DTYPE:DIMS:FILE ...]
 * the tensors as data/aot/tensor_args.h parses them; each output is written to its FILE.
 * Each group of tensors (groups split by "--": a symbolic artifact's sizes, in turn) runs
 * twice on the one loaded model; with -s (a model with state), once: the model's state 0 is
 * filled from STATE_IN's bytes through tf_model_state before the first call, and its bytes
 * after the last call are written to STATE_OUT. Prints "ok", or the failing step, its
 * status and tf_last_error().
 */
#include "tensor_args.h"

static int run_group(tf_model *model, int n, char **argv, int repeats) {
  static tf_args args;
  int parsed = tf_args_parse(&args, n, argv);
  if (parsed != 0) return parsed;
  for (int repeat = 0; repeat < repeats; repeat++) {
    int status = tf_model_run(model, args.tensors[0], args.count[0], args.tensors[1],
                              args.count[1]);
    if (status != TF_OK) {
      printf("run %d %s\n", status, tf_last_error());
      return -1;
    }
  }
  for (int k = 0; k < args.count[1]; k++) {
    tf_tensor *t = &args.tensors[1][k];
    FILE *f = fopen(args.files[1][k], "wb");
    if (!f) return 3;
    fwrite(t->data, (size_t)tf_args_itemsize[t->dtype], (size_t)tf_args_elements(t), f);
    fclose(f);
  }
  for (int s = 0; s < 2; s++)
    for (int k = 0; k < args.count[s]; k++) free(args.tensors[s][k].data);
  return 0;
}

/* The bytes of the model's state 0 read from (`out` 0) or written to (1) `file`. */
static int state_file(tf_model *model, const char *file, int out) {
  tf_tensor state;
  int status = tf_model_state(model, 0, &state);
  if (status != TF_OK) {
    printf("state %d %s\n", status, tf_last_error());
    return -1;
  }
  size_t n = (size_t)tf_args_elements(&state), item = (size_t)tf_args_itemsize[state.dtype];
  FILE *f = fopen(file, out ? "wb" : "rb");
  size_t done = f ? (out ? fwrite(state.data, item, n, f) : fread(state.data, item, n, f)) : 0;
  if (f) fclose(f);
  return done == n ? 0 : 3;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int first = argc > 4 && strcmp(argv[2], "-s") == 0 ? 5 : 2; /* the first tensor */
  for (int a = first; a < argc; a++) /* every group parses before the model loads */
    if (strcmp(argv[a], "--") != 0) {
      static tf_args args;
      int parsed = tf_args_parse(&args, 1, argv + a);
      if (parsed != 0) return parsed;
      for (int s = 0; s < 2; s++)
        for (int k = 0; k < args.count[s]; k++) free(args.tensors[s][k].data);
    }
  tf_model *model;
  int status = tf_model_load(argv[1], &model);
  if (status != TF_OK) {
    printf("load %d %s\n", status, tf_last_error());
    return 0;
  }
  int done = first == 5 ? state_file(model, argv[3], 0) : 0;
  for (int start = first, end = first; done == 0 && start <= argc; start = ++end) {
    while (end < argc && strcmp(argv[end], "--") != 0) end++;
    done = run_group(model, end - start, argv + start, first == 5 ? 1 : 2);
  }
  if (done == 0 && first == 5) done = state_file(model, argv[4], 1);
  tf_model_free(model);
  if (done != 0) return done < 0 ? 0 : done;
  printf("ok\n");
  return 0;
}
