// System ops: ConfigureTPUEmbedding, IsTPUEmbeddingInitialized,
// ShutdownTPUEmbedding, and TPUEmbeddingActivations (the identity through
// which autodiff reaches the embedding gradients).
#include <memory>
#include <string>
#include <utility>

#include "engine/engine.h"
#include "kernels/registration.h"
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

class ConfigureOp : public OpKernel {
 public:
  explicit ConfigureOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("config", &config_));
  }
  void Compute(OpKernelContext* ctx) override {
    EnginePtr engine;
    OP_REQUIRES_OK(ctx, Engine::Create(config_, &engine));
    OP_REQUIRES_OK(ctx, Engine::Install(std::move(engine)));
  }

 private:
  std::string config_;
};

// Ours: ConfigureTPUEmbedding for one host of the config's num_hosts (the
// engine holds that host's shard of every table).
class ConfigureHostOp : public OpKernel {
 public:
  explicit ConfigureHostOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("config", &config_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("host_id", &host_id_));
  }
  void Compute(OpKernelContext* ctx) override {
    EnginePtr engine;
    OP_REQUIRES_OK(ctx, Engine::Create(config_, &engine, host_id_));
    OP_REQUIRES_OK(ctx, Engine::Install(std::move(engine)));
  }

 private:
  std::string config_;
  int host_id_ = 0;
};

class IsInitializedOp : public OpKernel {
 public:
  explicit IsInitializedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = Engine::IsConfigured();
  }
};

class ShutdownOp : public OpKernel {
 public:
  explicit ShutdownOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override { Engine::Shutdown(); }
};

bool RegisterKernels() {
  RegisterCpuKernel<TPUEmbeddingActivationsOp>("TPUEmbeddingActivations");
  RegisterCpuKernel<ConfigureOp>("ConfigureTPUEmbedding");
  RegisterCpuKernel<ConfigureHostOp>("ConfigureTPUEmbeddingHostShard", /*core=*/false);
  RegisterCpuKernel<IsInitializedOp>("IsTPUEmbeddingInitialized");
  RegisterCpuKernel<ShutdownOp>("ShutdownTPUEmbedding", /*core=*/false);
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
