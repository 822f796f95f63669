/* tensor_args.h: the command-line tensors of the C drivers that run an artifact
 * (tests/aot/run_model.c, data/aot/bench_model.c), parsed in one place.
 *
 * Each argument is SIDE:DTYPE:DIMS:FILE: SIDE i (an input, read from FILE now) or o (an
 * output, FILE where a driver may write it), DTYPE an enum tf_dtype, DIMS comma-separated
 * sizes ("-" for a scalar). Up to TF_ARGS_MAX tensors per side, TF_ARGS_MAX_DIMS dims each.
 */
#ifndef TILEFOLD_TENSOR_ARGS_H
#define TILEFOLD_TENSOR_ARGS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tilefold_model.h"

#define TF_ARGS_MAX 8
#define TF_ARGS_MAX_DIMS 8

static const int tf_args_itemsize[] = {8, 4, 2, 8, 4, 1, 1, 1}; /* by enum tf_dtype */

typedef struct {
  tf_tensor tensors[2][TF_ARGS_MAX]; /* [0] inputs, [1] outputs */
  int64_t shapes[2][TF_ARGS_MAX][TF_ARGS_MAX_DIMS];
  char files[2][TF_ARGS_MAX][1024];
  int count[2];
} tf_args;

/* The elements of a parsed tensor. */
static int64_t tf_args_elements(const tf_tensor *t) {
  int64_t elements = 1;
  for (int d = 0; d < t->ndim; d++) elements *= t->shape[d];
  return elements;
}

/* Parse the n arguments at argv into args (allocating every tensor's data, reading the
 * inputs' files). Returns 0, 2 for a malformed argument, 3 for an unreadable input file. */
static int tf_args_parse(tf_args *args, int n, char **argv) {
  memset(args, 0, sizeof *args);
  for (int a = 0; a < n; a++) {
    char side, dims[256];
    int dtype;
    const char *c1 = strchr(argv[a], ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    const char *c3 = c2 ? strchr(c2 + 1, ':') : NULL, *file = c3 ? c3 + 1 : NULL;
    if (!file || sscanf(argv[a], "%c:%d:%255[^:]", &side, &dtype, dims) != 3) return 2;
    if ((side != 'i' && side != 'o') || dtype < 0 || dtype > TF_BOOL) return 2;
    int s = side == 'o', k = args->count[s]++;
    if (k >= TF_ARGS_MAX || strlen(file) >= sizeof args->files[s][k]) return 2;
    strcpy(args->files[s][k], file);
    tf_tensor *t = &args->tensors[s][k];
    int64_t *shape = args->shapes[s][k];
    t->ndim = 0;
    for (char *d = strtok(dims, ","); d && strcmp(d, "-") != 0; d = strtok(NULL, ",")) {
      if (t->ndim == TF_ARGS_MAX_DIMS || atoll(d) < 0) return 2;
      shape[t->ndim++] = atoll(d);
    }
    t->dtype = dtype;
    t->shape = shape;
    int64_t elements = tf_args_elements(t);
    t->data = calloc((size_t)elements + 1, (size_t)tf_args_itemsize[dtype]);
    if (!t->data) return 2;
    if (!s) {
      FILE *f = fopen(file, "rb");
      size_t got = f ? fread(t->data, (size_t)tf_args_itemsize[dtype], (size_t)elements, f) : 0;
      if (f) fclose(f);
      if (got != (size_t)elements) return 3;
    }
  }
  return 0;
}

#endif
