// The data path: RecvTPUEmbeddingActivations (wait for the previous step,
// pop this replica's batch, the fused lookup) and SendTPUEmbeddingGradients
// (validate the gradients and learning rates, hand them to the step).
#include <cmath>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "kernels/registration.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace {

class RecvOp : public OpKernel {
 public:
  explicit RecvOp(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {
    std::string bytes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("config", &bytes));
    TPUEmbeddingConfiguration config;
    OP_REQUIRES_OK(ctx, ParseConfig(bytes, &config));
    OP_REQUIRES_OK(ctx, ComputeOutputShapes(config, &shapes_));
  }

  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(op_));
    const auto& outs = engine->outputs();
    OP_REQUIRES(ctx, ctx->num_outputs() == static_cast<int>(outs.size()) &&
                         shapes_.size() == outs.size(),
                absl::InvalidArgumentError(absl::StrCat(
                    op_, ": num_outputs is ", ctx->num_outputs(), " and the op's config has ",
                    shapes_.size(), " outputs, but the configured engine has ", outs.size())));
    for (size_t o = 0; o < outs.size(); ++o) {
      TensorShape attr_shape;
      OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(shapes_[o], &attr_shape));
      OP_REQUIRES(ctx, attr_shape == outs[o].recv_shape,
                  absl::InvalidArgumentError(absl::StrCat(
                      op_, ": output ", o, " has shape ", attr_shape.DebugString(),
                      " in the op's config but ", outs[o].recv_shape.DebugString(),
                      " in the configured engine's config")));
    }
    const int replica = DeviceReplica(ctx);
    OP_REQUIRES_OK(ctx, ReplicaInRange(op_, replica, *engine));
    // Outputs first: a failed allocation must not lose the queued batch.
    std::vector<float*> out(outs.size());
    for (size_t o = 0; o < outs.size(); ++o) {
      Tensor* t;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(o, outs[o].recv_shape, &t));
      out[o] = t->flat<float>().data();
    }
    OP_REQUIRES_OK(ctx, engine->WaitForStep(replica));
    Batch batch;
    OP_REQUIRES_OK(ctx, engine->Dequeue(replica, &batch));
    {
      std::shared_lock<std::shared_mutex> lock(engine->tables_mutex());
      engine->Lookup(batch, out, CpuPool(ctx));
    }
    engine->SetInFlight(replica, std::move(batch));
  }

 private:
  const std::string op_;
  std::vector<TensorShapeProto> shapes_;
};

// SendTPUEmbeddingGradients: gradients for the replica's in-flight training
// batch (one per Recv output, same shapes) and the dynamic learning rates
// (one scalar per tag).  Everything is validated before the engine sees it;
// with several replicas an invalid Send fails the whole step.
class SendOp : public OpKernel {
 public:
  explicit SendOp(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {}

  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(op_));
    const int replica = DeviceReplica(ctx);
    OP_REQUIRES_OK(ctx, ReplicaInRange(op_, replica, *engine));
    std::vector<Tensor> gradients;
    std::vector<float> rates;
    const absl::Status status = Validate(ctx, *engine, &gradients, &rates);
    if (!status.ok()) {
      engine->AbortStep(std::string(status.message()));
      ctx->SetStatus(status);
      return;
    }
    OP_REQUIRES_OK(ctx, engine->Submit(replica, std::move(gradients), rates, CpuPool(ctx)));
  }

 private:
  absl::Status Validate(OpKernelContext* ctx, Engine& e, std::vector<Tensor>* gradients,
                        std::vector<float>* rates) const {
    OpInputList inputs, learning_rates;
    TF_RETURN_IF_ERROR(ctx->input_list("inputs", &inputs));
    TF_RETURN_IF_ERROR(ctx->input_list("learning_rates", &learning_rates));
    const auto& outs = e.outputs();
    if (inputs.size() != static_cast<int>(outs.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": got ", inputs.size(), " gradients but Recv produces ", outs.size(),
          " outputs"));
    }
    if (learning_rates.size() != e.num_dynamic_inputs()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": got ", learning_rates.size(), " learning rates but the config has ",
          e.num_dynamic_inputs(), " dynamic learning rate tag(s)"));
    }
    for (int i = 0; i < learning_rates.size(); ++i) {
      if (learning_rates[i].NumElements() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": learning_rates[", i, "] must be a scalar, got shape ",
            learning_rates[i].shape().DebugString()));
      }
      rates->push_back(learning_rates[i].flat<float>()(0));
      if (e.check_numerics() && !std::isfinite(rates->back())) {
        return absl::InvalidArgumentError(
            absl::StrCat(op_, ": learning_rates[", i, "] is not finite"));
      }
    }
    if (const int t = e.table_without_learning_rate(); t >= 0) {  // found at configure
      return absl::FailedPreconditionError(absl::StrCat(
          op_, ": table '", e.table(t).name,
          "' has no learning_rate in its optimization_parameters"));
    }
    for (size_t o = 0; o < outs.size(); ++o) {
      const int t = outs[o].table;
      const TensorShape& expected = outs[o].recv_shape;
      auto who = [&] {  // built only for an error
        return absl::StrCat(
            op_, ": gradient ", o, " (",
            e.table_mode() ? ""
                           : absl::StrCat("feature '", e.config().feature_descriptor(o).name(), "', "),
            "table '", e.table(t).name, "')");
      };
      if (inputs[o].shape() != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            who(), " has shape ", inputs[o].shape().DebugString(), " but Recv's output is ",
            expected.DebugString()));
      }
      if (e.check_numerics()) {
        const float* g = inputs[o].flat<float>().data();
        for (int64_t k = 0; k < inputs[o].NumElements(); ++k) {
          if (!std::isfinite(g[k])) {
            return absl::InvalidArgumentError(absl::StrCat(
                who(), " has a non-finite value at flat index ", k));
          }
        }
      }
      gradients->push_back(inputs[o]);
    }
    return absl::OkStatus();
  }

  const std::string op_;
};

bool RegisterKernels() {
  RegisterCpuKernel<RecvOp>("RecvTPUEmbeddingActivations");
  RegisterCpuKernel<SendOp>("SendTPUEmbeddingGradients");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
