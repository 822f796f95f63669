/* A C program running an exported artifact through tilefold_model.h (tests/aot/test_c_abi.py):
 *   run_model DIR SIDE:DTYPE:DIMS:FILE ...
 * SIDE i (an input read from FILE) or o (an output written to FILE), DTYPE an enum tf_dtype,
 * DIMS comma-separated sizes ("-" for a scalar). Prints "ok", or the failing step, its status
 * and tf_last_error().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tilefold_model.h"

static const int itemsize[] = {8, 4, 2, 8, 4, 1, 1, 1};

int main(int argc, char **argv) {
  tf_tensor tensors[2][8];
  int64_t shapes[16][8];
  const char *files[2][8];
  int count[2] = {0, 0};
  for (int a = 2; a < argc && a < 18; a++) {
    char side, dims[256], file[1024];
    int dtype;
    if (sscanf(argv[a], "%c:%d:%255[^:]:%1023s", &side, &dtype, dims, file) != 4) return 2;
    int s = side == 'o', n = count[s]++;
    tf_tensor *t = &tensors[s][n];
    int64_t *shape = shapes[a - 2], elements = 1;
    t->ndim = 0;
    for (char *d = strtok(dims, ","); d && strcmp(d, "-") != 0; d = strtok(NULL, ","))
      elements *= shape[t->ndim++] = atoll(d);
    t->dtype = dtype;
    t->shape = shape;
    t->data = calloc((size_t)elements + 1, (size_t)itemsize[dtype]);
    files[s][n] = strdup(file);
    if (!s) {
      FILE *f = fopen(file, "rb");
      if (!f || fread(t->data, (size_t)itemsize[dtype], (size_t)elements, f) != (size_t)elements)
        return 3;
      fclose(f);
    }
  }
  tf_model *model;
  int status = tf_model_load(argv[1], &model);
  if (status != TF_OK) {
    printf("load %d %s\n", status, tf_last_error());
    return 0;
  }
  for (int repeat = 0; repeat < 2; repeat++) {
    status = tf_model_run(model, tensors[0], count[0], tensors[1], count[1]);
    if (status != TF_OK) {
      printf("run %d %s\n", status, tf_last_error());
      tf_model_free(model);
      return 0;
    }
  }
  for (int n = 0; n < count[1]; n++) {
    tf_tensor *t = &tensors[1][n];
    int64_t elements = 1;
    for (int d = 0; d < t->ndim; d++) elements *= t->shape[d];
    FILE *f = fopen(files[1][n], "wb");
    fwrite(t->data, (size_t)itemsize[t->dtype], (size_t)elements, f);
    fclose(f);
  }
  tf_model_free(model);
  printf("ok\n");
  return 0;
}
