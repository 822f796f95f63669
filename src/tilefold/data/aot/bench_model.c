/* `tilefold bench aot`'s C driver (cli/aot_start.py builds it with cc against an artifact):
 *   bench_model START_NS RUNS DIR SIDE:DTYPE:DIMS:FILE ...
 * START_NS the CLOCK_REALTIME nanoseconds at which the parent started this process; RUNS
 * the calls timed after the first; the tensors as tensor_args.h parses them (an output's FILE
 * ignored). Loads the model, runs it once and then RUNS times, and prints one JSON line:
 * seconds from START_NS to the first result, the median of the later calls, and the peak RSS
 * in bytes. On failure prints the step, its
 * status and tf_last_error() and exits 1.
 */
#include <time.h>

#include "tensor_args.h"

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
  static tf_args args;
  int parsed = tf_args_parse(&args, argc - 4, argv + 4);
  if (parsed != 0) return parsed;
  tf_model *model;
  int status = tf_model_load(argv[3], &model);
  if (status != TF_OK) {
    printf("load %d %s\n", status, tf_last_error());
    return 1;
  }
  status = tf_model_run(model, args.tensors[0], args.count[0], args.tensors[1], args.count[1]);
  double first = now_s(CLOCK_REALTIME) - start;
  double *times = calloc((size_t)runs + 1, sizeof(double));
  for (int r = 0; status == TF_OK && r < runs; r++) {
    double t0 = now_s(CLOCK_MONOTONIC);
    status = tf_model_run(model, args.tensors[0], args.count[0], args.tensors[1], args.count[1]);
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
