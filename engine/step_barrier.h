// Recv's wait, asynchronous: a RecvTPUEmbeddingActivations that cannot run
// yet (nothing enqueued for its replica, or the previous step not applied)
// leaves a waiter here and returns its thread; the engine resumes it when
// the condition holds.  No wait outlasts the timeout (README "Waits":
// TF_TPU_EMB_STEP_TIMEOUT_SECONDS, default 60 s), ShutdownTPUEmbedding
// cancels every present and future wait at once, and Interrupt ends the
// present ones (Ctrl-C: engine/interrupts_and_c_api.cc).  One
// process-wide DeadlineTimer thread serves the timeouts of every waiter of
// every engine; ActiveWaits() counts the waiters of every engine.
//
// Exactly once: a waiter is resumed by whoever claims it first (the engine
// handing it a payload, the timer, Cancel); each claim is one atomic
// exchange, and a resume always runs outside the engine's mutex.
#ifndef TF_TPU_EMB_ENGINE_STEP_BARRIER_H_
#define TF_TPU_EMB_ENGINE_STEP_BARRIER_H_

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace tf_tpu_emb {

// One thread for the process: runs each callback at its deadline unless it
// was removed first.  Callbacks run outside the timer's lock, so a callback
// may take any other lock (the timer's lock is never held while one is).
class DeadlineTimer {
 public:
  using Clock = std::chrono::steady_clock;
  using Key = std::pair<Clock::time_point, uint64_t>;

  static DeadlineTimer& Get() {
    static DeadlineTimer* timer = new DeadlineTimer();  // lives as long as the process
    return *timer;
  }

  Key Add(Clock::time_point when, std::function<void()> fire) {
    std::lock_guard<std::mutex> lock(mu_);
    const Key key{when, next_id_++};
    entries_.emplace(key, std::move(fire));
    if (!started_) {
      std::thread([this] { Run(); }).detach();
      started_ = true;
    }
    cv_.notify_one();
    return key;
  }

  // Drops the entry unless it already fired.
  void Remove(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.erase(key);
  }

 private:
  DeadlineTimer() = default;

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (entries_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = entries_.begin();
      // A copy: wait_until reads its deadline again after waking, when
      // Remove may have erased (freed) this entry meanwhile.
      const Clock::time_point when = first->first.first;
      if (Clock::now() < when) {
        cv_.wait_until(lock, when);
        continue;
      }
      std::function<void()> fire = std::move(first->second);
      entries_.erase(first);
      lock.unlock();
      fire();
      fire = nullptr;  // released outside the lock too
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::function<void()>> entries_;
  uint64_t next_id_ = 0;
  bool started_ = false;
};

// Waiters not yet resumed, over every engine of the process (read by the
// SIGINT handler: async-signal-safe, lock-free).
inline std::atomic<int>& ActiveWaits() {
  static std::atomic<int> count{0};
  return count;
}

// Once the program's main thread has finished (tf_tpu_emb/waits.py), no wait
// lasts past `deadline`: a Recv left waiting in a non-daemon thread must not
// hold the process until its timeout, while the short waits of a training
// thread that outlives the main thread (replicas handing a step over) go on.
struct WaitsClosing {
  std::atomic<bool> closing{false};
  std::atomic<DeadlineTimer::Clock::rep> deadline{0};  // time_since_epoch ticks
  double grace_seconds = 0;

  static WaitsClosing& Get() {
    static WaitsClosing* state = new WaitsClosing();
    return *state;
  }
  DeadlineTimer::Clock::time_point Deadline() const {
    return DeadlineTimer::Clock::time_point(DeadlineTimer::Clock::duration(deadline.load()));
  }
};

// The waiters of one engine, keyed by replica.  `Payload` is what a waiter
// is handed when its condition holds (Recv: its replica's batch).  Every
// member except the constructor runs with the engine's mutex `mu` held.
template <typename Payload>
class StepBarrier {
 public:
  static constexpr char kTimeoutVariable[] = "TF_TPU_EMB_STEP_TIMEOUT_SECONDS";
  // Long enough for any step of a healthy program on CPU, short enough for a
  // person at a notebook; programs that legitimately wait longer (a worker
  // that pauses to evaluate while others wait on its Sends) raise it.
  static constexpr double kDefaultTimeoutSeconds = 60;
  // One day: longer waits are a hang, not a slow replica.
  static constexpr double kMaxTimeoutSeconds = 86400;

  // The callback of a waiter: OK and the payload, or the error (Cancelled,
  // DeadlineExceeded) and a default Payload.
  using Resume = std::function<void(absl::Status, Payload)>;

  // The timeout TF_TPU_EMB_STEP_TIMEOUT_SECONDS sets (seconds, > 0), or the
  // default when it is unset; InvalidArgument for anything else.
  static absl::StatusOr<double> TimeoutFromEnvironment() {
    const char* env = std::getenv(kTimeoutVariable);
    if (env == nullptr || *env == '\0') return kDefaultTimeoutSeconds;
    char* end = nullptr;
    errno = 0;
    const double s = std::strtod(env, &end);
    if (*end != '\0' || errno != 0 || !(s > 0) || !(s <= kMaxTimeoutSeconds)) {
      return absl::InvalidArgumentError(absl::StrCat(kTimeoutVariable,
                                                     " must be a number of seconds in (0, ",
                                                     kMaxTimeoutSeconds, "], got '", env, "'"));
    }
    return s;
  }

  explicit StepBarrier(std::mutex* mu) : mu_(mu) {}
  StepBarrier(const StepBarrier&) = delete;
  StepBarrier& operator=(const StepBarrier&) = delete;

  void set_timeout_seconds(double seconds) { timeout_seconds_ = seconds; }
  double timeout_seconds() const { return timeout_seconds_; }

  // Registers a waiter for `key`.  `resume` runs exactly once, outside `mu`:
  // with OK and a payload when Take(key) hands one over, with
  // DeadlineExceeded after the timeout or Cancelled after Cancel; both
  // messages carry waiting(), evaluated then (with `mu` held) to say what
  // was still missing.  After Cancel, `resume` gets Cancelled at once (the
  // caller must not hold `mu` in that case: Wait returns false and the
  // caller runs the returned status itself).  Returns false, and sets
  // *cancelled, when the barrier is already cancelled.
  bool Wait(int key, Resume resume, std::function<std::string()> waiting, absl::Status* cancelled) {
    if (cancelled_) {
      *cancelled = absl::CancelledError(absl::StrCat(reason_, "; ", waiting()));
      return false;
    }
    auto w = std::make_shared<Waiter>();
    w->key = key;
    w->resume = std::move(resume);
    w->waiting = std::move(waiting);
    std::list<std::shared_ptr<Waiter>> node{w};  // allocated before anything is registered
    auto deadline =
        DeadlineTimer::Clock::now() + std::chrono::duration_cast<DeadlineTimer::Clock::duration>(
                                          std::chrono::duration<double>(timeout_seconds_));
    if (WaitsClosing::Get().closing.load()) {
      deadline = std::min(deadline, WaitsClosing::Get().Deadline());
    }
    // The engine outlives an unclaimed waiter: its resume holds a reference.
    ActiveWaits().fetch_add(1);
    w->timer = DeadlineTimer::Get().Add(deadline, [this, w] { Expire(w); });
    waiters_.splice(waiters_.end(), node);
    return true;
  }

  bool HasWaiter(int key) const {
    for (const auto& w : waiters_) {
      if (w->key == key && !w->claimed.load()) return true;
    }
    return false;
  }

  // Claims the oldest waiter of `key` (its timer disarmed) and returns its
  // resume, which the caller runs outside `mu`; null when there is none.
  Resume Take(int key) {
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      std::shared_ptr<Waiter> w = *it;
      if (w->key != key || w->claimed.exchange(true)) continue;  // the timer's
      waiters_.erase(it);
      DeadlineTimer::Get().Remove(w->timer);
      ActiveWaits().fetch_sub(1);
      return std::move(w->resume);
    }
    return nullptr;
  }

  // Ends every present and future wait with Cancelled(reason): returns the
  // resumes to run (outside `mu`) with their statuses.
  std::vector<std::pair<Resume, absl::Status>> Cancel(const std::string& reason) {
    if (!cancelled_) reason_ = reason;
    cancelled_ = true;
    return ClaimAll(reason_);
  }
  // No present wait lasts past `deadline` (WaitsClosing).
  void Shorten(DeadlineTimer::Clock::time_point deadline) {
    for (const auto& w : waiters_) {
      if (w->claimed.load() || w->timer.first <= deadline) continue;
      DeadlineTimer::Get().Remove(w->timer);  // if it fired meanwhile, Expire finds it claimed
      w->timer = DeadlineTimer::Get().Add(deadline, [this, w] { Expire(w); });
    }
  }

  // Ends the present waits only, with Cancelled(reason); later waits wait
  // as usual.
  std::vector<std::pair<Resume, absl::Status>> Interrupt(const std::string& reason) {
    return ClaimAll(reason);
  }
  bool cancelled() const { return cancelled_; }

 private:
  struct Waiter {
    int key = 0;
    Resume resume;
    std::function<std::string()> waiting;
    DeadlineTimer::Key timer;
    std::atomic<bool> claimed{false};
  };

  std::vector<std::pair<Resume, absl::Status>> ClaimAll(const std::string& reason) {
    std::vector<std::pair<Resume, absl::Status>> out;
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      std::shared_ptr<Waiter> w = *it;
      if (w->claimed.exchange(true)) {  // the timer's: it removes it
        ++it;
        continue;
      }
      it = waiters_.erase(it);
      DeadlineTimer::Get().Remove(w->timer);
      ActiveWaits().fetch_sub(1);
      out.emplace_back(std::move(w->resume),
                       absl::CancelledError(absl::StrCat(reason, "; ", w->waiting())));
    }
    return out;
  }

  // On the timer's thread.
  void Expire(const std::shared_ptr<Waiter>& w) {
    if (w->claimed.exchange(true)) return;  // handed over or cancelled first
    ActiveWaits().fetch_sub(1);
    absl::Status status;
    {
      std::lock_guard<std::mutex> lock(*mu_);
      waiters_.remove(w);
      const WaitsClosing& closing = WaitsClosing::Get();
      status = absl::DeadlineExceededError(
          closing.closing.load() && w->timer.first >= closing.Deadline()
              ? absl::StrCat(w->waiting(), " (ended ", closing.grace_seconds,
                             " s after the program's main thread finished)")
              : absl::StrCat(w->waiting(), " (timed out after ", timeout_seconds_, " s; ",
                             kTimeoutVariable, " sets the limit)"));
    }
    Resume resume = std::move(w->resume);
    w->waiting = nullptr;
    resume(status, Payload());
  }

  std::mutex* const mu_;
  std::list<std::shared_ptr<Waiter>> waiters_;
  double timeout_seconds_ = kDefaultTimeoutSeconds;
  bool cancelled_ = false;
  std::string reason_;
};

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_STEP_BARRIER_H_
