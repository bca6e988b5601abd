// EmbeddingBag / EmbeddingBagGrad: the fused, multi-threaded lookup behind
// tf_tpu_emb.TPUEmbeddingV0 (see ops/tpu_embedding_ops.cc for the contract).
#include <string>

#include "absl/strings/str_cat.h"
#include "core/bag.h"
#include "kernels/guard.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

template <typename Id, typename Split>
class EmbeddingBagOpBase : public OpKernel {
 public:
  explicit EmbeddingBagOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string combiner;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiner", &combiner));
    combiner_ = combiner == "sum"     ? Combiner::kSum
                : combiner == "sqrtn" ? Combiner::kSqrtn
                                      : Combiner::kMean;
  }

 protected:
  // Checks row splits, ids (against `vocab` when >= 0) and weights.
  absl::Status Validate(const Tensor& splits, const Tensor& ids, const Tensor& weights,
                        int64_t vocab) const {
    const auto s = splits.flat<Split>();
    const auto id = ids.flat<Id>();
    const int64_t n = ids.NumElements();
    if (s.size() < 1 || s(0) != 0 || s(s.size() - 1) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "EmbeddingBag: row_splits must start at 0 and end at the number of ids (", n, ")"));
    }
    for (int64_t b = 0; b + 1 < s.size(); ++b) {
      if (s(b + 1) < s(b)) {
        return absl::InvalidArgumentError(
            absl::StrCat("EmbeddingBag: row_splits must be non-decreasing; split ", b + 1, " is ",
                         s(b + 1), " after ", s(b)));
      }
    }
    if (weights.NumElements() != 0 && weights.NumElements() != n) {
      return absl::InvalidArgumentError(absl::StrCat("EmbeddingBag: weights has ",
                                                     weights.NumElements(),
                                                     " elements but there are ", n,
                                                     " ids (weights must be empty or one per id)"));
    }
    if (vocab >= 0) {
      for (int64_t k = 0; k < n; ++k) {
        if (id(k) < 0 || id(k) >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat("EmbeddingBag: id ", id(k), " at index ",
                                                         k, " is outside the table [0, ", vocab,
                                                         ")"));
        }
      }
    }
    return absl::OkStatus();
  }

  // Runs fn(bag) for every bag on the intra-op pool.
  template <typename Fn>
  void ForEachBag(OpKernelContext* ctx, int64_t bags, int64_t ids, int dim, Fn fn) const {
    const int64_t cost = (1 + ids / std::max<int64_t>(bags, 1)) * dim * 4;
    ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
        bags, cost, [&](int64_t begin, int64_t end) {
          for (int64_t b = begin; b < end; ++b) fn(b);
        });
  }

  Combiner combiner_;
};

template <typename Id, typename Split>
class EmbeddingBagOp : public EmbeddingBagOpBase<Id, Split> {
 public:
  using EmbeddingBagOpBase<Id, Split>::EmbeddingBagOpBase;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& params = ctx->input(0);
    const Tensor &splits = ctx->input(1), &ids = ctx->input(2), &weights = ctx->input(3);
    OP_REQUIRES(ctx, params.dims() == 2,
                absl::InvalidArgumentError("EmbeddingBag: params must be a matrix"));
    OP_REQUIRES_OK(ctx, this->Validate(splits, ids, weights, params.dim_size(0)));
    const int64_t bags = splits.NumElements() - 1;
    const int dim = params.dim_size(1);
    Tensor* out;
    TensorShape shape;  // status-returning: bags x dim may overflow
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape({bags, int64_t{dim}}, &shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    const float* base = params.flat<float>().data();
    const Split* s = splits.flat<Split>().data();
    const Id* id = ids.flat<Id>().data();
    const float* w = weights.NumElements() ? weights.flat<float>().data() : nullptr;
    float* o = out->flat<float>().data();
    auto identity = [](float x) { return x; };
    this->ForEachBag(ctx, bags, ids.NumElements(), dim, [&](int64_t b) {
      const int64_t lo = s[b], n = s[b + 1] - s[b];
      if (w) ReduceBag<true>(base, dim, id + lo, w + lo, n, this->combiner_, o + b * dim, identity);
      else ReduceBag<false>(base, dim, id + lo, w, n, this->combiner_, o + b * dim, identity);
    });
  }
};

template <typename Id, typename Split>
class EmbeddingBagGradOp : public EmbeddingBagOpBase<Id, Split> {
 public:
  using EmbeddingBagOpBase<Id, Split>::EmbeddingBagOpBase;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& grad = ctx->input(0);
    const Tensor &splits = ctx->input(1), &ids = ctx->input(2), &weights = ctx->input(3);
    OP_REQUIRES_OK(ctx, this->Validate(splits, ids, weights, /*vocab=*/-1));
    const int64_t bags = splits.NumElements() - 1;
    OP_REQUIRES(ctx, grad.dims() == 2 && grad.dim_size(0) == bags,
                absl::InvalidArgumentError(absl::StrCat("EmbeddingBagGrad: grad must be [", bags,
                                                        ", dim], got ",
                                                        grad.shape().DebugString())));
    const int dim = grad.dim_size(1);
    Tensor* out;
    TensorShape shape;
    OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape({ids.NumElements(), int64_t{dim}}, &shape));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, shape, &out));
    const float* g = grad.flat<float>().data();
    const Split* s = splits.flat<Split>().data();
    const float* w = weights.NumElements() ? weights.flat<float>().data() : nullptr;
    float* o = out->flat<float>().data();
    this->ForEachBag(ctx, bags, ids.NumElements(), dim, [&](int64_t b) {
      const int64_t lo = s[b], hi = s[b + 1];
      const float scale = BagScale(this->combiner_, w ? w + lo : nullptr, hi - lo);
      for (int64_t k = lo; k < hi; ++k) {
        const float c = (w ? w[k] : 1.0f) * scale;
        for (int d = 0; d < dim; ++d) o[k * dim + d] = c * g[b * dim + d];
      }
    });
  }
};

#define TTE_REGISTER_BAG(Id, Split)                              \
  REGISTER_KERNEL_BUILDER(Name("TfTpuEmb>EmbeddingBag")          \
                              .Device(::tensorflow::DEVICE_CPU)  \
                              .TypeConstraint<Id>("Tids")        \
                              .TypeConstraint<Split>("Tsplits"), \
                          Guarded<EmbeddingBagOp<Id, Split>>);   \
  REGISTER_KERNEL_BUILDER(Name("TfTpuEmb>EmbeddingBagGrad")      \
                              .Device(::tensorflow::DEVICE_CPU)  \
                              .TypeConstraint<Id>("Tids")        \
                              .TypeConstraint<Split>("Tsplits"), \
                          Guarded<EmbeddingBagGradOp<Id, Split>>)

TTE_REGISTER_BAG(int32_t, int32_t);
TTE_REGISTER_BAG(int32_t, int64_t);
TTE_REGISTER_BAG(int64_t, int32_t);
TTE_REGISTER_BAG(int64_t, int64_t);

}  // namespace
}  // namespace tf_tpu_emb
