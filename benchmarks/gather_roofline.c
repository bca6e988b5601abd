/* The machine's random row-gather bandwidth: the roofline of an embedding
 * step, which reads (and, training, writes) rows at random ids.
 *
 *   gather_roofline ROWS DIM THREADS SECONDS
 *
 * Allocates ROWS x DIM floats (2 MiB aligned, huge pages advised, like the
 * engine's tables), then THREADS threads each sum rows at uniformly random
 * ids (prefetched 8 ahead) for about SECONDS.  Prints one line:
 *   gather_gbps=<GB/s of rows read> update_gbps=<GB/s of rows read + written>
 * The update figure reads a random row and writes it back (row += 1), the
 * traffic pattern of an optimizer's row update.  bench_peers.py compiles and
 * runs it (cc -O2 -pthread).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "roofline_util.h"

static float* table;
static int64_t rows;
static int dim;
static double seconds;

typedef struct {
  uint64_t seed;
  int update;
  int64_t rows_done;
  float sink;
} Work;

#define CHUNK 4096
#define AHEAD 8

static void* run(void* arg) {
  Work* w = (Work*)arg;
  int64_t ids[CHUNK];
  float acc[1024];
  memset(acc, 0, sizeof(acc));
  double t0 = now();
  int64_t done = 0;
  while (now() - t0 < seconds) {
    for (int i = 0; i < CHUNK; ++i) ids[i] = (int64_t)(next(&w->seed) % (uint64_t)rows);
    for (int i = 0; i < CHUNK; ++i) {
      if (i + AHEAD < CHUNK) {
        const char* p = (const char*)(table + ids[i + AHEAD] * dim);
        if (w->update) {
          for (int b = 0; b < dim * 4; b += 64) __builtin_prefetch(p + b, 1);
        } else {
          for (int b = 0; b < dim * 4; b += 64) __builtin_prefetch(p + b, 0);
        }
      }
      float* row = table + ids[i] * dim;
      if (w->update) {
        for (int d = 0; d < dim; ++d) row[d] += 1.0f;
      } else {
        for (int d = 0; d < dim; ++d) acc[d] += row[d];
      }
    }
    done += CHUNK;
  }
  w->rows_done = done;
  w->sink = acc[0];
  return NULL;
}

static double measure(int threads, int update) {
  pthread_t tid[256];
  Work work[256];
  double t0 = now();
  for (int t = 0; t < threads; ++t) {
    work[t].seed = 0x9E3779B97F4A7C15ull * (t + 1) + update;
    work[t].update = update;
    pthread_create(&tid[t], NULL, run, &work[t]);
  }
  int64_t total = 0;
  for (int t = 0; t < threads; ++t) {
    pthread_join(tid[t], NULL);
    total += work[t].rows_done;
  }
  double elapsed = now() - t0;
  return (double)total * dim * 4 * (update ? 2 : 1) / elapsed / 1e9;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s ROWS DIM THREADS SECONDS\n", argv[0]);
    return 2;
  }
  rows = atoll(argv[1]);
  dim = atoi(argv[2]);
  int threads = atoi(argv[3]);
  seconds = atof(argv[4]);
  if (rows <= 0 || dim <= 0 || dim > 1024 || threads <= 0 || threads > 256) {
    fprintf(stderr, "ROWS > 0, 0 < DIM <= 1024, 0 < THREADS <= 256\n");
    return 2;
  }
  table = alloc_table((size_t)rows * dim * 4);
  if (table == NULL) return 1;
  for (int64_t i = 0; i < rows * dim; ++i) table[i] = (float)(i & 7);
  double gather = measure(threads, 0);
  double update = measure(threads, 1);
  printf("gather_gbps=%.2f update_gbps=%.2f\n", gather, update);
  free(table);
  return 0;
}
