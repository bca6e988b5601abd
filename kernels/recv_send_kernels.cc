// The data path: RecvTPUEmbeddingActivations (asynchronous: wait for this
// replica's batch and the previous step, then the fused lookup) and SendTPUEmbeddingGradients
// (validate the gradients and learning rates, hand them to the step).
// The sharded data path's (engine/routing.h): the hosts' Recv/Send of routed
// batches (one float vector each way) and the worker's Combine (hosts' Recv
// outputs -> the replica's activations) and Split (activation gradients ->
// one vector per host).
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
#include "engine/routing.h"
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
// runs exactly once.  kRouted (RecvTPUEmbeddingRoutedActivations, a host's
// part of a routed batch): one float vector, per output the batch's bags x
// dim, then the batch's sequence; allocated once the batch is known.
template <bool kRouted>
class RecvOp : public AsyncOpKernel {
 public:
  explicit RecvOp(OpKernelConstruction* ctx) : AsyncOpKernel(ctx), op_(BareOpName(ctx)) {
    if (kRouted) return;
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
      now = call->engine->Recv(call->replica, &status, &batch,
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
    TF_RETURN_IF_ERROR(call->engine.AcquireForReplica(ctx, op_, &call->replica));
    const Engine& engine = *call->engine;
    if (kRouted) return absl::OkStatus();
    const auto& outs = engine.outputs();
    if (ctx->num_outputs() != static_cast<int>(outs.size()) || shapes_.size() != outs.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_, ": num_outputs is ", ctx->num_outputs(), " and the op's config has ",
                       shapes_.size(), " outputs, but the configured engine has ", outs.size()));
    }
    for (size_t o = 0; o < outs.size(); ++o) {
      TensorShape attr_shape;
      TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape(shapes_[o], &attr_shape));
      if (attr_shape != outs[o].recv_shape) {
        return absl::InvalidArgumentError(
            absl::StrCat(op_, ": output ", o, " has shape ", attr_shape.DebugString(),
                         " in the op's config but ", outs[o].recv_shape.DebugString(),
                         " in the configured engine's config"));
      }
    }
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
      const absl::Status thrown = CatchExceptions(op_, [&] {
        Engine& engine = *call->engine;
        if (kRouted) {
          status = AllocateRouted(ctx, engine, call);
          if (!status.ok()) return;
        }
        {
          std::shared_lock<std::shared_mutex> lock(engine.tables_mutex());
          engine.Lookup(call->batch, call->out, CpuPool(ctx));
        }
        engine.SetInFlight(call->replica, std::move(call->batch));
      });
      if (!thrown.ok()) status = thrown;  // else the lambda's own status stands
    }
    if (!status.ok()) ctx->SetStatus(status);
  }

  // The routed Recv's output, for the batch the wait produced.
  absl::Status AllocateRouted(OpKernelContext* ctx, const Engine& engine, Call* call) const {
    const Batch& batch = call->batch;
    std::vector<int64_t> at(batch.outputs.size());
    int64_t floats = 0;
    for (size_t o = 0; o < batch.outputs.size(); ++o) {
      at[o] = floats;
      floats += static_cast<int64_t>(batch.outputs[o].offsets.size() - 1) *
                engine.table(engine.outputs()[o].table).dimension;
    }
    Tensor* t;
    TF_RETURN_IF_ERROR(
        ctx->allocate_output(0, TensorShape({floats + packed::kSequenceFloats}), &t));
    float* data = t->flat<float>().data();
    call->out.resize(at.size());
    for (size_t o = 0; o < at.size(); ++o) call->out[o] = data + at[o];
    PutSequence(batch.sequence, data + floats);
    return absl::OkStatus();
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
    int replica = 0;
    OP_REQUIRES_OK(ctx, engine.AcquireForReplica(ctx, op_, &replica));
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
          op_, ": got ", inputs.size(), " gradients but Recv produces ", outs.size(), " outputs"));
    }
    if (learning_rates.size() != e.num_dynamic_inputs()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_, ": got ", learning_rates.size(), " learning rates but the config has ",
                       e.num_dynamic_inputs(), " dynamic learning rate tag(s)"));
    }
    for (int i = 0; i < learning_rates.size(); ++i) {
      if (learning_rates[i].NumElements() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(op_, ": learning_rates[", i,
                                                       "] must be a scalar, got shape ",
                                                       learning_rates[i].shape().DebugString()));
      }
      rates->push_back(learning_rates[i].flat<float>()(0));
      if (e.check_numerics() && !std::isfinite(rates->back())) {
        return absl::InvalidArgumentError(
            absl::StrCat(op_, ": learning_rates[", i, "] is not finite"));
      }
    }
    if (const int t = e.table_without_learning_rate(); t >= 0) {  // found at configure
      return absl::FailedPreconditionError(
          absl::StrCat(op_, ": table '", e.table(t).name,
                       "' has no learning_rate in its optimization_parameters"));
    }
    for (size_t o = 0; o < outs.size(); ++o) {
      const int t = outs[o].table;
      const TensorShape& expected = outs[o].recv_shape;
      auto who = [&] {  // built only for an error
        return absl::StrCat(op_, ": gradient ", o, " (",
                            e.table_mode()
                                ? ""
                                : absl::StrCat("feature '", e.config().feature_descriptor(o).name(),
                                               "', "),
                            "table '", e.table(t).name, "')");
      };
      if (inputs[o].shape() != expected) {
        return absl::InvalidArgumentError(
            absl::StrCat(who(), " has shape ", inputs[o].shape().DebugString(),
                         " but Recv's output is ", expected.DebugString()));
      }
      if (e.check_numerics()) {
        const float* g = inputs[o].flat<float>().data();
        for (int64_t k = 0; k < inputs[o].NumElements(); ++k) {
          if (!std::isfinite(g[k])) {
            return absl::InvalidArgumentError(
                absl::StrCat(who(), " has a non-finite value at flat index ", k));
          }
        }
      }
      gradients->push_back(inputs[o]);
    }
    return absl::OkStatus();
  }

  const std::string op_;
};

// SendTPUEmbeddingRoutedGradients: a host's gradients for its part of the
// in-flight routed batch (what SplitTPUEmbeddingRoutedGradients made for it:
// per output bags x dim floats, the learning rates, the batch's sequence),
// checked whole before the step sees them; an invalid Send fails the step.
class SendRoutedOp : public OpKernel {
 public:
  explicit SendRoutedOp(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("background", &background_));
  }

  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    int replica = 0;
    OP_REQUIRES_OK(ctx, engine.AcquireForReplica(ctx, op_, &replica));
    std::vector<int64_t> floats;
    int64_t sequence = 0;
    OP_REQUIRES_OK(ctx, engine->InFlightGradientFloats(replica, &floats, &sequence));
    std::vector<const float*> grads;
    std::vector<float> rates;
    const absl::Status status = Validate(ctx->input(0), *engine, floats, sequence, &grads, &rates);
    if (!status.ok()) {
      engine->AbortStep(std::string(status.message()));
      ctx->SetStatus(status);
      return;
    }
    // In the background the update runs after this kernel returns (the
    // worker routes the next batch meanwhile); the next Recv and
    // Load/Retrieve wait for it.
    OP_REQUIRES_OK(ctx, engine->Submit(replica, {ctx->input(0)}, std::move(grads), rates,
                                       CpuPool(ctx), background_));
  }

 private:
  absl::Status Validate(const Tensor& in, Engine& e, const std::vector<int64_t>& floats,
                        int64_t sequence, std::vector<const float*>* grads,
                        std::vector<float>* rates) const {
    int64_t total = 0;
    for (int64_t f : floats) total += f;
    const int64_t rate_count = e.num_dynamic_inputs();
    if (in.dims() != 1 || in.NumElements() != total + rate_count + packed::kSequenceFloats) {
      return absl::InvalidArgumentError(absl::StrCat(op_, ": the gradients have shape ",
                                                     in.shape().DebugString(),
                                                     " but the in-flight "
                                                     "routed batch needs [",
                                                     total + rate_count + packed::kSequenceFloats,
                                                     "] (", total, " gradient floats, ", rate_count,
                                                     " learning rate(s), the batch's sequence)"));
    }
    const float* data = in.flat<float>().data();
    const int64_t answered = GetSequence(data + total + rate_count);
    if (answered != sequence) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_, ": the gradients answer routed batch #", answered,
                       " but this host's in-flight batch is #", sequence));
    }
    if (const int t = e.table_without_learning_rate(); t >= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(op_, ": table '", e.table(t).name,
                       "' has no learning_rate in its optimization_parameters"));
    }
    rates->assign(data + total, data + total + rate_count);
    if (e.check_numerics()) {
      for (int64_t k = 0; k < total + rate_count; ++k) {
        if (!std::isfinite(data[k])) {
          return absl::InvalidArgumentError(
              absl::StrCat(op_, k < total ? ": a gradient" : ": a learning rate",
                           " is not finite (flat index ", k, ")"));
        }
      }
    }
    for (int64_t f : floats) {
      grads->push_back(data);
      data += f;
    }
    return absl::OkStatus();
  }

  const std::string op_;
  bool background_ = true;
};

// A worker op of the sharded data path: its router (the `router` and
// `config` attrs) and replica (`device_ordinal`).
class RouterOp : public OpKernel {
 public:
  explicit RouterOp(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("router", &router_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("config", &config_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("device_ordinal", &replica_));
  }

 protected:
  absl::Status Acquire(std::shared_ptr<Router>* router) const {
    TF_RETURN_IF_ERROR(Router::Get(router_, config_, router));
    return ReplicaInRange(op_, replica_, (*router)->engine());
  }

  const std::string op_;
  std::string router_, config_;
  int replica_ = 0;
};

// CombineTPUEmbeddingRoutedActivations: the replica's activations (Recv's
// outputs) from every host's RecvTPUEmbeddingRoutedActivations output, for the
// routed batch the hosts answered (every host must answer the same one).
class CombineOp : public RouterOp {
 public:
  using RouterOp::RouterOp;

  void Compute(OpKernelContext* ctx) override {
    std::shared_ptr<Router> router;
    OP_REQUIRES_OK(ctx, Acquire(&router));
    const Engine& e = router->engine();
    OpInputList host;
    OP_REQUIRES_OK(ctx, ctx->input_list("host_activations", &host));
    const int hosts = router->num_hosts();
    OP_REQUIRES(ctx,
                host.size() == hosts && ctx->num_outputs() == static_cast<int>(e.outputs().size()),
                absl::InvalidArgumentError(
                    absl::StrCat(op_, ": got ", host.size(), " hosts' activations and ",
                                 ctx->num_outputs(), " outputs; the config has ", hosts,
                                 " hosts and ", e.outputs().size(), " outputs")));
    std::vector<int64_t> sequence(hosts);
    for (int k = 0; k < hosts; ++k) {
      OP_REQUIRES(ctx, host[k].dims() == 1 && host[k].NumElements() >= packed::kSequenceFloats,
                  absl::InvalidArgumentError(
                      absl::StrCat(op_, ": host ", k, "'s activations have shape ",
                                   host[k].shape().DebugString(), "; not a routed Recv's output")));
      sequence[k] = GetSequence(host[k].flat<float>().data() + host[k].NumElements() -
                                packed::kSequenceFloats);
      OP_REQUIRES(ctx, sequence[k] == sequence[0],
                  absl::FailedPreconditionError(
                      absl::StrCat(op_, ": the hosts answered different routed batches of replica ",
                                   replica_, " (host 0: #", sequence[0], ", host ", k, ": #",
                                   sequence[k], "): a host lost or gained a batch")));
    }
    std::unique_ptr<RoutePlan> plan;
    OP_REQUIRES_OK(ctx, router->Pop(replica_, sequence[0], &plan));
    std::vector<const float*> in(hosts);
    for (int k = 0; k < hosts; ++k) {
      OP_REQUIRES(ctx, host[k].NumElements() == plan->host_floats[k] + packed::kSequenceFloats,
                  absl::InvalidArgumentError(
                      absl::StrCat(op_, ": host ", k, " returned ", host[k].NumElements(),
                                   " floats for routed "
                                   "batch #",
                                   plan->sequence, ", which needs ",
                                   plan->host_floats[k] + packed::kSequenceFloats)));
      in[k] = host[k].flat<float>().data();
    }
    std::vector<float*> out(e.outputs().size());
    for (size_t o = 0; o < out.size(); ++o) {
      Tensor* t;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(o, e.outputs()[o].recv_shape, &t));
      out[o] = t->flat<float>().data();
    }
    OP_REQUIRES_OK(ctx, router->Combine(*plan, in, out, CpuPool(ctx)));
    router->SetInFlight(replica_, std::move(plan));
  }
};

// SplitTPUEmbeddingRoutedGradients: the replica's activation gradients
// (Recv's shapes) and dynamic learning rates -> one vector per host for its
// SendTPUEmbeddingRoutedGradients, for the routed batch in flight.
class SplitOp : public RouterOp {
 public:
  using RouterOp::RouterOp;

  void Compute(OpKernelContext* ctx) override {
    std::shared_ptr<Router> router;
    OP_REQUIRES_OK(ctx, Acquire(&router));
    const Engine& e = router->engine();
    OpInputList inputs, rates;
    OP_REQUIRES_OK(ctx, ctx->input_list("inputs", &inputs));
    OP_REQUIRES_OK(ctx, ctx->input_list("learning_rates", &rates));
    const auto& outs = e.outputs();
    OP_REQUIRES(ctx, inputs.size() == static_cast<int>(outs.size()),
                absl::InvalidArgumentError(absl::StrCat(op_, ": got ", inputs.size(),
                                                        " gradients but Recv produces ",
                                                        outs.size(), " outputs")));
    OP_REQUIRES(ctx, rates.size() == e.num_dynamic_inputs(),
                absl::InvalidArgumentError(
                    absl::StrCat(op_, ": got ", rates.size(), " learning rates but the config has ",
                                 e.num_dynamic_inputs(), " dynamic learning rate tag(s)")));
    std::vector<const float*> grads;
    for (size_t o = 0; o < outs.size(); ++o) {
      OP_REQUIRES(ctx, inputs[o].shape() == outs[o].recv_shape,
                  absl::InvalidArgumentError(absl::StrCat(
                      op_, ": gradient ", o, " (",
                      e.table_mode() ? ""
                                     : absl::StrCat("feature '",
                                                    e.config().feature_descriptor(o).name(), "', "),
                      "table '", e.table(outs[o].table).name, "') has shape ",
                      inputs[o].shape().DebugString(), " but Recv's output is ",
                      outs[o].recv_shape.DebugString())));
      grads.push_back(inputs[o].flat<float>().data());
    }
    for (int i = 0; i < rates.size(); ++i) {
      OP_REQUIRES(ctx, rates[i].NumElements() == 1,
                  absl::InvalidArgumentError(absl::StrCat(op_, ": learning_rates[", i,
                                                          "] must be a scalar, got shape ",
                                                          rates[i].shape().DebugString())));
    }
    std::unique_ptr<RoutePlan> plan;
    OP_REQUIRES_OK(ctx, router->TakeInFlight(op_, replica_, &plan));
    const int hosts = router->num_hosts();
    std::vector<float*> out(hosts);
    for (int k = 0; k < hosts; ++k) {
      Tensor* t;
      const int64_t floats = plan->host_floats[k];
      OP_REQUIRES_OK(ctx,
                     ctx->allocate_output(
                         k, TensorShape({floats + rates.size() + packed::kSequenceFloats}), &t));
      out[k] = t->flat<float>().data();
      for (int i = 0; i < rates.size(); ++i) out[k][floats + i] = rates[i].flat<float>()(0);
      PutSequence(plan->sequence, out[k] + floats + rates.size());
    }
    OP_REQUIRES_OK(ctx, router->Split(*plan, grads, out, CpuPool(ctx)));
  }
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
    int replica = 0;
    OP_REQUIRES_OK(ctx, engine.AcquireForReplica(ctx, op_, &replica));
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
  RegisterCpuKernel<RecvOp<false>>("RecvTPUEmbeddingActivations");
  RegisterCpuKernel<SendOp>("SendTPUEmbeddingGradients");
  RegisterCpuKernel<RecvOp<true>>("RecvTPUEmbeddingRoutedActivations", /*core=*/false);
  RegisterCpuKernel<SendRoutedOp>("SendTPUEmbeddingRoutedGradients", /*core=*/false);
  RegisterCpuKernel<CombineOp>("CombineTPUEmbeddingRoutedActivations", /*core=*/false);
  RegisterCpuKernel<SplitOp>("SplitTPUEmbeddingRoutedGradients", /*core=*/false);
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
