// Where the replicas' SparseCore kernels of one step meet on the stand-in
// SparseCore TPU (docs/sparsecore_semantics.md "Multi-chip").  On a TPU the
// SparseCore custom call of the lookup and of the gradient exchanges ids and
// rows between chips; on the stand-in each chip is a replica on
// /device:CPU:k, and the N replica kernels of one (op, table) call meet here:
// the i-th call of (op, table_name) on every replica is one meeting.  The
// last replica to arrive runs the meeting's work for all of them (each
// replica's outputs are allocated through its own context) and then resumes
// every replica.
//
// No thread waits: a kernel that is not the last leaves its `done` here and
// returns its inter-op thread (TF's inter-op pool may be smaller than the
// replica count).  A meeting that is not complete after the step timeout
// (TF_TPU_EMB_STEP_TIMEOUT_SECONDS, engine/step_barrier.h) fails every
// replica that came with DeadlineExceeded naming the op, the table, the call
// and the replicas that did not arrive; one that comes later fails at once
// with FailedPrecondition (the meeting is gone), so the replicas' counts
// stay aligned.  A replica whose own inputs are bad fails with its error,
// and the others of its meeting with FailedPrecondition naming it: nobody
// waits for the timeout.  A new system (initialize_tpu_system, install)
// starts every count afresh (core/sparsecore.h ChipSystem::generation).
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_RENDEZVOUS_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_RENDEZVOUS_H_

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
#include "tensorflow/core/framework/op_kernel.h"

namespace tf_tpu_emb {
namespace kernels {

// One replica's part in a meeting: its context, its continuation, the
// status of its own input checks and what its kernel parsed (the kernel's
// own type, behind void).
struct ChipArrival {
  ::tensorflow::OpKernelContext* ctx = nullptr;
  ::tensorflow::AsyncOpKernel::DoneCallback done;
  absl::Status status;
  std::shared_ptr<void> data;
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

  void Arrive(const std::string& op, const std::string& table, int64_t generation,
              int64_t replica, int64_t replicas, ChipArrival arrival, Work work) {
    const std::string key = absl::StrCat(op, "\n", table, "\n", generation);
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
        absl::StatusOr<double> timeout = StepBarrier<int>::TimeoutFromEnvironment();
        const double seconds = timeout.ok() ? *timeout : StepBarrier<int>::kDefaultTimeoutSeconds;
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
        }
      }
    }
    if (!late.ok()) {
      arrival.ctx->SetStatus(late);
      arrival.done();
      return;
    }
    if (complete) Run(m.get(), work);
  }

 private:
  struct Meeting {
    std::string op, table;
    int64_t call = 0;
    double timeout_seconds = 0;
    std::vector<ChipArrival> arrivals;
    std::vector<bool> present;
    int64_t came = 0;
    bool failed = false;
    std::string failure;
    DeadlineTimer::Key timer;
  };

  ChipRendezvous() = default;

  static std::string What(const Meeting& m) {
    return absl::StrCat(m.op, " (table '", m.table, "', call #", m.call,
                        " of this op and table on each replica)");
  }

  static void Run(Meeting* m, const Work& work) {
    std::vector<ChipArrival>& a = m->arrivals;
    std::vector<int64_t> bad;
    for (size_t k = 0; k < a.size(); ++k) {
      if (!a[k].status.ok()) bad.push_back(static_cast<int64_t>(k));
    }
    std::vector<absl::Status> results(a.size());
    if (!bad.empty()) {
      for (size_t k = 0; k < a.size(); ++k) {
        results[k] = a[k].status.ok()
                         ? absl::FailedPreconditionError(absl::StrCat(
                               What(*m), ": replica(s) ", absl::StrJoin(bad, ", "),
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

  void Expire(const std::pair<std::string, int64_t>& id) {
    std::vector<ChipArrival> waiting;
    absl::Status error;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = meetings_.find(id);
      if (it == meetings_.end() || it->second->failed) return;
      Meeting& m = *it->second;
      std::vector<int64_t> missing;
      for (size_t k = 0; k < m.present.size(); ++k) {
        if (!m.present[k]) missing.push_back(static_cast<int64_t>(k));
      }
      m.failed = true;
      m.failure = absl::StrCat(
          What(m), ": replica(s) ", absl::StrJoin(missing, ", "), " of ", m.present.size(),
          " did not arrive within ", m.timeout_seconds,
          " s (every replica of the SparseCore TPU system must run each lookup and gradient "
          "op of a step; TF_TPU_EMB_STEP_TIMEOUT_SECONDS sets the limit)");
      error = absl::DeadlineExceededError(m.failure);
      for (size_t k = 0; k < m.arrivals.size(); ++k) {
        if (m.present[k]) waiting.push_back(std::move(m.arrivals[k]));
      }
      m.arrivals.clear();
    }
    for (ChipArrival& a : waiting) {
      a.ctx->SetStatus(error);
      a.done();
    }
  }

  std::mutex mu_;
  std::map<std::string, std::vector<int64_t>> calls_;  // per key: each replica's next call
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<Meeting>> meetings_;
};

}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_SPARSECORE_RENDEZVOUS_H_
