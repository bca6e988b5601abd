// CPU kernel of XlaSparseDenseMatmul, the SparseCore lookup with COO input
// (row_ids, col_ids, values, offsets).  Registered as TfTpuEmb>Name and under
// TF's name.  What it computes -- the embedding bag and its sorted CSR
// outputs, in the one-SparseCore layout of §3/§5 -- is
// docs/sparsecore_semantics.md §5 ("XlaSparseDenseMatmul"); the sort and
// merge are §2's.  Every input is checked before an output is written.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sparsecore.h"
#include "kernels/registration.h"
#include "kernels/sparsecore/kernel_util.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {
namespace {

namespace sc = ::tf_tpu_emb::sparsecore;

class CooMatmulOp : public OpKernel {
 public:
  explicit CooMatmulOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, c->GetAttr("input_size", &input_size_));
    OP_REQUIRES_OK(c, c->GetAttr("max_ids_per_partition", &max_ids_));
    OP_REQUIRES_OK(c, c->GetAttr("max_unique_ids_per_partition", &max_uniques_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows_t = ctx->input(0);
    const Tensor& cols_t = ctx->input(1);
    const Tensor& values_t = ctx->input(2);
    const Tensor& offsets_t = ctx->input(3);
    const Tensor& table = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckRank(op_, "row_ids", rows_t, 1));
    OP_REQUIRES_OK(ctx, CheckRank(op_, "col_ids", cols_t, 1));
    OP_REQUIRES_OK(ctx, CheckRank(op_, "values", values_t, 1));
    OP_REQUIRES_OK(ctx, CheckRank(op_, "offsets", offsets_t, 0));
    OP_REQUIRES_OK(ctx, CheckRank(op_, "embedding_table", table, 2));
    const int64_t n = rows_t.NumElements();
    OP_REQUIRES(ctx, cols_t.NumElements() == n && values_t.NumElements() == n,
                Invalid(op_, absl::StrCat("row_ids (", n, "), col_ids (", cols_t.NumElements(),
                                          ") and values (", values_t.NumElements(),
                                          ") must have the same length")));
    // TF publishes no meaning for `offsets` (the custom call's); ours take
    // only 0 rather than guess (semantics §5).
    const uint32_t offsets = offsets_t.scalar<uint32_t>()();
    OP_REQUIRES(ctx, offsets == 0,
                absl::UnimplementedError(absl::StrCat(op_, ": offsets = ", offsets,
                                                      " is not implemented on CPU (only 0)")));
    const auto rows = rows_t.vec<int32_t>();
    const auto cols = cols_t.vec<uint32_t>();
    const auto values = values_t.vec<float>();
    const int64_t table_rows = table.dim_size(0), width = table.dim_size(1);
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, rows(i) >= 0 && rows(i) < input_size_,
                  Invalid(op_, absl::StrCat("row_ids[", i, "] = ", rows(i), " is outside [0, ",
                                            input_size_, ") (input_size)")));
      OP_REQUIRES(ctx, cols(i) < table_rows,
                  Invalid(op_, absl::StrCat("col_ids[", i, "] = ", cols(i), " is outside [0, ",
                                            table_rows, ") (rows of the embedding table)")));
    }
    // §2: sorted by (col, position); a token with the previous kept token's
    // row and col is merged into it.
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return cols(a) < cols(b); });
    std::vector<int32_t> kept_rows, kept_cols;
    std::vector<float> kept_gains;
    int64_t uniques = 0;
    for (int64_t i : order) {
      if (!kept_rows.empty() && kept_rows.back() == rows(i) &&
          kept_cols.back() == static_cast<int32_t>(cols(i))) {
        kept_gains.back() += values(i);
        continue;
      }
      if (kept_cols.empty() || kept_cols.back() != static_cast<int32_t>(cols(i))) ++uniques;
      kept_rows.push_back(rows(i));
      kept_cols.push_back(static_cast<int32_t>(cols(i)));
      kept_gains.push_back(values(i));
    }
    const int64_t kept = static_cast<int64_t>(kept_rows.size());
    OP_REQUIRES(ctx, kept <= max_ids_,
                Invalid(op_, absl::StrCat("the ", kept,
                                          " ids exceed max_ids_per_partition = ", max_ids_)));
    OP_REQUIRES(ctx, uniques <= max_uniques_,
                Invalid(op_, absl::StrCat("the ", uniques,
                                          " unique ids exceed max_unique_ids_per_partition = ",
                                          max_uniques_)));

    // Activations: the embedding bag.
    Tensor* act;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({input_size_, width}), &act));
    float* a = act->flat<float>().data();
    std::fill_n(a, input_size_ * width, 0.0f);
    const float* w = table.flat<float>().data();
    for (int64_t k = 0; k < kept; ++k) {
      float* out = a + kept_rows[k] * width;
      const float* row = w + static_cast<int64_t>(kept_cols[k]) * width;
      for (int64_t d = 0; d < width; ++d) out[d] += kept_gains[k] * row[d];
    }
    // The CSR form of one SparseCore, one replica, one minibatch (§3): one
    // group of 8 row pointers, segment 0 holding every id, the id buffers
    // padded to a multiple of 8 with the pad value.
    const int64_t padded = sc::RoundUp(kept, sc::kXlaPadSize);
    Tensor *pointers, *emb_ids, *sample_ids, *gains;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({sc::kXlaPadSize}), &pointers));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({padded}), &emb_ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({padded}), &sample_ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({padded}), &gains));
    auto p = pointers->vec<int32_t>();
    p(0) = static_cast<int32_t>(kept);
    for (int64_t k = 1; k < sc::kXlaPadSize; ++k) p(k) = static_cast<int32_t>(padded);
    auto e = emb_ids->vec<int32_t>();
    auto s = sample_ids->vec<int32_t>();
    auto g = gains->vec<float>();
    for (int64_t k = 0; k < padded; ++k) {
      const bool real = k < kept;
      e(k) = real ? kept_cols[k] : sc::kXlaPadValue;
      s(k) = real ? kept_rows[k] : sc::kXlaPadValue;
      g(k) = real ? kept_gains[k] : static_cast<float>(sc::kXlaPadValue);
    }
  }

 private:
  const std::string op_;
  int64_t input_size_ = 0, max_ids_ = 0, max_uniques_ = 0;
};

bool RegisterKernels() {
  RegisterBoth<CooMatmulOp>("XlaSparseDenseMatmul");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
