/* A C program running an exported artifact through tilefold_model.h (tests/aot/test_c_abi.py,
 * test_symbolic.py):
 *   run_model DIR SIDE:DTYPE:DIMS:FILE ... [-- SIDE:DTYPE:DIMS:FILE ...] ...
 * the tensors as data/aot/tensor_args.h parses them; each output is written to its FILE.
 * Each group of tensors (groups split by "--": a symbolic artifact's sizes, in turn) runs
 * twice on the one loaded model. Prints "ok", or the failing step, its status and
 * tf_last_error().
 */
#include "tensor_args.h"

static int run_group(tf_model *model, int n, char **argv) {
  static tf_args args;
  int parsed = tf_args_parse(&args, n, argv);
  if (parsed != 0) return parsed;
  for (int repeat = 0; repeat < 2; repeat++) {
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

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  for (int a = 2; a < argc; a++) /* every group parses before the model loads */
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
  for (int start = 2, end = 2; start <= argc; start = ++end) {
    while (end < argc && strcmp(argv[end], "--") != 0) end++;
    int done = run_group(model, end - start, argv + start);
    if (done != 0) {
      tf_model_free(model);
      return done < 0 ? 0 : done;
    }
  }
  tf_model_free(model);
  printf("ok\n");
  return 0;
}
