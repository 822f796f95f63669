/* A C program running an exported artifact through tilefold_model.h (tests/aot/test_c_abi.py):
 *   run_model DIR SIDE:DTYPE:DIMS:FILE ...
 * the tensors as data/aot/tensor_args.h parses them; each output is written to its FILE.
 * Prints "ok", or the failing step, its status and tf_last_error().
 */
#include "tensor_args.h"

int main(int argc, char **argv) {
  static tf_args args;
  if (argc < 2) return 2;
  int parsed = tf_args_parse(&args, argc - 2, argv + 2);
  if (parsed != 0) return parsed;
  tf_model *model;
  int status = tf_model_load(argv[1], &model);
  if (status != TF_OK) {
    printf("load %d %s\n", status, tf_last_error());
    return 0;
  }
  for (int repeat = 0; repeat < 2; repeat++) {
    status = tf_model_run(model, args.tensors[0], args.count[0], args.tensors[1], args.count[1]);
    if (status != TF_OK) {
      printf("run %d %s\n", status, tf_last_error());
      tf_model_free(model);
      return 0;
    }
  }
  for (int n = 0; n < args.count[1]; n++) {
    tf_tensor *t = &args.tensors[1][n];
    FILE *f = fopen(args.files[1][n], "wb");
    if (!f) return 3;
    fwrite(t->data, (size_t)tf_args_itemsize[t->dtype], (size_t)tf_args_elements(t), f);
    fclose(f);
  }
  tf_model_free(model);
  printf("ok\n");
  return 0;
}
