// The gradient kernels' fast path (kernels/sparsecore/matmul_kernels.cc,
// docs/sparsecore_semantics.md §6): the sorted-run walk of core/row_runs.h
// (shared with the JAX handlers) over the CSR ids of every replica, keyed
// by (chip, row), and the general path's row update.  The CPU-dispatched
// functions are defined here (target clones are not inline): include it
// from that one kernel file only.
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_ROW_RUNS_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_ROW_RUNS_H_

#include <cstdint>
#include <vector>

#include "core/cpu_dispatch.h"
#include "core/optimizers.h"
#include "core/row_runs.h"
#include "kernels/sparsecore/chips.h"
#include "kernels/sparsecore/kernel_util.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {

using row_runs::kMaxRuns;

// core/row_runs.h's view of a CsrId: keyed by (chip, row), a chip's rows
// below 2^32; the gradient row is the sample's.
struct CsrIds {
  static int64_t Key(const CsrId& a) { return (a.chip << 32) | a.row; }
  static int64_t Row(const CsrId& a) { return a.row; }
  static int64_t GradRow(const CsrId& a) { return a.sample; }
  static float Gain(const CsrId& a) { return a.gain; }
};
using IdRun = row_runs::Run<CsrId>;

// The keys of chip `chip`'s rows [lo, hi).
inline int64_t ChipKey(int64_t chip, int64_t row) { return (chip << 32) | row; }

inline bool AppendRuns(const CsrId* ids, int64_t n, const float* grads, std::vector<IdRun>* runs) {
  return row_runs::AppendRuns<CsrIds>(ids, n, grads, runs);
}

// Row cut points [0 = cut[0] < ... <= cut[parts] = rows] of chip `chip`'s
// shard such that the parts hold about equally many ids.
inline std::vector<int64_t> BalancedCuts(const std::vector<IdRun>& runs, int64_t chip, int64_t rows,
                                         int64_t parts) {
  std::vector<int64_t> cuts =
      row_runs::BalancedCuts<CsrIds>(runs, ChipKey(chip, 0), ChipKey(chip, rows), parts);
  for (int64_t& c : cuts) c -= ChipKey(chip, 0);
  return cuts;
}

// The optimizer's update and clipping of one row, inlined into each clone.
struct ClippedUpdate {
  const SparseCoreOptimizer& opt;
  float lr;
  TF_TPU_EMB_INLINE_INTO_CLONES void operator()(RowArgs& args) const {
    args.lr = lr;
    opt.Update(args, /*clip=*/true);
  }
};

// Rows [lo, hi) of chip `chip`'s shard: each row with ids gets its gradient
// sum (`sum`: width floats of scratch) in buffer order, then opt's update
// and clipping on the table `w[0]` and slots `w[1..slots]`.  Carries the
// CPU dispatch of core/cpu_dispatch.h (Update is inlined into each clone).
TF_TPU_EMB_CPU_DISPATCH
void SumAndUpdateRows(const SparseCoreOptimizer& opt, float* const* w, int slots, const IdRun* runs,
                      int num_runs, int64_t chip, int64_t lo, int64_t hi, int64_t width, float lr,
                      float* sum) {
  row_runs::SumAndUpdateRuns<CsrIds>(runs, num_runs, ChipKey(chip, lo), ChipKey(chip, hi), w, slots,
                                     width, sum, ClippedUpdate{opt, lr});
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
