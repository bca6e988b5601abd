// The SparseCore gradient's fast path, for both front ends (the TF kernels,
// kernels/sparsecore/matmul_kernels.cc, and the JAX FFI handlers,
// jax_ffi/sparsecore_ffi.cc; docs/sparsecore_semantics.md §6 and §11.3):
// each touched row's gradient summed in buffer order and the optimizer
// applied to it in one pass over the CSR ids, without a row -> sum map.
//
// Both preprocessings write the ids of a segment sorted by row, and a
// group's segments in ascending shard, so the ids fall into a few runs of
// non-decreasing key (the row in a chip-major order of the tables the caller
// updates): one a group.  Within a run a row's ids are adjacent; so the ids
// of a row, in buffer order, are run 0's ids of it, then run 1's, ...
// Walking the keys in ascending order with one cursor a run therefore adds
// each row's ids in exactly the order a map-based sum in buffer order does,
// and the row is updated as soon as its sum is complete.  The keys are split
// into ranges, one range a task: ranges own disjoint rows, so no two threads
// write one row.  Buffers that are not so sorted (a hand-made CSR) make many
// runs: AppendRuns says so past kMaxRuns and the caller keeps its general
// path for them.
//
// The front end's id type comes with a traits class `T`:
//   static int64_t Key(const Id&)     the id's key (non-decreasing in a run);
//   static int64_t Row(const Id&)     the row in the table pointers handed
//                                     to SumAndUpdateRuns;
//   static int64_t GradRow(const Id&) the row of its run's gradients;
//   static float Gain(const Id&).
#ifndef TF_TPU_EMB_CORE_ROW_RUNS_H_
#define TF_TPU_EMB_CORE_ROW_RUNS_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/cpu_dispatch.h"
#include "core/optimizer_formulas.h"

namespace tf_tpu_emb {
namespace row_runs {

// More runs than this (over all buffers) and a general path is cheaper than
// the k-way walk.
inline constexpr int kMaxRuns = 64;

// One run of ids of non-decreasing key, and the activation gradients its
// ids' GradRow index.
template <typename Id>
struct Run {
  const Id* begin;
  const Id* end;
  const float* grads;
};

// Appends the runs of ids[0, n) to `runs`; false (and `runs` incomplete)
// once more than kMaxRuns are found.
template <typename T, typename Id>
bool AppendRuns(const Id* ids, int64_t n, const float* grads, std::vector<Run<Id>>* runs) {
  int64_t start = 0;
  for (int64_t i = 1; i <= n; ++i) {
    if (i == n || T::Key(ids[i]) < T::Key(ids[i - 1])) {
      if (static_cast<int>(runs->size()) >= kMaxRuns) return false;
      runs->push_back({ids + start, ids + i, grads});
      start = i;
    }
  }
  return true;
}

// The ids of `run` whose key is in [lo, hi).
template <typename T, typename Id>
std::pair<const Id*, const Id*> KeyRange(const Run<Id>& run, int64_t lo, int64_t hi) {
  const auto less = [](const Id& a, int64_t key) { return T::Key(a) < key; };
  const Id* first = std::lower_bound(run.begin, run.end, lo, less);
  return {first, std::lower_bound(first, run.end, hi, less)};
}

// Key cut points [lo = cut[0] <= ... <= cut[parts] = hi] such that the parts
// hold about equally many ids (quantiles of keys sampled evenly from each
// run's ids in [lo, hi)).
template <typename T, typename Id>
std::vector<int64_t> BalancedCuts(const std::vector<Run<Id>>& runs, int64_t lo, int64_t hi,
                                  int64_t parts) {
  std::vector<int64_t> sample;
  for (const Run<Id>& r : runs) {
    const auto [first, last] = KeyRange<T>(r, lo, hi);
    const int64_t n = last - first;
    const int64_t take = std::min<int64_t>(n, 256);
    for (int64_t k = 0; k < take; ++k) sample.push_back(T::Key(first[k * n / take]));
  }
  std::sort(sample.begin(), sample.end());
  std::vector<int64_t> cuts(parts + 1, hi);
  cuts[0] = lo;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t at =
        sample.empty() ? lo + (hi - lo) * p / parts : sample[sample.size() * p / parts];
    cuts[p] = std::max(cuts[p - 1], std::min(at, hi));
  }
  return cuts;
}

// Keys [lo, hi): each row with ids gets its gradient sum (`sum`: width
// floats of scratch) in buffer order, then update(RowArgs&) on the table
// `w[0]` and slots `w[1..slots]` at T::Row.  Inlined into the caller, which
// carries the CPU dispatch of core/cpu_dispatch.h (update is inlined into
// each clone with it).
template <typename T, typename Id, typename Update>
TF_TPU_EMB_INLINE_INTO_CLONES void SumAndUpdateRuns(const Run<Id>* runs, int num_runs, int64_t lo,
                                                    int64_t hi, float* const* w, int slots,
                                                    int64_t width, float* sum,
                                                    const Update& update) {
  const Id* cur[kMaxRuns];
  const Id* end[kMaxRuns];
  int64_t prefetched[kMaxRuns];
  for (int r = 0; r < num_runs; ++r) {
    const auto [first, last] = KeyRange<T>(runs[r], lo, hi);
    cur[r] = first;
    end[r] = last;
    prefetched[r] = -1;
  }
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  constexpr int64_t kAhead = 8;
  for (;;) {
    int64_t key = kNone;
    for (int r = 0; r < num_runs; ++r) {
      if (cur[r] != end[r]) key = std::min(key, T::Key(*cur[r]));
    }
    if (key == kNone) return;
    // The rows a few ids ahead in each run: the table and slot rows are
    // random reads (a miss each without this: most of the walk's time).
    // Each row once (a hot row's ids are adjacent), and the gradients'
    // rows of those ids (random by sample).
    for (int r = 0; r < num_runs; ++r) {
      if (end[r] - cur[r] > kAhead) {
        const Id& next = cur[r][kAhead];
        const float* grad = runs[r].grads + T::GradRow(next) * width;
        for (int64_t b = 0; b < width; b += 16) __builtin_prefetch(grad + b);
        const int64_t row = T::Row(next);
        if (row == prefetched[r]) continue;
        prefetched[r] = row;
        for (int k = 0; k <= slots; ++k) {
          for (int64_t b = 0; b < width; b += 16) __builtin_prefetch(w[k] + row * width + b, 1);
        }
      }
    }
    std::fill(sum, sum + width, 0.0f);
    int64_t row = 0;
    for (int r = 0; r < num_runs; ++r) {
      const float* g = runs[r].grads;
      for (; cur[r] != end[r] && T::Key(*cur[r]) == key; ++cur[r]) {
        row = T::Row(*cur[r]);
        const float gain = T::Gain(*cur[r]);
        const float* grad = g + T::GradRow(*cur[r]) * width;
        for (int64_t d = 0; d < width; ++d) sum[d] += gain * grad[d];
      }
    }
    const int64_t off = row * width;
    RowArgs args{};
    args.w = w[0] + off;
    for (int k = 0; k < slots; ++k) args.s[k] = w[1 + k] + off;
    args.g = sum;
    args.dim = static_cast<int>(width);
    update(args);
  }
}

}  // namespace row_runs
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_ROW_RUNS_H_
