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

// §2's sort and merge of tokens [begin, end): by (col, position); a token
// with the previous token's row and col adds its gain to the kept one,
// every other token is appended to `kept` and reported as on_kept(col,
// new_col), new_col when its col differs from the previous token's.  Rows
// and cols are not negative (checked by the callers).
template <typename OnKept>
void SortAndMerge(const int32_t* rows, const int32_t* cols, const float* gains, int64_t begin,
                  int64_t end, std::vector<Kept>* kept, OnKept on_kept) {
  std::vector<int64_t> order(end - begin);
  std::iota(order.begin(), order.end(), begin);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cols[a] < cols[b]; });
  int32_t prev_row = -1, prev_col = -1;
  for (const int64_t i : order) {
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
