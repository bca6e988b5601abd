// CPU kernels of the standalone SparseCore optimizer ops XlaSparseCore<Opt>
// (TPUEmbeddingV2's building blocks, docs/sparsecore_semantics.md §7): the
// rows given by `indices` of the table and slots they are given are updated
// with core/optimizers.h's row updates (one optimizer source), without
// clipping, into new outputs.  They have no chips: no meeting, no
// pipelining.  Registered as TfTpuEmb>Name and under TF's name.  Every input
// is checked before an output is written (InvalidArgument naming the op).
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/optimizers.h"
#include "kernels/registration.h"
#include "kernels/sparsecore_kernel_util.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace {

using sc_util::CheckRank;
using sc_util::CheckSameShape;
using sc_util::CopyToOutput;
using sc_util::Invalid;
using sc_util::Opt;
using sc_util::ScalarValue;
using sc_util::SparseCoreOptimizer;

// XlaSparseCore<Opt>: input positions of each op's tensors (TF's orders
// differ per op), and its outputs: table first, then the slots in the
// op's output order.
struct StandaloneLayout {
  int indices, gradient, learning_rate, table;
  int slots[2];          // inputs, in the optimizer's slot order
  int slot_outputs[2];   // the output of each slot
};

template <Opt kOpt>
constexpr StandaloneLayout LayoutOf() {
  switch (kOpt) {
    case Opt::kSgd: return {0, 1, 2, 3, {-1, -1}, {-1, -1}};
    case Opt::kAdagrad: return {0, 1, 2, 4, {3, -1}, {1, -1}};
    case Opt::kAdagradMomentum: return {0, 1, 2, 7, {5, 6}, {1, 2}};
    // momentum, velocity in; table, velocity, momentum out.
    case Opt::kAdam: return {1, 2, 3, 0, {4, 5}, {2, 1}};
    case Opt::kFtrl: return {4, 5, 3, 0, {1, 2}, {1, 2}};
  }
  return {};
}

template <Opt kOpt>
class StandaloneOp : public OpKernel {
 public:
  explicit StandaloneOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    optimizer_.opt = kOpt;
    OP_REQUIRES_OK(c, c->GetAttr("feature_width", &width_));
    OP_REQUIRES(c, width_ >= 1,
                Invalid(op_, absl::StrCat("feature_width must be positive, got ", width_)));
    if (kOpt == Opt::kAdagradMomentum) {
      OP_REQUIRES_OK(c, c->GetAttr("use_nesterov", &optimizer_.momentum.use_nesterov));
      OP_REQUIRES_OK(c, c->GetAttr("beta_2", &optimizer_.momentum.beta2));
      OP_REQUIRES_OK(c, c->GetAttr("exponent", &optimizer_.momentum.exponent));
      OP_REQUIRES(c, optimizer_.momentum.exponent != 0,
                  Invalid(op_, "exponent must not be 0"));
    } else if (kOpt == Opt::kAdam) {
      OP_REQUIRES_OK(c, c->GetAttr("use_sum_inside_sqrt", &optimizer_.adam.use_sum_inside_sqrt));
    } else if (kOpt == Opt::kFtrl) {
      OP_REQUIRES_OK(c, c->GetAttr("multiply_linear_by_learning_rate",
                                   &optimizer_.ftrl.multiply_linear_by_lr));
      OP_REQUIRES_OK(c, c->GetAttr("l1_regularization_strength", &optimizer_.ftrl.l1));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    constexpr StandaloneLayout L = LayoutOf<kOpt>();
    constexpr int kSlots = kOpt == Opt::kSgd ? 0 : kOpt == Opt::kAdagrad ? 1 : 2;
    const Tensor& indices = ctx->input(L.indices);
    const Tensor& grads = ctx->input(L.gradient);
    const Tensor& table = ctx->input(L.table);
    OP_REQUIRES_OK(ctx, CheckRank(op_, "indices", indices, 1));
    OP_REQUIRES_OK(ctx, CheckRank(op_, "embedding_table", table, 2));
    OP_REQUIRES_OK(ctx, CheckRank(op_, "gradient", grads, 2));
    const int64_t n = indices.NumElements(), rows = table.dim_size(0);
    OP_REQUIRES(ctx, table.dim_size(1) == width_ && grads.dim_size(1) == width_ &&
                         grads.dim_size(0) == n,
                Invalid(op_, absl::StrCat("gradient ", grads.shape().DebugString(),
                                          " and embedding_table ", table.shape().DebugString(),
                                          " must be [", n, ", feature_width = ", width_,
                                          "] and [rows, ", width_, "]")));
    for (int k = 0; k < kSlots; ++k) {
      OP_REQUIRES_OK(ctx, CheckSameShape(op_, "a slot variable", ctx->input(L.slots[k]), table));
    }
    float lr;
    OP_REQUIRES_OK(ctx, ScalarValue(op_, "learning_rate", ctx->input(L.learning_rate), &lr));
    SparseCoreOptimizer optimizer = optimizer_;
    if (kOpt == Opt::kAdagradMomentum) {
      OP_REQUIRES_OK(ctx, ScalarValue(op_, "beta_1", ctx->input(3), &optimizer.momentum.momentum));
      OP_REQUIRES_OK(ctx, ScalarValue(op_, "epsilon", ctx->input(4), &optimizer.momentum.epsilon));
    } else if (kOpt == Opt::kAdam) {
      OP_REQUIRES_OK(ctx, ScalarValue(op_, "beta_1", ctx->input(6), &optimizer.adam.beta1));
      OP_REQUIRES_OK(ctx, ScalarValue(op_, "beta_2", ctx->input(7), &optimizer.adam.beta2));
      OP_REQUIRES_OK(ctx, ScalarValue(op_, "epsilon", ctx->input(8), &optimizer.adam.epsilon));
    } else if (kOpt == Opt::kFtrl) {
      OP_REQUIRES_OK(ctx, ScalarValue(op_, "beta", ctx->input(6), &optimizer.ftrl.beta));
      OP_REQUIRES_OK(ctx, ScalarValue(op_, "learning_rate_power", ctx->input(7),
                                      &optimizer.ftrl.lr_power));
      OP_REQUIRES_OK(ctx, ScalarValue(op_, "l2_regularization_strength", ctx->input(8),
                                      &optimizer.ftrl.l2));
    }
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
  sc_util::RegisterBoth<StandaloneOp<Opt::kSgd>>("XlaSparseCoreSgd");
  sc_util::RegisterBoth<StandaloneOp<Opt::kAdagrad>>("XlaSparseCoreAdagrad");
  sc_util::RegisterBoth<StandaloneOp<Opt::kAdagradMomentum>>("XlaSparseCoreAdagradMomentum");
  sc_util::RegisterBoth<StandaloneOp<Opt::kAdam>>("XlaSparseCoreAdam");
  sc_util::RegisterBoth<StandaloneOp<Opt::kFtrl>>("XlaSparseCoreFtrl");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
