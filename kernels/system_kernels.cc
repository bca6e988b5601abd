// System ops: ConfigureTPUEmbedding, IsTPUEmbeddingInitialized,
// ShutdownTPUEmbedding (each for the engine its `engine` attr names, the
// default engine under TF's core names), and TPUEmbeddingActivations (the
// identity through which autodiff reaches the embedding gradients) with its
// gradient in TF's C++ gradient registry (TF_AddGradients: C, TF-Java, Go).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/routing.h"
#include "kernels/registration.h"
#include "tensorflow/cc/framework/grad_op_registry.h"
#include "tensorflow/cc/framework/gradients.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_tpu_emb {
namespace kernels {
namespace {

class TPUEmbeddingActivationsOp : public OpKernel {
 public:
  explicit TPUEmbeddingActivationsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  // Identity on sliced_activations (forwarded without a copy): the op exists
  // so that autodiff reaches the embedding gradients.
  void Compute(OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(1)); }
};

// Gradient of TPUEmbeddingActivations(embedding_variable, sliced_activations)
// for graph builders without Python (TF_AddGradients, semantics §3): the
// gradient w.r.t. embedding_variable is the incoming gradient of the
// activations, so differentiating the loss w.r.t. each lookup's
// embedding_variable yields exactly the tensor SendTPUEmbeddingGradients
// takes for that lookup; sliced_activations (a Recv output) gets none.
// Python keeps its own gradient (tf_tpu_emb/gradients.py, TF's collection
// protocol); this registry is only consulted by TF's C++ gradient builder.
absl::Status ActivationsGradient(const ::tensorflow::Scope& scope,
                                 const ::tensorflow::Operation& op,
                                 const std::vector<::tensorflow::Output>& grad_inputs,
                                 std::vector<::tensorflow::Output>* grad_outputs) {
  grad_outputs->push_back(grad_inputs[0]);
  grad_outputs->push_back(::tensorflow::NoGradient());
  return scope.status();
}

// Registers the gradient under our prefixed name and TF's core name, unless
// the running TensorFlow already has one (its registry aborts on a second
// registration of a name).
void RegisterActivationsGradient() {
  auto* registry = ::tensorflow::ops::GradOpRegistry::Global();
  for (const std::string& name :
       {kPrefix + std::string("TPUEmbeddingActivations"), std::string("TPUEmbeddingActivations")}) {
    ::tensorflow::ops::GradFunc existing = nullptr;
    if (!registry->Lookup(name, &existing).ok()) registry->Register(name, ActivationsGradient);
  }
}

// ConfigureTPUEmbedding (one host holding every table whole) and ours,
// ConfigureTPUEmbeddingHostShard (one host of the config's num_hosts: the
// engine holds that host's shard of every table), for the engine their
// `engine` attr names.
class ConfigureOp : public OpKernel {
 public:
  explicit ConfigureOp(OpKernelConstruction* ctx) : OpKernel(ctx), engine_(EngineName(ctx->def())) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("config", &config_));
    if (::tensorflow::HasNodeAttr(ctx->def(), "host_id")) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("host_id", &host_id_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("lease_seconds", &lease_seconds_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("takeover", &takeover_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("session", &session_));
    }
  }
  void Compute(OpKernelContext* ctx) override {
    const bool leased = lease_seconds_ > 0;
    // A host lease evicts (or refuses) before allocating: a taken-over
    // engine's memory must not count against its successor's budget.
    if (leased) OP_REQUIRES_OK(ctx, Engine::EvictLeases(engine_, takeover_));
    EnginePtr engine;
    OP_REQUIRES_OK(ctx, Engine::Create(config_, &engine, host_id_));
    engine->set_routed_session(static_cast<uint64_t>(session_));
    OP_REQUIRES_OK(ctx, leased ? Engine::InstallLeased(std::move(engine), engine_, lease_seconds_)
                               : Engine::Install(std::move(engine), engine_));
  }

 private:
  std::string config_;
  int host_id_ = -1;  // -1: TF's whole-table configure
  float lease_seconds_ = 0;
  bool takeover_ = false;
  int64_t session_ = 0;
  const std::string engine_;
};

class IsInitializedOp : public OpKernel {
 public:
  explicit IsInitializedOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), engine_(EngineName(ctx->def())) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = Engine::IsConfigured(engine_);
  }

 private:
  const std::string engine_;
};

class ShutdownOp : public OpKernel {
 public:
  explicit ShutdownOp(OpKernelConstruction* ctx) : OpKernel(ctx), engine_(EngineName(ctx->def())) {}
  void Compute(OpKernelContext* ctx) override { Engine::Shutdown(engine_); }

 private:
  const std::string engine_;
};

class RenewLeaseOp : public OpKernel {
 public:
  explicit RenewLeaseOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), engine_(EngineName(ctx->def())) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor *lost, *step_count;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &lost));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &step_count));
    std::string why;
    int64_t steps = -1;
    Engine::RenewLease(engine_, &why, &steps);
    lost->scalar<::tensorflow::tstring>()() = why;
    step_count->scalar<int64_t>()() = steps;
  }

 private:
  const std::string engine_;
};

class ClaimHostOp : public OpKernel {
 public:
  explicit ClaimHostOp(OpKernelConstruction* ctx) : OpKernel(ctx), engine_(EngineName(ctx->def())) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("takeover", &takeover_));
  }
  void Compute(OpKernelContext* ctx) override {
    Tensor* refusal;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &refusal));
    refusal->scalar<::tensorflow::tstring>()() = Engine::ClaimHost(engine_, takeover_);
  }

 private:
  const std::string engine_;
  bool takeover_ = false;
};

class LeasedEngineOp : public OpKernel {
 public:
  explicit LeasedEngineOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<::tensorflow::tstring>()() = Engine::LeasedEngine();
  }
};

class HostSessionOp : public OpKernel {
 public:
  explicit HostSessionOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), engine_(EngineName(ctx->def())) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    Engine* engine = nullptr;
    int64_t session = 0;
    if (Engine::Current(name(), &engine, engine_).ok()) {
      session = static_cast<int64_t>(engine->routed_session());
      engine->Unref();
    }
    out->scalar<int64_t>()() = session;
  }

 private:
  const std::string engine_;
};

class ShutdownRouterOp : public OpKernel {
 public:
  explicit ShutdownRouterOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("router", &router_));
  }
  void Compute(OpKernelContext* ctx) override { Router::Drop(router_); }

 private:
  std::string router_;
};

bool RegisterKernels() {
  RegisterCpuKernel<RenewLeaseOp>("RenewTPUEmbeddingLease", /*core=*/false);
  RegisterCpuKernel<LeasedEngineOp>("LeasedTPUEmbeddingEngine", /*core=*/false);
  RegisterCpuKernel<HostSessionOp>("TPUEmbeddingHostSession", /*core=*/false);
  RegisterCpuKernel<ClaimHostOp>("ClaimTPUEmbeddingHost", /*core=*/false);
  RegisterCpuKernel<TPUEmbeddingActivationsOp>("TPUEmbeddingActivations");
  RegisterCpuKernel<ConfigureOp>("ConfigureTPUEmbedding");
  RegisterCpuKernel<ConfigureOp>("ConfigureTPUEmbeddingHostShard", /*core=*/false);
  RegisterCpuKernel<IsInitializedOp>("IsTPUEmbeddingInitialized");
  RegisterCpuKernel<ShutdownOp>("ShutdownTPUEmbedding", /*core=*/false);
  RegisterCpuKernel<ShutdownRouterOp>("ShutdownTPUEmbeddingRouter", /*core=*/false);
  RegisterActivationsGradient();
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
