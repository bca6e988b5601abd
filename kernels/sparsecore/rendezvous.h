// Where the replicas' SparseCore kernels of one step meet on the stand-in
// SparseCore TPU (docs/sparsecore_semantics.md "Multi-chip").  On a TPU the
// SparseCore custom call of the lookup and of the gradient exchanges ids and
// rows between chips; on the stand-in each chip is a replica on
// /device:CPU:k, and the N replica kernels of one (op, table) call meet here:
// the i-th call of (op, table_name) on every replica is one meeting -- the
// i-th of the step where the kernels run inside a function (one function
// call, one step id for every replica: a failed step leaves the next ones
// aligned), else the i-th since the system was installed (eager
// `strategy.run`, one step per op).  The last replica to arrive runs the
// meeting's work for all of them (each replica's outputs are allocated
// through its own context) and then resumes every replica.
//
// No thread waits: a kernel that is not the last leaves its `done` here and
// returns its inter-op thread (TF's inter-op pool may be smaller than the
// replica count).  A meeting that is not complete after the step timeout
// (TF_TPU_EMB_STEP_TIMEOUT_SECONDS, engine/step_barrier.h) fails every
// replica that came with DeadlineExceeded naming the op, the table, the call
// and the replicas that did not arrive; one that comes later fails at once
// with FailedPrecondition (the meeting is gone), so the replicas' counts
// stay aligned.  A replica whose own inputs are bad fails with its error,
// and the others of its meeting with the same code, naming it: nobody
// waits for the timeout.  When the step is cancelled (another op of it
// failed), the replicas waiting in its meetings are resumed with Cancelled.
// A new system (initialize_tpu_system, install) starts every count afresh
// (core/sparsecore.h ChipSystem::generation).
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_RENDEZVOUS_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_RENDEZVOUS_H_

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/exceptions.h"
#include "engine/step_barrier.h"
#include "tensorflow/core/framework/cancellation.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {

// One replica's part in a meeting: its context, its continuation, the
// status of its own input checks and what its kernel parsed (the kernel's
// own type, behind void).
struct ChipArrival {
  ::tensorflow::OpKernelContext* ctx = nullptr;
  ::tensorflow::AsyncOpKernel::DoneCallback done;
  absl::Status status;
  std::shared_ptr<void> data;
  // The step's cancellation callback of a waiting replica (rendezvous-owned).
  ::tensorflow::CancellationManager* cancellation = nullptr;
  ::tensorflow::CancellationToken token = ::tensorflow::CancellationManager::kInvalidToken;

  // Called before `done`: the context (and its manager) may go with it.
  void Deregister() {
    if (cancellation != nullptr) cancellation->TryDeregisterCallback(token);
    cancellation = nullptr;
  }
};

class ChipRendezvous {
 public:
  // Runs once every replica arrived with an OK status; returns the status of
  // each replica (outputs written through arrivals[k].ctx).
  using Work = std::function<std::vector<absl::Status>(std::vector<ChipArrival>&)>;

  static ChipRendezvous& Get() {
    static ChipRendezvous* r = new ChipRendezvous();  // lives as long as the process
    return *r;
  }

  void Arrive(const std::string& op, const std::string& table, int64_t generation, int64_t replica,
              int64_t replicas, ChipArrival arrival, Work work) {
    // The step timeout, as the engine's waits read it (a bad value is every
    // replica's InvalidArgument, as it is the engine's).
    const absl::StatusOr<double> timeout = StepBarrier<int>::TimeoutFromEnvironment();
    if (!timeout.ok()) {
      arrival.ctx->SetStatus(
          absl::Status(timeout.status().code(),
                       absl::StrCat(op, " (table '", table, "'): ", timeout.status().message())));
      arrival.done();
      return;
    }
    // Inside a function every replica's kernel runs under the call's step
    // id; an eager op has a step of its own (module doc).
    const bool in_function = arrival.ctx->call_frame() != nullptr;
    const std::string key = absl::StrCat(op, "\n", table, "\n", generation, "\n",
                                         in_function ? absl::StrCat(arrival.ctx->step_id()) : "");
    // The step's cancellation reaches this replica while it waits; the
    // callback learns the meeting once it is known.
    auto target = std::make_shared<CancelTarget>();
    if (::tensorflow::CancellationManager* cm = arrival.ctx->cancellation_manager()) {
      const ::tensorflow::CancellationToken token = cm->get_cancellation_token();
      if (!cm->RegisterCallback(token, [this, target] { OnCancel(target); })) {
        arrival.ctx->SetStatus(absl::CancelledError(
            absl::StrCat(op, " (table '", table, "'): the step was cancelled")));
        arrival.done();
        return;
      }
      arrival.cancellation = cm;
      arrival.token = token;
    }
    std::shared_ptr<Meeting> m;
    int64_t call;
    bool complete = false;
    absl::Status late;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<int64_t>& next = calls_[key];
      next.resize(replicas, 0);
      call = next[replica]++;
      auto& slot = meetings_[{key, call}];
      if (slot == nullptr) {
        slot = std::make_shared<Meeting>();
        slot->op = op;
        slot->table = table;
        slot->call = call;
        slot->arrivals.resize(replicas);
        slot->present.assign(replicas, false);
        const double seconds = *timeout;
        slot->timeout_seconds = seconds;
        auto deadline = DeadlineTimer::Clock::now() +
                        std::chrono::duration_cast<DeadlineTimer::Clock::duration>(
                            std::chrono::duration<double>(seconds));
        std::pair<std::string, int64_t> id{key, call};
        slot->timer = DeadlineTimer::Get().Add(deadline, [this, id] { Expire(id); });
      }
      m = slot;
      m->present[replica] = true;
      ++m->came;
      if (m->failed) {
        late = absl::FailedPreconditionError(m->failure);
        if (m->came == replicas) meetings_.erase({key, call});
      } else {
        m->arrivals[replica] = std::move(arrival);
        if (m->came == replicas) {
          complete = true;
          meetings_.erase({key, call});
          DeadlineTimer::Get().Remove(m->timer);
          // A step's counts go once every replica has come as often.
          if (in_function &&
              std::all_of(next.begin(), next.end(), [&](int64_t c) { return c == next[0]; })) {
            calls_.erase(key);
          }
        }
      }
    }
    if (!late.ok()) {
      arrival.Deregister();
      arrival.ctx->SetStatus(late);
      arrival.done();
      return;
    }
    if (complete) {
      Run(m.get(), work);
      return;
    }
    bool cancelled;
    {
      std::lock_guard<std::mutex> lock(target->mu);
      target->id = {key, call};
      target->known = true;
      cancelled = target->cancelled;
    }
    if (cancelled) Fail({key, call}, /*cancelled=*/true);
  }

 private:
  struct Meeting {
    std::string op, table;
    int64_t call = 0;
    double timeout_seconds = 0;
    std::vector<ChipArrival> arrivals;
    std::vector<bool> present;
    int64_t came = 0;
    bool failed = false, done = false;
    std::string failure;
    DeadlineTimer::Key timer;
  };

  // Which meeting a waiting replica's cancellation callback fails.
  struct CancelTarget {
    std::mutex mu;
    bool known = false, cancelled = false;
    std::pair<std::string, int64_t> id;
  };

  void OnCancel(const std::shared_ptr<CancelTarget>& target) {
    std::pair<std::string, int64_t> id;
    {
      std::lock_guard<std::mutex> lock(target->mu);
      target->cancelled = true;
      if (!target->known) return;  // Arrive fails the meeting once it knows it
      id = target->id;
    }
    Fail(id, /*cancelled=*/true);
  }

  ChipRendezvous() = default;

  static std::string What(const Meeting& m) {
    return absl::StrCat(m.op, " (table '", m.table, "', call #", m.call,
                        " of this op and table on each replica)");
  }

  static void Run(Meeting* m, const Work& work) {
    std::vector<ChipArrival>& a = m->arrivals;
    {
      std::lock_guard<std::mutex> lock(Get().mu_);
      m->done = true;
    }
    for (ChipArrival& x : a) x.Deregister();
    std::vector<int64_t> bad;
    for (size_t k = 0; k < a.size(); ++k) {
      if (!a[k].status.ok()) bad.push_back(static_cast<int64_t>(k));
    }
    std::vector<absl::Status> results(a.size());
    if (!bad.empty()) {
      for (size_t k = 0; k < a.size(); ++k) {
        // The healthy replicas fail with the bad input's code (an
        // InvalidArgument step stays one), naming the replica that had it.
        results[k] =
            a[k].status.ok()
                ? absl::Status(a[bad[0]].status.code(),
                               absl::StrCat(What(*m), ": replica(s) ", absl::StrJoin(bad, ", "),
                                            " failed their input checks (replica ", bad[0], ": ",
                                            a[bad[0]].status.message(), ")"))
                : a[k].status;
      }
    } else {
      absl::Status caught = CatchExceptions(m->op, [&] { results = work(a); });
      if (!caught.ok()) results.assign(a.size(), caught);
    }
    for (size_t k = 0; k < a.size(); ++k) {
      if (!results[k].ok()) a[k].ctx->SetStatus(results[k]);
    }
    for (ChipArrival& arrival : a) arrival.done();
  }

  // The meeting's timeout (`cancelled` false) or its step's cancellation.
  void Fail(const std::pair<std::string, int64_t>& id, bool cancelled) {
    std::vector<ChipArrival> waiting;
    absl::Status error;
    DeadlineTimer::Key timer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = meetings_.find(id);
      if (it == meetings_.end() || it->second->failed || it->second->done) return;
      Meeting& m = *it->second;
      timer = m.timer;
      std::vector<int64_t> missing;
      for (size_t k = 0; k < m.present.size(); ++k) {
        if (!m.present[k]) missing.push_back(static_cast<int64_t>(k));
      }
      m.failed = true;
      if (cancelled) {
        m.failure = absl::StrCat(What(m),
                                 ": the step was cancelled (another op of it failed) "
                                 "while replica(s) ",
                                 absl::StrJoin(missing, ", "), " of ", m.present.size(),
                                 " had not arrived");
        error = absl::CancelledError(m.failure);
      } else {
        m.failure = absl::StrCat(
            What(m), ": replica(s) ", absl::StrJoin(missing, ", "), " of ", m.present.size(),
            " did not arrive within ", m.timeout_seconds,
            " s (every replica of the SparseCore TPU system must run each lookup and gradient "
            "op of a step; TF_TPU_EMB_STEP_TIMEOUT_SECONDS sets the limit)");
        error = absl::DeadlineExceededError(m.failure);
      }
      for (size_t k = 0; k < m.arrivals.size(); ++k) {
        if (m.present[k]) waiting.push_back(std::move(m.arrivals[k]));
      }
      m.arrivals.clear();
    }
    if (cancelled) DeadlineTimer::Get().Remove(timer);
    for (ChipArrival& a : waiting) {
      a.Deregister();
      a.ctx->SetStatus(error);
      a.done();
    }
  }

  void Expire(const std::pair<std::string, int64_t>& id) { Fail(id, /*cancelled=*/false); }

  std::mutex mu_;
  std::map<std::string, std::vector<int64_t>> calls_;  // per key: each replica's next call
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<Meeting>> meetings_;
};

}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_SPARSECORE_RENDEZVOUS_H_
