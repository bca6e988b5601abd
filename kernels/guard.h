// C++ exceptions never leave a kernel of this library: an escaping
// std::bad_alloc or std::length_error would terminate the process.  Every
// kernel is registered as Guarded<Kernel>, which turns them into a TF error
// (ResourceExhausted for allocation failures, Internal otherwise).  Kernels
// allocate before they change the engine, so a caught exception leaves the
// engine as it was.
#ifndef TF_TPU_EMB_KERNELS_GUARD_H_
#define TF_TPU_EMB_KERNELS_GUARD_H_

#include <type_traits>

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
// An AsyncOpKernel guards each of its phases itself (CatchExceptions around
// the part before it hands `done` on and around its continuation): a
// wrapper around ComputeAsync could not tell whether `done` already ran.
template <typename Kernel>
::tensorflow::OpKernel* CreateGuarded(::tensorflow::OpKernelConstruction* ctx) {
  using Registered = std::conditional_t<std::is_base_of_v<::tensorflow::AsyncOpKernel, Kernel>,
                                        Kernel, Guarded<Kernel>>;
  ::tensorflow::OpKernel* kernel = nullptr;
  const absl::Status status =
      CatchExceptions(ctx->def().op(), [&] { kernel = new Registered(ctx); });
  if (!status.ok()) ctx->SetStatus(status);
  return kernel;
}

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_GUARD_H_
