// What the SparseCore preprocessing kernels share
// (kernels/sparsecore_coo_kernels.cc: §1-§2, kernels/sparsecore_csr_kernels.cc:
// §3-§4, §8 of docs/sparsecore_semantics.md): the status helpers that stop a
// Compute, the vector check and §2's sort and merge of COO tokens.
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_PREPROCESS_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_PREPROCESS_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/sparsecore_kernel_util.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_util {

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

#define TTE_SC_CHECK(ctx, cond, status)      \
  do {                                       \
    if (!(cond)) {                           \
      (ctx)->CtxFailure(__FILE__, __LINE__, (status)); \
      return;                                \
    }                                        \
  } while (0)

#define TTE_SC_OK(ctx, expr)                                  \
  do {                                                        \
    const absl::Status _st = (expr);                          \
    if (!_st.ok()) {                                          \
      (ctx)->CtxFailure(__FILE__, __LINE__, _st);             \
      return;                                                 \
    }                                                         \
  } while (0)

inline absl::Status RankOne(const std::string& op, const char* name, const Tensor& t) {
  if (t.dims() != 1) {
    return Invalid(op,
                   absl::StrCat(name, " must be a vector, got shape ", t.shape().DebugString()));
  }
  return absl::OkStatus();
}

// A kept COO token of §2 (or §4): its row, col and merged gain.
struct Kept {
  int32_t row, col;
  float gain;
};

// The positions [0, n) of cols[0, n) in stable order of col (§2's order:
// col, then position).  An LSD radix sort of (col << 32 | position) keys,
// 11 bits of col a pass and only as many passes as the largest col needs:
// each pass is stable, so equal cols keep their positions' order, and the
// cost is linear (a comparison sort of the positions was most of a
// SortListOfSparseCoreCooTensors; benchmarks/bench_sparsecore.py).  Cols are
// not negative (checked by the callers).
inline void StableOrderByCol(const int32_t* cols, int64_t n, std::vector<uint64_t>* keys) {
  keys->resize(n);
  int32_t max_col = 0;
  for (int64_t i = 0; i < n; ++i) {
    (*keys)[i] = (static_cast<uint64_t>(cols[i]) << 32) | static_cast<uint64_t>(i);
    max_col = std::max(max_col, cols[i]);
  }
  constexpr int kBits = 11;
  constexpr size_t kBuckets = size_t{1} << kBits;
  std::vector<uint64_t> tmp(n);
  std::vector<int64_t> start(kBuckets + 1);
  for (int shift = 32; (max_col >> (shift - 32)) != 0; shift += kBits) {
    std::fill(start.begin(), start.end(), 0);
    for (const uint64_t k : *keys) ++start[((k >> shift) & (kBuckets - 1)) + 1];
    for (size_t b = 1; b <= kBuckets; ++b) start[b] += start[b - 1];
    for (const uint64_t k : *keys) tmp[start[(k >> shift) & (kBuckets - 1)]++] = k;
    keys->swap(tmp);
    if (shift - 32 + kBits >= 31) break;
  }
}

// §2's sort and merge of tokens [begin, end): by (col, position); a token
// with the previous token's row and col adds its gain to the kept one,
// every other token is appended to `kept` and reported as on_kept(col,
// new_col), new_col when its col differs from the previous token's.  Rows
// and cols are not negative (checked by the callers); fewer than 2^32
// tokens (TF's int32 buffers).
template <typename OnKept>
void SortAndMerge(const int32_t* rows, const int32_t* cols, const float* gains, int64_t begin,
                  int64_t end, std::vector<Kept>* kept, OnKept on_kept) {
  std::vector<uint64_t> order;
  StableOrderByCol(cols + begin, end - begin, &order);
  kept->reserve(kept->size() + order.size());
  int32_t prev_row = -1, prev_col = -1;
  for (const uint64_t key : order) {
    const int64_t i = begin + static_cast<int64_t>(key & 0xffffffffu);
    if (rows[i] != prev_row || cols[i] != prev_col) {
      kept->push_back({rows[i], cols[i], gains[i]});
      on_kept(cols[i], cols[i] != prev_col);
    } else {
      kept->back().gain += gains[i];
    }
    prev_row = rows[i];
    prev_col = cols[i];
  }
}

}  // namespace sc_util
}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_SPARSECORE_PREPROCESS_H_
