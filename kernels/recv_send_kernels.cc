// The data path: RecvTPUEmbeddingActivations (asynchronous: wait for this
// replica's batch and the previous step, then the fused lookup) and SendTPUEmbeddingGradients
// (validate the gradients and learning rates, hand them to the step).
#include <cmath>
#include <functional>
#include <memory>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/exceptions.h"
#include "kernels/registration.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace {

// An AsyncOpKernel: when its replica's batch is not there yet (or the
// previous step is not applied) it leaves a waiter with the engine and
// returns its thread; the enqueue (or the step's last Send) that makes it
// ready resumes it, on the executor's runner, never inline in the enqueuing
// kernel.  It guards each of its phases itself (kernels/guard.h): `done`
// runs exactly once.
class RecvOp : public AsyncOpKernel {
 public:
  explicit RecvOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx), op_(BareOpName(ctx)) {
    std::string bytes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("config", &bytes));
    TPUEmbeddingConfiguration config;
    OP_REQUIRES_OK(ctx, ParseConfig(bytes, &config));
    OP_REQUIRES_OK(ctx, ComputeOutputShapes(config, &shapes_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto call = std::make_shared<Call>();
    absl::Status status;
    bool now = true;
    Batch batch;
    const absl::Status thrown = CatchExceptions(op_, [&] {
      status = Prepare(ctx, call.get());
      if (!status.ok()) return;
      std::function<void(std::function<void()>)> runner;
      if (ctx->runner() != nullptr) runner = *ctx->runner();
      now = call->engine->Recv(
          call->replica, &status, &batch,
          [this, ctx, done, call, runner](absl::Status s, Batch b) {
            call->batch = std::move(b);
            auto resume = [this, ctx, done, call, s] {
              Finish(ctx, call.get(), s);
              done();
            };
            if (runner) {
              runner(std::move(resume));
            } else {
              resume();
            }
          });
    });
    if (!now) return;  // `later` owns done
    if (!thrown.ok()) status = thrown;
    call->batch = std::move(batch);
    Finish(ctx, call.get(), status);
    done();
  }

 private:
  struct Call {
    EngineRef engine;
    int replica = 0;
    std::vector<float*> out;
    Batch batch;
  };

  // Engine, replica, the config's agreement with the op's, the outputs
  // (allocated before the wait: a failed allocation must not lose a batch).
  absl::Status Prepare(OpKernelContext* ctx, Call* call) const {
    TF_RETURN_IF_ERROR(call->engine.Acquire(ctx, op_));
    const Engine& engine = *call->engine;
    const auto& outs = engine.outputs();
    if (ctx->num_outputs() != static_cast<int>(outs.size()) || shapes_.size() != outs.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": num_outputs is ", ctx->num_outputs(), " and the op's config has ",
          shapes_.size(), " outputs, but the configured engine has ", outs.size()));
    }
    for (size_t o = 0; o < outs.size(); ++o) {
      TensorShape attr_shape;
      TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape(shapes_[o], &attr_shape));
      if (attr_shape != outs[o].recv_shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": output ", o, " has shape ", attr_shape.DebugString(),
            " in the op's config but ", outs[o].recv_shape.DebugString(),
            " in the configured engine's config"));
      }
    }
    call->replica = DeviceReplica(ctx);
    TF_RETURN_IF_ERROR(ReplicaInRange(op_, call->replica, engine));
    call->out.resize(outs.size());
    for (size_t o = 0; o < outs.size(); ++o) {
      Tensor* t;
      TF_RETURN_IF_ERROR(ctx->allocate_output(o, outs[o].recv_shape, &t));
      call->out[o] = t->flat<float>().data();
    }
    return absl::OkStatus();
  }

  // The lookup of the batch the wait produced (or the wait's error).
  void Finish(OpKernelContext* ctx, Call* call, absl::Status status) const {
    if (status.ok()) {
      status = CatchExceptions(op_, [&] {
        Engine& engine = *call->engine;
        {
          std::shared_lock<std::shared_mutex> lock(engine.tables_mutex());
          engine.Lookup(call->batch, call->out, CpuPool(ctx));
        }
        engine.SetInFlight(call->replica, std::move(call->batch));
      });
    }
    if (!status.ok()) ctx->SetStatus(status);
  }

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
    OP_REQUIRES_OK(ctx, engine.Acquire(ctx, op_));
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

// AssertTPUEmbeddingEnqueued: FailedPrecondition unless a Recv on this
// device's replica has a batch (or an aborted step's error) to take.
class AssertEnqueuedOp : public OpKernel {
 public:
  explicit AssertEnqueuedOp(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("operation", &operation_));
  }

  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(ctx, op_));
    const int replica = DeviceReplica(ctx);
    OP_REQUIRES_OK(ctx, ReplicaInRange(op_, replica, *engine));
    OP_REQUIRES(ctx, engine->HasPendingBatch(replica),
                absl::FailedPreconditionError(absl::StrCat(
                    operation_, " on replica ", replica,
                    ": nothing is enqueued for this replica, so it would wait for a batch "
                    "that never comes. Enqueue the step's ids first (enqueue() before "
                    "dequeue(), as TF's TPU embedding requires).")));
  }

 private:
  const std::string op_;
  std::string operation_;
};

bool RegisterKernels() {
  RegisterCpuKernel<AssertEnqueuedOp>("AssertTPUEmbeddingEnqueued", /*core=*/false);
  RegisterCpuKernel<RecvOp>("RecvTPUEmbeddingActivations");
  RegisterCpuKernel<SendOp>("SendTPUEmbeddingGradients");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
