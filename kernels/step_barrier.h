// A bounded, cancellable wait on a condition another thread makes true: a
// replica's Recv waiting for the other replicas' Sends of the previous step.
// ShutdownTPUEmbedding cancels it (every present and future wait returns
// Cancelled at once) and no wait outlasts the timeout (README "Limits and
// errors": TF_TPU_EMB_STEP_TIMEOUT_SECONDS, default 600 s).
#ifndef TF_TPU_EMB_KERNELS_STEP_BARRIER_H_
#define TF_TPU_EMB_KERNELS_STEP_BARRIER_H_

#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tf_tpu_emb {

class StepBarrier {
 public:
  static constexpr char kTimeoutVariable[] = "TF_TPU_EMB_STEP_TIMEOUT_SECONDS";
  static constexpr double kDefaultTimeoutSeconds = 600;
  // One day: longer waits are a hang, not a slow replica.
  static constexpr double kMaxTimeoutSeconds = 86400;

  // The timeout TF_TPU_EMB_STEP_TIMEOUT_SECONDS sets (seconds, > 0), or the
  // default when it is unset; InvalidArgument for anything else.
  static absl::StatusOr<double> TimeoutFromEnvironment() {
    const char* env = std::getenv(kTimeoutVariable);
    if (env == nullptr || *env == '\0') return kDefaultTimeoutSeconds;
    char* end = nullptr;
    errno = 0;
    const double s = std::strtod(env, &end);
    if (*end != '\0' || errno != 0 || !(s > 0) || !(s <= kMaxTimeoutSeconds)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kTimeoutVariable, " must be a number of seconds in (0, ", kMaxTimeoutSeconds,
          "], got '", env, "'"));
    }
    return s;
  }

  void set_timeout_seconds(double seconds) { timeout_seconds_ = seconds; }
  double timeout_seconds() const { return timeout_seconds_; }

  // Blocks on `lock` (held, on the mutex that guards what `done` reads and
  // that Cancel's caller holds) until done() holds.  Cancelled with the
  // reason given to Cancel, or DeadlineExceeded after the timeout; both
  // messages end with waiting(), which says what was still missing.
  template <typename Done, typename Waiting>
  absl::Status Wait(std::unique_lock<std::mutex>& lock, Done done, Waiting waiting) {
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(timeout_seconds_));
    while (!cancelled_ && !done()) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !cancelled_ &&
          !done()) {
        return absl::DeadlineExceededError(absl::StrCat(
            waiting(), " (timed out after ", timeout_seconds_, " s; ", kTimeoutVariable,
            " sets the limit)"));
      }
    }
    if (cancelled_) return absl::CancelledError(absl::StrCat(reason_, "; ", waiting()));
    return absl::OkStatus();
  }

  // Wakes the waiters to re-check their condition.
  void NotifyAll() { cv_.notify_all(); }

  // Ends every present and future wait with Cancelled(reason).  The caller
  // holds the waiters' mutex.
  void Cancel(const std::string& reason) {
    if (!cancelled_) reason_ = reason;
    cancelled_ = true;
    cv_.notify_all();
  }
  bool cancelled() const { return cancelled_; }

 private:
  std::condition_variable cv_;
  double timeout_seconds_ = kDefaultTimeoutSeconds;
  bool cancelled_ = false;
  std::string reason_;
};

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_STEP_BARRIER_H_
