// C++ exceptions never leave a kernel of this library: an escaping
// std::bad_alloc or std::length_error would terminate the process.  Every
// kernel is registered as Guarded<Kernel>, which turns them into a TF error
// (ResourceExhausted for allocation failures, Internal otherwise).  Kernels
// allocate before they change the engine, so a caught exception leaves the
// engine as it was.
#ifndef TF_TPU_EMB_KERNELS_GUARD_H_
#define TF_TPU_EMB_KERNELS_GUARD_H_

#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_tpu_emb {

// Runs fn(); an exception it throws becomes the returned status.
template <typename Fn>
absl::Status CatchExceptions(const std::string& op, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, ": out of memory (", e.what(), ")"));
  } catch (const std::length_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, ": a buffer would exceed its maximum size (", e.what(), ")"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(op, ": unexpected C++ exception: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(op, ": unexpected C++ exception"));
  }
}

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
