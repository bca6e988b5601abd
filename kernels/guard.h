// C++ exceptions never leave a kernel of this library: an escaping
// std::bad_alloc or std::length_error would terminate the process.  Every
// kernel is registered as Guarded<Kernel>, which turns them into a TF error
// (ResourceExhausted for allocation failures, Internal otherwise).  Kernels
// allocate before they change the engine, so a caught exception leaves the
// engine as it was.
#ifndef TF_TPU_EMB_KERNELS_GUARD_H_
#define TF_TPU_EMB_KERNELS_GUARD_H_

#include "absl/status/status.h"
#include "engine/exceptions.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_tpu_emb {

template <typename Kernel>
class Guarded : public Kernel {
 public:
  explicit Guarded(::tensorflow::OpKernelConstruction* ctx) : Kernel(ctx) {}
  void Compute(::tensorflow::OpKernelContext* ctx) override {
    const absl::Status status = CatchExceptions(this->name(), [&] { Kernel::Compute(ctx); });
    if (!status.ok()) ctx->SetStatus(status);
  }
};

// A kernel factory for OpKernelRegistrar: construction runs guarded too.
template <typename Kernel>
::tensorflow::OpKernel* CreateGuarded(::tensorflow::OpKernelConstruction* ctx) {
  ::tensorflow::OpKernel* kernel = nullptr;
  const absl::Status status =
      CatchExceptions(ctx->def().op(), [&] { kernel = new Guarded<Kernel>(ctx); });
  if (!status.ok()) ctx->SetStatus(status);
  return kernel;
}

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_GUARD_H_
