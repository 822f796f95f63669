/* `tilefold bench aot`'s C driver (cli/aot_start.py builds it with cc against an artifact):
 *   bench_model START_NS RUNS DIR SIDE:DTYPE:DIMS:FILE ...
 * START_NS the CLOCK_REALTIME nanoseconds at which the parent started this process; RUNS
 * the calls timed after the first; SIDE i (an input read from FILE) or o (an output, FILE
 * ignored), DTYPE an enum tf_dtype, DIMS comma-separated sizes. Loads the model, runs it once
 * and then RUNS times, and prints one JSON line: seconds from START_NS to the first result,
 * the median of the later calls, and the peak RSS in bytes. On failure prints the step, its
 * status and tf_last_error() and exits 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tilefold_model.h"

static const int itemsize[] = {8, 4, 2, 8, 4, 1, 1, 1};

static double now_s(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Peak resident bytes of this program (VmHWM: getrusage's maxrss inherits the parent's). */
static long peak_rss(void) {
  char line[256];
  long kb = 0;
  FILE *f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %ld", &kb) == 1) break;
  if (f) fclose(f);
  return kb * 1024L;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc < 4) return 2;
  double start = 1e-9 * (double)atoll(argv[1]);
  int runs = atoi(argv[2]);
  tf_tensor tensors[2][8];
  int64_t shapes[16][8];
  int count[2] = {0, 0};
  for (int a = 4; a < argc && a < 20; a++) {
    char side, dims[256], file[1024];
    int dtype;
    if (sscanf(argv[a], "%c:%d:%255[^:]:%1023s", &side, &dtype, dims, file) != 4) return 2;
    if (dtype < 0 || dtype > 7) return 2;
    int s = side == 'o', n = count[s]++;
    if (n >= 8) return 2;
    tf_tensor *t = &tensors[s][n];
    int64_t *shape = shapes[a - 4], elements = 1;
    t->ndim = 0;
    for (char *d = strtok(dims, ","); d && t->ndim < 8; d = strtok(NULL, ","))
      elements *= shape[t->ndim++] = atoll(d);
    t->dtype = dtype;
    t->shape = shape;
    t->data = calloc((size_t)elements + 1, (size_t)itemsize[dtype]);
    if (!s) {
      FILE *f = fopen(file, "rb");
      if (!f || fread(t->data, (size_t)itemsize[dtype], (size_t)elements, f) != (size_t)elements)
        return 3;
      fclose(f);
    }
  }
  tf_model *model;
  int status = tf_model_load(argv[3], &model);
  if (status != TF_OK) {
    printf("load %d %s\n", status, tf_last_error());
    return 1;
  }
  status = tf_model_run(model, tensors[0], count[0], tensors[1], count[1]);
  double first = now_s(CLOCK_REALTIME) - start;
  double *times = calloc((size_t)runs + 1, sizeof(double));
  for (int r = 0; status == TF_OK && r < runs; r++) {
    double t0 = now_s(CLOCK_MONOTONIC);
    status = tf_model_run(model, tensors[0], count[0], tensors[1], count[1]);
    times[r] = now_s(CLOCK_MONOTONIC) - t0;
  }
  if (status != TF_OK) {
    printf("run %d %s\n", status, tf_last_error());
    return 1;
  }
  qsort(times, (size_t)runs, sizeof(double), by_value);
  printf("{\"first_result_s\": %.6f, \"steady_s\": %.6f, \"peak_rss_bytes\": %ld}\n", first,
         runs ? times[runs / 2] : 0.0, peak_rss());
  tf_model_free(model);
  return 0;
}
