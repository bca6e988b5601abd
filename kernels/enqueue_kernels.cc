// The enqueue family: each kernel reads its op's attributes once, and per
// call its mode, replica and input lists; the engine's input mapper of its
// format (engine/input_mappers.h) validates the inputs and builds the batch,
// which goes on the replica's queue.  A failed enqueue changes nothing.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/input_mappers.h"
#include "kernels/registration.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace {

// The formats; each names its first input list (indices or splits).
enum class Format { kInteger, kSparse, kArbitrary, kSparseTensor, kRaggedTensor };

const char* SplitsInput(Format f) {
  switch (f) {
    case Format::kSparse: return "sample_indices";
    case Format::kArbitrary: return "sample_indices_or_row_splits";
    case Format::kSparseTensor: return "sample_indices";
    case Format::kRaggedTensor: return "sample_splits";
    case Format::kInteger: break;
  }
  return nullptr;
}

template <Format kFormat, bool kDynamic>
class EnqueueOp : public OpKernel {
 public:
  explicit EnqueueOp(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {
    if (!kDynamic) OP_REQUIRES_OK(ctx, ctx->GetAttr("device_ordinal", &device_ordinal_));
    std::vector<Combiner> combiners;
    if (kFormat != Format::kInteger) {
      std::vector<std::string> names;
      OP_REQUIRES_OK(ctx, ctx->GetAttr("combiners", &names));
      OP_REQUIRES_OK(ctx, ParseCombiners(op_, names, &combiners));
    }
    switch (kFormat) {
      case Format::kInteger:
        mapper_ = InputMapper::IntegerBatch(op_);
        break;
      case Format::kSparse:
        mapper_ = InputMapper::SparseBatch(op_, std::move(combiners));
        break;
      case Format::kArbitrary:
        mapper_ = InputMapper::ArbitraryTensorBatch(op_, std::move(combiners));
        break;
      case Format::kSparseTensor:
      case Format::kRaggedTensor: {
        FeatureAttrs attrs;
        OP_REQUIRES_OK(ctx, ctx->GetAttr("table_ids", &attrs.table_ids));
        OP_REQUIRES_OK(ctx, ctx->GetAttr("max_sequence_lengths", &attrs.max_sequence_lengths));
        OP_REQUIRES_OK(ctx, ctx->GetAttr("num_features", &attrs.num_features));
        mapper_ = InputMapper::FeatureBatch(op_, std::move(combiners), std::move(attrs),
                                            kFormat == Format::kRaggedTensor);
        break;
      }
    }
  }

  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(ctx, op_));
    Batch batch;
    int replica = 0;  // set by Common (initialised: g++ warns under TF 2.16 headers)
    OP_REQUIRES_OK(ctx, Common(ctx, *engine, &replica, &batch.training));
    EnqueueInputs in;
    OP_REQUIRES_OK(ctx, Inputs(ctx, &in));
    OP_REQUIRES_OK(ctx, mapper_->Map(*engine, in, CpuPool(ctx), &batch));
    engine->Enqueue(replica, std::move(batch));
  }

 private:
  static absl::Status List(OpKernelContext* ctx, const char* name,
                           std::vector<const Tensor*>* out) {
    OpInputList list;
    TF_RETURN_IF_ERROR(ctx->input_list(name, &list));
    out->resize(list.size());
    for (int i = 0; i < list.size(); ++i) (*out)[i] = &list[i];
    return absl::OkStatus();
  }

  static absl::Status Inputs(OpKernelContext* ctx, EnqueueInputs* in) {
    if (kFormat == Format::kInteger) return List(ctx, "batch", &in->ids);
    TF_RETURN_IF_ERROR(List(ctx, SplitsInput(kFormat), &in->splits));
    TF_RETURN_IF_ERROR(List(ctx, "embedding_indices", &in->ids));
    return List(ctx, "aggregation_weights", &in->weights);
  }

  // The batch's mode (mode_override) and the replica it is for
  // (device_ordinal; -1: the replica of the kernel's device).
  absl::Status Common(OpKernelContext* ctx, const Engine& e, int* replica, bool* training) {
    const Tensor* mode;
    TF_RETURN_IF_ERROR(ctx->input("mode_override", &mode));
    if (mode->NumElements() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": mode_override must be a scalar string, got shape ", mode->shape().DebugString()));
    }
    const std::string m(mode->flat<::tensorflow::tstring>()(0));
    if (m == "train") {
      *training = true;
    } else if (m == "inference") {
      *training = false;
    } else if (m == "unspecified") {
      *training = e.training_by_default();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": Unsupported value ", m, " specified for mode_override. "
          "Use \"train\", \"inference\" or \"unspecified\"."));
    }
    int64_t ordinal = device_ordinal_;
    if (kDynamic) {
      const Tensor* t;
      TF_RETURN_IF_ERROR(ctx->input("device_ordinal", &t));
      if (t->NumElements() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": device_ordinal must be a scalar, got shape ", t->shape().DebugString()));
      }
      ordinal = t->flat<int32_t>()(0);
    }
    *replica = ordinal < 0 ? DeviceReplica(ctx) : static_cast<int>(ordinal);
    return ReplicaInRange(op_, *replica, e);
  }

  const std::string op_;
  int device_ordinal_ = -1;
  std::unique_ptr<InputMapper> mapper_;
};

bool RegisterKernels() {
  RegisterCpuKernel<EnqueueOp<Format::kInteger, false>>("EnqueueTPUEmbeddingIntegerBatch");
  RegisterCpuKernel<EnqueueOp<Format::kSparse, false>>("EnqueueTPUEmbeddingSparseBatch");
  RegisterCpuKernel<EnqueueOp<Format::kSparseTensor, false>>(
      "EnqueueTPUEmbeddingSparseTensorBatch");
  RegisterCpuKernel<EnqueueOp<Format::kRaggedTensor, false>>(
      "EnqueueTPUEmbeddingRaggedTensorBatch");
  RegisterCpuKernel<EnqueueOp<Format::kRaggedTensor, true>>(
      "DynamicEnqueueTPUEmbeddingRaggedTensorBatch");
  RegisterCpuKernel<EnqueueOp<Format::kArbitrary, false>>(
      "EnqueueTPUEmbeddingArbitraryTensorBatch");
  RegisterCpuKernel<EnqueueOp<Format::kArbitrary, true>>(
      "DynamicEnqueueTPUEmbeddingArbitraryTensorBatch");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
