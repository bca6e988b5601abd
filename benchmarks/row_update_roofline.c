/* What an optimizer's row update costs in memory traffic alone: random rows
 * of a table updated with Adagrad's formula, three ways (benchmarks/RESULTS.md,
 * "What bounds the targets"):
 *
 *   separate     exact element-wise Adagrad, parameters and accumulators in
 *                two tables (the engine's layout): 2 x DIM floats read and
 *                written per row, two random places
 *   interleaved  the same, each row's parameters and accumulators side by
 *                side in one table: the same bytes, one random place
 *   rowwise      FBGEMM's row-wise Adagrad: DIM floats + 1 float per row
 *
 *   row_update_roofline ROWS DIM THREADS SECONDS AHEAD
 *
 * Tables are 2 MiB aligned with huge pages advised (as the engine's); each
 * thread updates uniformly random rows, prefetching AHEAD rows ahead, for
 * about SECONDS per mode, three rounds.  Prints million rows per second per
 * mode and round.  cc -O2 -pthread row_update_roofline.c -o r -lm
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "roofline_util.h"

static int64_t rows;
static int dim, mode, ahead;
static double seconds;
static float *P, *A, *I, *R;

static float* alloc(size_t bytes) {
  float* p = alloc_table(bytes);
  if (p == NULL) exit(1);
  memset(p, 0, bytes);
  return p;
}

static void prefetch(const void* p, int bytes) {
  for (int b = 0; b < bytes; b += 64) __builtin_prefetch((const char*)p + b, 1);
}

typedef struct {
  uint64_t seed;
  int64_t done;
} Work;

#define CHUNK 4096

static void* run(void* arg) {
  Work* w = arg;
  int64_t* ids = malloc(sizeof(int64_t) * CHUNK);
  float g[1024];
  for (int d = 0; d < dim; ++d) g[d] = 0.01f * (d + 1);
  double t0 = now();
  int64_t done = 0;
  while (now() - t0 < seconds) {
    for (int i = 0; i < CHUNK; ++i) ids[i] = (int64_t)(next(&w->seed) % (uint64_t)rows);
    for (int i = 0; i < CHUNK; ++i) {
      if (i + ahead < CHUNK) {
        const int64_t j = ids[i + ahead];
        if (mode == 0) {
          prefetch(P + j * dim, dim * 4);
          prefetch(A + j * dim, dim * 4);
        } else if (mode == 1) {
          prefetch(I + j * 2 * dim, dim * 8);
        } else {
          prefetch(P + j * dim, dim * 4);
          prefetch(R + j, 4);
        }
      }
      const int64_t id = ids[i];
      if (mode == 2) {
        float *wr = P + id * dim, s = 0;
        for (int d = 0; d < dim; ++d) s += g[d] * g[d];
        R[id] += s / dim;
        const float r = 0.1f / sqrtf(R[id] + 1e-3f);
        for (int d = 0; d < dim; ++d) wr[d] -= r * g[d];
        continue;
      }
      float* wr = mode == 0 ? P + id * dim : I + id * 2 * dim;
      float* a = mode == 0 ? A + id * dim : wr + dim;
      for (int d = 0; d < dim; ++d) {
        a[d] += g[d] * g[d];
        wr[d] -= 0.1f * g[d] / sqrtf(a[d] + 1e-3f);
      }
    }
    done += CHUNK;
  }
  w->done = done;
  free(ids);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s ROWS DIM THREADS SECONDS AHEAD\n", argv[0]);
    return 2;
  }
  rows = atoll(argv[1]);
  dim = atoi(argv[2]);
  const int threads = atoi(argv[3]);
  seconds = atof(argv[4]);
  ahead = atoi(argv[5]);
  if (rows <= 0 || dim <= 0 || dim > 1024 || threads <= 0 || threads > 64 || ahead < 0) {
    fprintf(stderr, "ROWS > 0, 0 < DIM <= 1024, 0 < THREADS <= 64, AHEAD >= 0\n");
    return 2;
  }
  P = alloc((size_t)rows * dim * 4);
  A = alloc((size_t)rows * dim * 4);
  I = alloc((size_t)rows * dim * 8);
  R = alloc((size_t)rows * 4);
  const char* names[] = {"separate", "interleaved", "rowwise"};
  for (int round = 0; round < 3; ++round) {
    for (mode = 0; mode < 3; ++mode) {
      pthread_t tid[64];
      Work work[64];
      const double t0 = now();
      for (int t = 0; t < threads; ++t) {
        work[t].seed = 0x9E3779B97F4A7C15ull * (t + 1 + 7 * round + mode);
        pthread_create(&tid[t], NULL, run, &work[t]);
      }
      int64_t total = 0;
      for (int t = 0; t < threads; ++t) {
        pthread_join(tid[t], NULL);
        total += work[t].done;
      }
      printf("round %d %-12s %.2f Mrows/s\n", round + 1, names[mode], total / (now() - t0) / 1e6);
    }
  }
  return 0;
}
