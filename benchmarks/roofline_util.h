/* What the roofline programs (gather_roofline.c, row_update_roofline.c)
 * share: a monotonic clock, a fast random generator, and tables allocated
 * like the engine's (2 MiB aligned, huge pages advised, engine/table.cc). */
#ifndef TF_TPU_EMB_BENCHMARKS_ROOFLINE_UTIL_H_
#define TF_TPU_EMB_BENCHMARKS_ROOFLINE_UTIL_H_

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static uint64_t next(uint64_t* s) { /* xorshift64* */
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 2685821657736338717ull;
}

/* `bytes` rounded up to 2 MiB, 2 MiB aligned, huge pages advised; NULL
 * (after a message) when it cannot be allocated.  Not touched. */
static float* alloc_table(size_t bytes) {
  const size_t huge = (size_t)2 << 20;
  bytes = (bytes + huge - 1) / huge * huge;
  float* p = aligned_alloc(huge, bytes);
  if (p == NULL) {
    fprintf(stderr, "cannot allocate %zu bytes\n", bytes);
    return NULL;
  }
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return p;
}

#endif /* TF_TPU_EMB_BENCHMARKS_ROOFLINE_UTIL_H_ */
