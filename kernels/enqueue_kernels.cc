// The enqueue family: each kernel reads its op's attributes once, and per
// call its mode, replica and input lists; the engine's input mapper of its
// format (engine/input_mappers.h) validates the inputs and builds the batch,
// which goes on the replica's queue.  A failed enqueue changes nothing.
// The sharded data path's enqueue (engine/routing.h): the worker's
// RouteTPUEmbeddingArbitraryTensorBatch (map, split per host, pack) and the
// hosts' EnqueueTPUEmbeddingRoutedBatch.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/input_mappers.h"
#include "engine/routed_mapper.h"
#include "engine/routing.h"
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

// The batch's mode from the scalar string `mode_override`.
absl::Status ParseMode(const std::string& op, OpKernelContext* ctx, const Engine& e,
                       bool* training) {
  const Tensor* mode;
  TF_RETURN_IF_ERROR(ctx->input("mode_override", &mode));
  if (mode->NumElements() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": mode_override must be a scalar string, got shape ", mode->shape().DebugString()));
  }
  const std::string m(mode->flat<::tensorflow::tstring>()(0));
  if (m == "train") {
    *training = true;
  } else if (m == "inference") {
    *training = false;
  } else if (m == "unspecified") {
    *training = e.training_by_default();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": Unsupported value ", m,
                     " specified for mode_override. "
                     "Use \"train\", \"inference\" or \"unspecified\"."));
  }
  return absl::OkStatus();
}

absl::Status InputList(OpKernelContext* ctx, const char* name, std::vector<const Tensor*>* out) {
  OpInputList list;
  TF_RETURN_IF_ERROR(ctx->input_list(name, &list));
  out->resize(list.size());
  for (int i = 0; i < list.size(); ++i) (*out)[i] = &list[i];
  return absl::OkStatus();
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
      case Format::kInteger: mapper_ = InputMapper::IntegerBatch(op_); break;
      case Format::kSparse: mapper_ = InputMapper::SparseBatch(op_, std::move(combiners)); break;
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
  static absl::Status Inputs(OpKernelContext* ctx, EnqueueInputs* in) {
    if (kFormat == Format::kInteger) return InputList(ctx, "batch", &in->ids);
    TF_RETURN_IF_ERROR(InputList(ctx, SplitsInput(kFormat), &in->splits));
    TF_RETURN_IF_ERROR(InputList(ctx, "embedding_indices", &in->ids));
    return InputList(ctx, "aggregation_weights", &in->weights);
  }

  // The batch's mode (mode_override) and the replica it is for
  // (device_ordinal; -1: the replica of the kernel's device).
  absl::Status Common(OpKernelContext* ctx, const Engine& e, int* replica, bool* training) {
    TF_RETURN_IF_ERROR(ParseMode(op_, ctx, e, training));
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
    return ServedReplica(ctx, op_, e, ordinal, replica);
  }

  const std::string op_;
  int device_ordinal_ = -1;
  std::unique_ptr<InputMapper> mapper_;
};

// RouteTPUEmbeddingArbitraryTensorBatch: on the worker, one replica's
// ArbitraryTensorBatch inputs mapped as one engine maps them (every check,
// against the whole tables), split per host and packed (one uint8 tensor per
// host, engine/routing.h); the routed batch waits in the worker's router
// for the hosts' activations.  A refused batch reaches no host.
class RouteOp : public OpKernel {
 public:
  explicit RouteOp(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {
    std::vector<std::string> names;
    std::vector<Combiner> combiners;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("combiners", &names));
    OP_REQUIRES_OK(ctx, ParseCombiners(op_, names, &combiners));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("config", &config_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("router", &router_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("device_ordinal", &replica_));
    std::string form;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("form", &form));
    OP_REQUIRES_OK(ctx, ParseRouteChoice(form, &choice_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("session", &session_));
    host_filter_ = choice_ == RouteChoice::kHostFilter;
    mapper_ = InputMapper::ArbitraryTensorBatch(op_, std::move(combiners));
  }

  void Compute(OpKernelContext* ctx) override {
    std::shared_ptr<Router> router;
    OP_REQUIRES_OK(ctx, Router::Get(router_, config_, &router));
    const Engine& e = router->engine();
    OP_REQUIRES(ctx, ctx->num_outputs() == router->num_hosts() + 2,
                absl::InvalidArgumentError(
                    absl::StrCat(op_, ": num_hosts is ", ctx->num_outputs() - 2,
                                 " but the config has ", router->num_hosts())));
    OP_REQUIRES_OK(ctx, ReplicaInRange(op_, replica_, e));
    Batch batch;
    OP_REQUIRES_OK(ctx, ParseMode(op_, ctx, e, &batch.training));
    EnqueueInputs in;
    OP_REQUIRES_OK(ctx, InputList(ctx, "sample_indices_or_row_splits", &in.splits));
    OP_REQUIRES_OK(ctx, InputList(ctx, "embedding_indices", &in.ids));
    OP_REQUIRES_OK(ctx, InputList(ctx, "aggregation_weights", &in.weights));
    OP_REQUIRES_OK(ctx, mapper_->Map(e, in, CpuPool(ctx), &batch));
    auto plan = std::make_unique<RoutePlan>();
    OP_REQUIRES_OK(ctx, router->Plan(std::move(batch), choice_, CpuPool(ctx), plan.get()));
    plan->session = static_cast<uint64_t>(session_);
    const int hosts = router->num_hosts();
    std::vector<char*> out(hosts);
    Tensor* shared = nullptr;
    for (int k = 0; k < hosts; ++k) {
      if (host_filter_ && shared != nullptr) {  // one batch for every host
        ctx->set_output(k, *shared);
        continue;
      }
      Tensor* t;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(k, TensorShape({plan->host_bytes[k]}), &t));
      out[k] = reinterpret_cast<char*>(t->flat<uint8_t>().data());
      shared = t;
    }
    Tensor* floats;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(hosts, TensorShape({hosts}), &floats));
    for (int k = 0; k < hosts; ++k) floats->flat<int64_t>()(k) = plan->host_floats[k];
    Tensor* sequence;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(hosts + 1, TensorShape({}), &sequence));
    sequence->scalar<int64_t>()() = plan->sequence;
    OP_REQUIRES_OK(ctx, router->Pack(*plan, out, CpuPool(ctx)));
    OP_REQUIRES_OK(ctx, router->Push(replica_, std::move(plan)));
  }

 private:
  const std::string op_;
  std::string config_, router_;
  int replica_ = 0;
  RouteChoice choice_ = RouteChoice::kAuto;
  int64_t session_ = 0;  // the hosts' session, stamped on every packet
  bool host_filter_ = false;
  std::unique_ptr<InputMapper> mapper_;
};

// EnqueueTPUEmbeddingRoutedBatch: a host's part of a routed batch (the
// packed tensor RouteTPUEmbeddingArbitraryTensorBatch made for it), checked
// whole against this host's engine (integrity, session, layout, contents;
// engine/routing.h "Packet integrity"), then queued like any batch unless
// its sequence was taken already (a replay).
class EnqueueRoutedOp : public OpKernel {
 public:
  explicit EnqueueRoutedOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), op_(BareOpName(ctx)), mapper_(RoutedBatchMapper(op_)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("device_ordinal", &device_ordinal_));
  }

  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    int replica = 0;
    OP_REQUIRES_OK(ctx, engine.AcquireForReplica(ctx, op_, &replica, device_ordinal_));
    OP_REQUIRES_OK(ctx, EnqueueRoutedBatch(*mapper_, op_, &*engine, replica, ctx->input(0),
                                           CpuPool(ctx)));
  }

 private:
  const std::string op_;
  std::unique_ptr<InputMapper> mapper_;
  int device_ordinal_ = -1;
};

bool RegisterKernels() {
  RegisterCpuKernel<RouteOp>("RouteTPUEmbeddingArbitraryTensorBatch", /*core=*/false);
  RegisterCpuKernel<EnqueueRoutedOp>("EnqueueTPUEmbeddingRoutedBatch", /*core=*/false);
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
