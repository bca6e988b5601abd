// The gradient kernels' fast path (kernels/sparsecore/matmul_kernels.cc,
// docs/sparsecore_semantics.md §6): each touched row's gradient summed in
// buffer order and the optimizer applied to it in one pass over the CSR ids,
// without a row -> sum map.
//
// The ids the preprocessing writes (§3) are sorted by token within each
// segment, and a group's segments go in ascending shard, so a replica's ids
// fall into a few runs of non-decreasing (chip, row): one a group.  Within a
// run a row's ids are adjacent; so the ids of row r, in buffer order, are
// run 0's ids of r, then run 1's, ...  Walking the rows in ascending order
// with one cursor a run therefore adds each row's ids in exactly the order
// the map-based path does (§6: "summed in buffer order"), and the row is
// updated as soon as its sum is complete.  The rows are split into ranges,
// one range a task: ranges own disjoint rows, so no two threads write one row.
// Buffers that are not so sorted (a hand-made CSR) make many runs: the
// caller keeps its general path for them (kMaxRuns), whose row update,
// UpdateRows, is here too.  The CPU-dispatched functions are defined here
// (target clones are not inline): include it from that one kernel file only.
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_ROW_RUNS_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_ROW_RUNS_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/cpu_dispatch.h"
#include "core/optimizers.h"
#include "kernels/sparsecore/chips.h"
#include "kernels/sparsecore/kernel_util.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {

// More runs than this (over all replicas) and the caller's general path is
// cheaper than the k-way walk.
inline constexpr int kMaxRuns = 64;

// One run of ids of non-decreasing (chip, row), and the activation
// gradients of the replica whose buffers hold it.
struct IdRun {
  const CsrId* begin;
  const CsrId* end;
  const float* grads;
};

inline bool KeyLess(const CsrId& a, int64_t chip, int64_t row) {
  return a.chip < chip || (a.chip == chip && a.row < row);
}

// Appends the runs of ids[0, n) to `runs`; false (and `runs` incomplete)
// once more than kMaxRuns are found.
inline bool AppendRuns(const CsrId* ids, int64_t n, const float* grads, std::vector<IdRun>* runs) {
  int64_t start = 0;
  for (int64_t i = 1; i <= n; ++i) {
    if (i == n || KeyLess(ids[i], ids[i - 1].chip, ids[i - 1].row)) {
      if (static_cast<int>(runs->size()) >= kMaxRuns) return false;
      runs->push_back({ids + start, ids + i, grads});
      start = i;
    }
  }
  return true;
}

// Row cut points [0 = cut[0] < ... <= cut[parts] = rows] of chip `chip`'s
// shard such that the parts hold about equally many ids (quantiles of rows
// sampled evenly from each run).
inline std::vector<int64_t> BalancedCuts(const std::vector<IdRun>& runs, int64_t chip, int64_t rows,
                                         int64_t parts) {
  std::vector<int64_t> sample;
  for (const IdRun& r : runs) {
    const CsrId* lo = std::lower_bound(r.begin, r.end, chip,
                                       [](const CsrId& a, int64_t c) { return a.chip < c; });
    const CsrId* hi =
        std::lower_bound(lo, r.end, chip + 1, [](const CsrId& a, int64_t c) { return a.chip < c; });
    const int64_t n = hi - lo;
    const int64_t take = std::min<int64_t>(n, 256);
    for (int64_t k = 0; k < take; ++k) sample.push_back(lo[k * n / take].row);
  }
  std::sort(sample.begin(), sample.end());
  std::vector<int64_t> cuts(parts + 1, rows);
  cuts[0] = 0;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t at = sample.empty() ? rows * p / parts : sample[sample.size() * p / parts];
    cuts[p] = std::max(cuts[p - 1], std::min(at, rows));
  }
  return cuts;
}

// Rows [lo, hi) of chip `chip`'s shard: each row with ids gets its gradient
// sum (`sum`: width floats of scratch) in buffer order, then opt's update
// and clipping on the table `w[0]` and slots `w[1..slots]`.  Carries the
// CPU dispatch of core/cpu_dispatch.h (Update is inlined into each clone).
TF_TPU_EMB_CPU_DISPATCH
void SumAndUpdateRows(const SparseCoreOptimizer& opt, float* const* w, int slots, const IdRun* runs,
                      int num_runs, int64_t chip, int64_t lo, int64_t hi, int64_t width, float lr,
                      float* sum) {
  const CsrId* cur[kMaxRuns];
  const CsrId* end[kMaxRuns];
  int64_t prefetched[kMaxRuns];
  for (int r = 0; r < num_runs; ++r) {
    const auto less = [](const CsrId& a, const std::pair<int64_t, int64_t>& k) {
      return KeyLess(a, k.first, k.second);
    };
    cur[r] = std::lower_bound(runs[r].begin, runs[r].end, std::make_pair(chip, lo), less);
    end[r] = std::lower_bound(cur[r], runs[r].end, std::make_pair(chip, hi), less);
    prefetched[r] = -1;
  }
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  constexpr int64_t kAhead = 8;
  for (;;) {
    int64_t row = kNone;
    for (int r = 0; r < num_runs; ++r) {
      if (cur[r] != end[r]) row = std::min(row, cur[r]->row);
    }
    if (row == kNone) return;
    // The rows a few ids ahead in each run: the table and slot rows are
    // random reads (a miss each without this: most of the walk's time).
    // Each row once (a hot row's ids are adjacent), and the gradients'
    // rows of those ids (random by sample).
    for (int r = 0; r < num_runs; ++r) {
      if (end[r] - cur[r] > kAhead) {
        const CsrId& next = cur[r][kAhead];
        const float* grad = runs[r].grads + next.sample * width;
        for (int64_t b = 0; b < width; b += 16) __builtin_prefetch(grad + b);
        if (next.row == prefetched[r]) continue;
        prefetched[r] = next.row;
        const int64_t ahead = next.row * width;
        for (int k = 0; k <= slots; ++k) {
          for (int64_t b = 0; b < width; b += 16) __builtin_prefetch(w[k] + ahead + b, 1);
        }
      }
    }
    std::fill(sum, sum + width, 0.0f);
    for (int r = 0; r < num_runs; ++r) {
      const float* g = runs[r].grads;
      for (; cur[r] != end[r] && cur[r]->row == row; ++cur[r]) {
        const float gain = cur[r]->gain;
        const float* grad = g + cur[r]->sample * width;
        for (int64_t d = 0; d < width; ++d) sum[d] += gain * grad[d];
      }
    }
    const int64_t off = row * width;
    RowArgs args{};
    args.w = w[0] + off;
    for (int k = 0; k < slots; ++k) args.s[k] = w[1 + k] + off;
    args.g = sum;
    args.dim = static_cast<int>(width);
    args.lr = lr;
    opt.Update(args, /*clip=*/true);
  }
}

// The optimizer on touched rows [begin, end) of a chip's shard: row
// touched[t] of the table `w[0]` and its slots `w[1..slots]`, with the
// gradient sums[t * width ...], then the clipping.  Carries the CPU
// dispatch of core/cpu_dispatch.h (Update is inlined into each clone), as
// the engine's ApplyPartition does; the rows ahead are prefetched.
TF_TPU_EMB_CPU_DISPATCH
void UpdateRows(const SparseCoreOptimizer& opt, float* const* w, int slots, const int64_t* touched,
                const float* sums, int64_t width, float lr, int64_t begin, int64_t end) {
  constexpr int64_t kAhead = 4;
  for (int64_t t = begin; t < end; ++t) {
    if (t + kAhead < end) {
      const int64_t ahead = touched[t + kAhead] * width;
      for (int k = 0; k <= slots; ++k) {
        for (int64_t b = 0; b < width; b += 16) __builtin_prefetch(w[k] + ahead + b, 1);
      }
    }
    const int64_t off = touched[t] * width;
    RowArgs args{};
    args.w = w[0] + off;
    for (int k = 0; k < slots; ++k) args.s[k] = w[1 + k] + off;
    args.g = sums + t * width;
    args.dim = static_cast<int>(width);
    args.lr = lr;
    opt.Update(args, /*clip=*/true);
  }
}

}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_SPARSECORE_ROW_RUNS_H_
