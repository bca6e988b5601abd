// CPU kernels of the standalone SparseCore optimizer ops XlaSparseCore<Opt>
// (TPUEmbeddingV2's building blocks, docs/sparsecore_semantics.md §7): the
// rows given by `indices` of the table and slots they are given are updated
// with core/optimizer_formulas.h's row updates (one optimizer source), without
// clipping, into new outputs.  They have no chips: no meeting, no
// pipelining.  Registered as TfTpuEmb>Name and under TF's name.  Every input
// is checked before an output is written (InvalidArgument naming the op).
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/optimizers.h"
#include "kernels/registration.h"
#include "kernels/sparsecore/kernel_util.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {
namespace {

// XlaSparseCore<Opt>: its inputs' positions, attrs and scalar inputs are
// data of core/sparsecore_optimizers.gen.h (tf_tpu_emb/optimizer_specs.py).
template <Opt kOpt>
class StandaloneOp : public OpKernel {
 public:
  explicit StandaloneOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    optimizer_.opt = kOpt;
    OP_REQUIRES_OK(c, c->GetAttr("feature_width", &width_));
    OP_REQUIRES(c, width_ >= 1,
                Invalid(op_, absl::StrCat("feature_width must be positive, got ", width_)));
    OP_REQUIRES_OK(c, ReadAttrs(c, [&](auto&& visit) {
                     return sc_opt::VisitStandaloneAttrs(kOpt, &optimizer_.hyper, visit);
                   }));
    OP_REQUIRES_OK(c, CheckNonzeroHypers(op_, optimizer_));
  }

  void Compute(OpKernelContext* ctx) override {
    constexpr sc_opt::StandaloneLayout L = sc_opt::StandaloneLayoutOf(kOpt);
    constexpr int kSlots = NumSlotsOf(kOpt);
    const Tensor& indices = ctx->input(L.indices);
    const Tensor& grads = ctx->input(L.gradient);
    const Tensor& table = ctx->input(L.table);
    OP_REQUIRES_OK(ctx, CheckRank(op_, "indices", indices, 1));
    OP_REQUIRES_OK(ctx, CheckRank(op_, "embedding_table", table, 2));
    OP_REQUIRES_OK(ctx, CheckRank(op_, "gradient", grads, 2));
    const int64_t n = indices.NumElements(), rows = table.dim_size(0);
    OP_REQUIRES(
        ctx, table.dim_size(1) == width_ && grads.dim_size(1) == width_ && grads.dim_size(0) == n,
        Invalid(op_, absl::StrCat("gradient ", grads.shape().DebugString(), " and embedding_table ",
                                  table.shape().DebugString(), " must be [", n,
                                  ", feature_width = ", width_, "] and [rows, ", width_, "]")));
    for (int k = 0; k < kSlots; ++k) {
      OP_REQUIRES_OK(ctx, CheckSameShape(op_, "a slot variable", ctx->input(L.slots[k]), table));
    }
    float lr;
    OP_REQUIRES_OK(ctx, ScalarValue(op_, "learning_rate", ctx->input(L.learning_rate), &lr));
    SparseCoreOptimizer optimizer = optimizer_;
    absl::Status scalars;
    sc_opt::VisitStandaloneScalars(kOpt, &optimizer.hyper,
                                   [&](int input, const char* name, float* value) {
                                     scalars = ScalarValue(op_, name, ctx->input(input), value);
                                     return scalars.ok();
                                   });
    OP_REQUIRES_OK(ctx, scalars);
    const auto idx = indices.vec<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      OP_REQUIRES(ctx, idx(i) >= 0 && idx(i) < rows,
                  Invalid(op_, absl::StrCat("indices[", i, "] = ", idx(i), " is outside [0, ", rows,
                                            ") (rows of the embedding table)")));
    }
    float* w;
    float* s[kMaxSlots] = {};
    OP_REQUIRES_OK(ctx, CopyToOutput(ctx, 0, table, &w));
    for (int k = 0; k < kSlots; ++k) {
      OP_REQUIRES_OK(ctx, CopyToOutput(ctx, L.slot_outputs[k], ctx->input(L.slots[k]), &s[k]));
    }
    const float* g = grads.flat<float>().data();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t off = static_cast<int64_t>(idx(i)) * width_;
      RowArgs a{};
      a.w = w + off;
      for (int k = 0; k < kSlots; ++k) a.s[k] = s[k] + off;
      a.g = g + i * width_;
      a.dim = static_cast<int>(width_);
      a.lr = lr;
      optimizer.Update(a, /*clip=*/false);
    }
  }

 private:
  const std::string op_;
  SparseCoreOptimizer optimizer_;
  int64_t width_ = 1;
};

bool RegisterKernels() {
  sc_opt::ForEachOptimizer([](auto opt) {
    RegisterBoth<StandaloneOp<decltype(opt)::value>>(
        absl::StrCat("XlaSparseCore", sc_opt::NameOf(opt)));
  });
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
