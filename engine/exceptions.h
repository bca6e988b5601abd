// C++ exceptions as TF statuses.  Nothing may throw out of a kernel or out
// of a thread-pool task (either would terminate the process); code that runs
// there catches through CatchExceptions.  kernels/guard.h wraps every kernel
// in it; the engine's parallel loops use it for their tasks.
#ifndef TF_TPU_EMB_ENGINE_EXCEPTIONS_H_
#define TF_TPU_EMB_ENGINE_EXCEPTIONS_H_

#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tf_tpu_emb {

// Runs fn(); an exception it throws becomes the returned status
// (ResourceExhausted for allocation failures, Internal otherwise).
template <typename Fn>
absl::Status CatchExceptions(const std::string& op, Fn&& fn) {
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::bad_alloc& e) {
    return absl::ResourceExhaustedError(absl::StrCat(op, ": out of memory (", e.what(), ")"));
  } catch (const std::length_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat(op, ": a buffer would exceed its maximum size (", e.what(), ")"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(op, ": unexpected C++ exception: ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat(op, ": unexpected C++ exception"));
  }
}

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_EXCEPTIONS_H_
