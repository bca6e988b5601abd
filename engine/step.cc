// The step protocol: per-replica queues of enqueued batches, the batch each
// replica's Recv keeps in flight, the collection of a step's Sends (the last
// one applies the step for every replica, engine/apply.cc) and Recv's
// asynchronous wait (its batch, the previous step) on the StepBarrier.

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/exceptions.h"
#include "tsl/platform/threadpool.h"  // every TF 2.16-2.21 ships this path

namespace tf_tpu_emb {

// ------------------------------------------------------------------ queues

void Engine::Enqueue(int replica, Batch batch) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    queues_[replica].push_back(std::move(batch));
  }
  ReleaseWaiters(replica, replica + 1);
}

absl::Status Engine::EnqueueRouted(const std::string& op, int replica, Batch batch) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    int64_t& last = routed_sequence_[replica];
    if (routed_session_ != 0 && batch.sequence <= last) {
      return absl::FailedPreconditionError(absl::StrCat(
          op, ": host ", host_id_, " of ", num_hosts_, ", replica ", replica, ": routed batch #",
          batch.sequence,
          " is a replayed packet: this host's replica has already taken routed batch #", last,
          " (a router's sequence only grows)"));
    }
    last = batch.sequence;
    queues_[replica].push_back(std::move(batch));
  }
  ReleaseWaiters(replica, replica + 1);
  return absl::OkStatus();
}

bool Engine::RecvReady(int replica) const {
  if (!step_errors_[replica].empty()) return true;
  if ((applying_ && !EarlyRecvLocked(replica)) || (!pipelined_ && parts_[replica])) {
    return false;
  }
  // A deferred update this replica has looked past is started first
  // (FlushDeferredFor): its Recv waits for it.
  if (!deferred_.empty() && !deferred_waiting_[replica]) return false;
  // lookahead_: one batch looked up ahead of the in-flight one at most.
  if (!ahead_[replica].empty()) return false;
  return !queues_[replica].empty();
}

absl::Status Engine::Resolve(int replica, Batch* batch) {
  if (!step_errors_[replica].empty()) {
    const std::string error = std::move(step_errors_[replica]);
    step_errors_[replica].clear();
    return absl::AbortedError(absl::StrCat(
        "RecvTPUEmbeddingActivations: the previous training step was aborted: ", error));
  }
  if (applying_) early_batch_[replica] = nullptr;  // its early lookup: taken
  *batch = std::move(queues_[replica].front());
  queues_[replica].pop_front();
  return absl::OkStatus();
}

bool Engine::EarlyRecvLocked(int replica) const {
  return early_ready_ && applying_ == 1 && early_batch_[replica] != nullptr &&
         !queues_[replica].empty() && &queues_[replica].front() == early_batch_[replica];
}

bool Engine::PrepareFirstRowsLocked() {
  if (pipelined_ || applying_ != 1) return false;
  for (const Table& table : tables_) {
    if (table.update.non_lazy) return false;  // its update reads and writes every row
  }
  for (int r = 0; r < num_replicas_; ++r) {
    if (queues_[r].empty()) return false;
  }
  if (first_rows_.empty()) {
    for (const Table& table : tables_) first_rows_.emplace_back(table.vocabulary_size, 0);
  }
  for (auto& marked : first_rows_) std::fill(marked.begin(), marked.end(), 0);
  for (int r = 0; r < num_replicas_; ++r) {
    const Batch& next = queues_[r].front();
    for (size_t o = 0; o < next.outputs.size() && o < outputs_.size(); ++o) {
      std::vector<uint8_t>& marked = first_rows_[outputs_[o].table];
      for (int64_t id : next.outputs[o].ids) {
        if (id >= 0 && id < static_cast<int64_t>(marked.size())) marked[id] = 1;
      }
    }
    early_batch_[r] = &next;
  }
  return true;
}

std::string Engine::RecvWaitingFor(int replica) const {
  if (applying_ || (!pipelined_ && parts_[replica])) {
    std::string missing;
    for (int r = 0; r < num_replicas_; ++r) {
      if (!parts_[r]) absl::StrAppend(&missing, missing.empty() ? "" : ", ", r);
    }
    return absl::StrCat(
        "RecvTPUEmbeddingActivations on replica ", replica,
        applying_
            ? " waited for the previous training step to be applied"
            : absl::StrCat(" waited for the previous step's gradients from replica(s) ", missing,
                           " (of ", num_replicas_, ", num_tensor_cores), which never sent them"));
  }
  if (!ahead_[replica].empty()) {
    return absl::StrCat("RecvTPUEmbeddingActivations on replica ", replica,
                        " waited for the gradients of routed batch #", in_flight_[replica].sequence,
                        " (two batches were looked up and none was sent): send once per Recv");
  }
  return absl::StrCat("RecvTPUEmbeddingActivations on replica ", replica,
                      " waited for its batch, but nothing was enqueued for replica ", replica,
                      ": run an EnqueueTPUEmbedding* op (device_ordinal ", replica,
                      ") for each Recv");
}

bool Engine::Recv(int replica, absl::Status* status, Batch* batch, RecvResume later) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    FlushDeferredFor(replica);
    if (!step_barrier_.HasWaiter(replica) && RecvReady(replica)) {
      *status = Resolve(replica, batch);
      return true;
    }
    if (step_barrier_.Wait(
            replica, std::move(later), [this, replica] { return RecvWaitingFor(replica); },
            status)) {
      return false;
    }
  }
  return true;  // cancelled: *status says so
}

void Engine::ReleaseWaiters(int first_replica, int end_replica) {
  std::vector<std::pair<RecvResume, std::pair<absl::Status, Batch>>> ready;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    for (int r = first_replica; r < end_replica; ++r) {
      if (step_barrier_.HasWaiter(r)) FlushDeferredFor(r);
      while (RecvReady(r)) {
        RecvResume resume = step_barrier_.Take(r);
        if (!resume) break;
        Batch batch;
        absl::Status status = Resolve(r, &batch);
        ready.emplace_back(std::move(resume), std::make_pair(std::move(status), std::move(batch)));
      }
    }
  }
  for (auto& [resume, result] : ready) resume(std::move(result.first), std::move(result.second));
}

void Engine::SetInFlight(int replica, Batch batch) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  if (lookahead_ && in_flight_state_[replica] == kTraining) {
    // Looked up before the in-flight batch was sent (RecvReady allowed it:
    // no batch ahead yet); Submit makes it the in-flight one.
    ahead_[replica].push_back(std::move(batch));
  } else {
    in_flight_state_[replica] = batch.training ? kTraining : kInference;
    in_flight_[replica] = std::move(batch);
  }
  // Called once the lookup has read the tables: the deferred update waits
  // for every replica's lookup (deferred_, engine.h).
  looked_since_send_[replica] = true;
  if (deferred_.empty() || !deferred_waiting_[replica]) return;
  deferred_waiting_[replica] = false;
  StartDeferredIfReadyLocked();  // else the running update's end starts it
}

void Engine::FlushDeferredFor(int replica) {
  if (!deferred_.empty() && !deferred_waiting_[replica] && !applying_) StartDeferredLocked();
}

void Engine::StartDeferredIfReadyLocked() {
  if (deferred_.empty() || applying_) return;
  for (int r = 0; r < num_replicas_; ++r) {
    if (deferred_waiting_[r]) return;
  }
  StartDeferredLocked();
}

void Engine::StartDeferredLocked() {
  if (deferred_.empty()) return;
  ++applying_;
  std::vector<std::unique_ptr<StepPart>> parts;
  parts.swap(deferred_);
  std::fill(deferred_waiting_.begin(), deferred_waiting_.end(), false);
  LaunchApply(std::move(parts), std::move(deferred_rates_), deferred_pool_);
  deferred_rates_.clear();
}

// ------------------------------------------------------------ training step

namespace {

absl::Status NotInFlight(int replica, bool inference) {
  return absl::FailedPreconditionError(absl::StrCat(
      "SendTPUEmbeddingGradients: replica ", replica,
      inference ? " received an inference-mode batch; gradients can only be sent for a "
                  "batch enqueued in training mode"
                : " has no batch to send gradients for: run RecvTPUEmbeddingActivations "
                  "first, and send once per Recv"));
}

}  // namespace

absl::Status Engine::InFlightGradientFloats(int replica, std::vector<int64_t>* floats,
                                            int64_t* sequence) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  if (in_flight_state_[replica] != kTraining) {
    return NotInFlight(replica, in_flight_state_[replica] == kInference);
  }
  const Batch& batch = in_flight_[replica];
  floats->clear();
  for (size_t o = 0; o < batch.outputs.size(); ++o) {
    floats->push_back(static_cast<int64_t>(batch.outputs[o].offsets.size() - 1) *
                      tables_[outputs_[o].table].dimension);
  }
  *sequence = batch.sequence;
  return absl::OkStatus();
}

absl::Status Engine::Submit(int replica, std::vector<::tensorflow::Tensor> gradients,
                            const std::vector<float>& dynamic_inputs,
                            ::tsl::thread::ThreadPool* pool) {
  std::vector<const float*> grads;
  for (const auto& g : gradients) grads.push_back(g.flat<float>().data());
  return Submit(replica, std::move(gradients), std::move(grads), dynamic_inputs, pool);
}

void Engine::WaitForApply() {
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (true) {
    applied_cv_.wait(lock, [this] { return !applying_; });
    if (deferred_.empty()) return;
    StartDeferredLocked();
  }
}

namespace {

// The thread that runs every engine's background updates, in the order they
// were launched (one a step; a thread started per update cost the hosts
// ~2% of their CPU in thread set-up).  Not one of `pool`'s threads: an
// update's parallel loops wait for `pool`'s threads, and a pool thread
// waiting there could deadlock.  Never destroyed (a detached thread may
// outlive static destructors at exit).
class UpdateThread {
 public:
  static void Run(std::function<void()> task) {
    static UpdateThread* const runner = new UpdateThread;
    {
      std::lock_guard<std::mutex> lock(runner->mu_);
      runner->tasks_.push_back(std::move(task));
    }
    runner->cv_.notify_one();
  }

 private:
  UpdateThread() {
    std::thread([this] {
      while (true) {
        std::function<void()> task;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [this] { return !tasks_.empty(); });
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        task();
      }
    }).detach();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
};

}  // namespace

void Engine::LaunchApply(std::vector<std::unique_ptr<StepPart>> parts, std::vector<float> rates,
                         ::tsl::thread::ThreadPool* pool) {
  Ref();  // the update outlives the kernel; the engine lives until it ends
  auto shared = std::make_shared<std::vector<std::unique_ptr<StepPart>>>(std::move(parts));
  UpdateThread::Run([this, shared, rates = std::move(rates), pool] {
    const absl::Status status = CatchExceptions("the step's update", [&] {
      std::unique_lock<std::shared_mutex> tables(tables_mu_);
      bool first;
      {
        std::lock_guard<std::mutex> lock(queue_mu_);
        first = PrepareFirstRowsLocked();
      }
      // With the next batches' rows first: their Recvs look up while the
      // other rows are updated (first_rows_, engine.h).
      ApplyStep(*shared, rates, pool, first ? &first_rows_ : nullptr, [&] {
        tables.unlock();
        {
          std::lock_guard<std::mutex> lock(queue_mu_);
          early_ready_ = true;
        }
        ReleaseWaiters(0, num_replicas_);
      });
    });
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (!status.ok()) {  // the next Recv of every replica reports it
        for (auto& error : step_errors_) error = std::string(status.message());
      }
      --applying_;
      early_ready_ = false;
      std::fill(early_batch_.begin(), early_batch_.end(), nullptr);
      // lookahead_: the next step may have formed, its lookups done, while
      // this one ran.
      StartDeferredIfReadyLocked();
    }
    applied_cv_.notify_all();
    ReleaseWaiters(0, num_replicas_);
    Unref();
  });
}

absl::Status Engine::Submit(int replica, std::vector<::tensorflow::Tensor> keep,
                            std::vector<const float*> grads,
                            const std::vector<float>& dynamic_inputs,
                            ::tsl::thread::ThreadPool* pool, bool async) {
  // Allocated before anything changes: an allocation failure leaves the
  // engine as it was.
  std::vector<std::unique_ptr<StepPart>> parts, fresh(num_replicas_);
  auto part = std::make_unique<StepPart>();
  bool released = false;  // lookahead_: a Recv may wait for this Send
  auto release = [&] {
    if (released) ReleaseWaiters(replica, replica + 1);
    return absl::OkStatus();
  };
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (in_flight_state_[replica] != kTraining) {
      return NotInFlight(replica, in_flight_state_[replica] == kInference);
    }
    part->batch = std::move(in_flight_[replica]);
    part->gradients = std::move(keep);
    part->grads = std::move(grads);
    in_flight_state_[replica] = kNoBatch;
    parts_[replica] = std::move(part);
    looked_since_send_[replica] = false;
    if (!ahead_[replica].empty()) {  // lookahead_: the next batch, already looked up
      in_flight_state_[replica] = ahead_[replica].front().training ? kTraining : kInference;
      in_flight_[replica] = std::move(ahead_[replica].front());
      ahead_[replica].pop_front();
      looked_since_send_[replica] = true;
      released = true;
    }
    if (++submitted_ < num_replicas_) {
      lock.unlock();
      return release();
    }
    parts.swap(parts_);
    parts_.swap(fresh);
    submitted_ = 0;
    if (pipelined_) {
      // Deferred until every replica's next lookup (deferred_, engine.h).
      // Every replica that sent this step looked up before it sent, and a
      // step forms only after the previous deferred update has started
      // (each replica's Recv in between started or waited for it).
      if (!deferred_.empty()) {
        return absl::InternalError(
            "SendTPUEmbeddingGradients: a step formed while the "
            "previous step's deferred update had not started");
      }
      deferred_ = std::move(parts);
      deferred_rates_ = dynamic_inputs;
      deferred_pool_ = pool;
      for (int r = 0; r < num_replicas_; ++r) deferred_waiting_[r] = !looked_since_send_[r];
      // lookahead_: every replica may have looked up its next batch already.
      StartDeferredIfReadyLocked();
      lock.unlock();
      return release();
    }
    // A background update may still be running (its rows after the first
    // ones: first_rows_): an update applied here waits for it.
    if (!(async && pool != nullptr)) applied_cv_.wait(lock, [this] { return applying_ == 0; });
    ++applying_;
  }
  auto applied = [this] {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      --applying_;
    }
    applied_cv_.notify_all();
    ReleaseWaiters(0, num_replicas_);
  };
  if (async && pool != nullptr) {
    LaunchApply(std::move(parts), dynamic_inputs, pool);
    return absl::OkStatus();
  }
  try {
    std::unique_lock<std::shared_mutex> tables(tables_mu_);
    ApplyStep(parts, dynamic_inputs, pool);
  } catch (...) {
    applied();  // waiting Recvs must not wait for a step that will not finish
    throw;
  }
  applied();
  return absl::OkStatus();
}

void Engine::AbortStep(const std::string& reason) {
  bool dropped = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    for (int r = 0; r < num_replicas_; ++r) {
      if (ahead_[r].empty()) continue;
      dropped = true;
      // lookahead_: the step is abandoned, and so is the batch looked up
      // ahead of it; the next Recv starts afresh, as without lookahead.
      ahead_[r].clear();
      in_flight_state_[r] = kNoBatch;
    }
    if (submitted_ == 0 && !dropped) return;
    for (int r = 0; r < num_replicas_; ++r) {
      if (parts_[r]) step_errors_[r] = reason;
      parts_[r].reset();
    }
    submitted_ = 0;
  }
  ReleaseWaiters(0, num_replicas_);
}

void Engine::CancelWaits(const std::string& reason) {
  std::vector<std::pair<RecvResume, absl::Status>> cancelled;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    cancelled = step_barrier_.Cancel(reason);
  }
  for (auto& [resume, status] : cancelled) resume(std::move(status), Batch());
}

void Engine::InterruptWaits(const std::string& reason) {
  std::vector<std::pair<RecvResume, absl::Status>> interrupted;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    interrupted = step_barrier_.Interrupt(reason);
  }
  for (auto& [resume, status] : interrupted) resume(std::move(status), Batch());
}

bool Engine::HasPendingBatch(int replica) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  return !queues_[replica].empty() || !step_errors_[replica].empty();
}

}  // namespace tf_tpu_emb
