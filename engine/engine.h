// The CPU embedding engine: tables + optimizer slots, per-replica queues of
// enqueued batches, the fused lookup that RecvTPUEmbeddingActivations runs
// and the backward step SendTPUEmbeddingGradients completes.  Engines live in
// a process-wide registry by name (see Engine::Current), not in a per-device
// ResourceMgr: with MirroredStrategy over N logical CPU devices every
// replica's kernels run on a different device and must share one engine.
//
// Where each part lives: engine.cc (lifecycle, the process registry,
// configure), table.{h,cc} (storage, update settings, shard copy), step.cc
// (queues, in-flight batches, the step protocol and Recv's asynchronous
// wait on its StepBarrier),
// lookup.cc (forward), apply.cc (backward), input_mappers.{h,cc} and
// feature_batch_mapper.cc over mapper_base.h (enqueue inputs -> Batch),
// interrupts_and_c_api.cc (the library's C entry points and the SIGINT
// handler that ends the waits).
#ifndef TF_TPU_EMB_ENGINE_ENGINE_H_
#define TF_TPU_EMB_ENGINE_ENGINE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/config.h"
#include "engine/batch.h"
#include "engine/step_barrier.h"
#include "engine/table.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/refcount.h"

namespace tsl {
namespace thread {
class ThreadPool;
}  // namespace thread
}  // namespace tsl

namespace tf_tpu_emb {

class Engine;
// The owning handle of an engine that is not installed yet.  The engine is
// reference counted (a ResourceBase that kernels hold while they run), so it
// is released through Unref, never deleted directly.
using EnginePtr = ::tensorflow::core::RefCountPtr<Engine>;

class Engine : public ::tensorflow::ResourceBase {
 public:
  // Validates and completes `config_bytes` and allocates every table.
  // `host_id` < 0: one host holding every table whole (TF's core
  // ConfigureTPUEmbedding, whatever the config's num_hosts says); else host
  // `host_id` of the config's num_hosts, holding only that shard of every
  // table and slot (ConfigureTPUEmbeddingHostShard); kRoutingOnly: the
  // worker's view of a sharded model (engine/routing.h) -- the validated,
  // completed config, its outputs and tables (whole vocabularies) and the
  // input mappers' checks, but no table storage.
  static constexpr int kRoutingOnly = -2;
  static absl::Status Create(const std::string& config_bytes, EnginePtr* engine, int host_id = -1);

  // The process registry maps an engine name to its engine.  "" is the
  // process's default engine, the one TF's core-named ops address (as on a
  // TPU system); our prefixed ops take an `engine` attr (README "Several
  // engines per process").
  //
  // The configured engine called `name` (with a reference the caller owns),
  // or FailedPrecondition naming `op` and the engine when there is none.
  static absl::Status Current(const std::string& op, Engine** engine, const std::string& name = "");
  // Installs `engine` as `name`; FailedPrecondition when that name is taken.
  static absl::Status Install(EnginePtr engine, const std::string& name = "");
  static bool IsConfigured(const std::string& name = "");
  // Uninstalls the engine called `name` and cancels its waits (a waiting
  // Recv returns Cancelled); kernels still running keep their reference, and
  // its memory is released with the last one.
  static void Shutdown(const std::string& name = "");
  // Bytes of table and slot state reserved by every engine alive in the
  // process (installed, still referenced, or being configured): the memory
  // budget counts them all (Init reserves before it allocates).
  static int64_t LiveStateBytes();

  // Leases of an embedding host (README "Running on several machines"): a
  // trainer's engine on a host is leased for `lease_seconds` and kept by
  // RenewLease (the trainer's heartbeat).  A host holds at most one leased
  // engine whose lease runs: a leased configure evicts expired ones (and,
  // with `takeover`, a running one) and is otherwise refused with
  // FailedPrecondition naming the holder and when its lease ends.  An
  // evicted engine's later ops fail naming why it is gone.
  //
  // Step 1 of a leased configure, before allocating: evicts what may be
  // evicted (see above) or refuses.
  static absl::Status EvictLeases(const std::string& name, bool takeover);
  // Step 2: installs `engine` as `name` holding a lease (refused as above
  // if another configure took the host in between).
  static absl::Status InstallLeased(EnginePtr engine, const std::string& name,
                                    double lease_seconds);
  // Renews the lease of `name` and reads its step count; when it is gone,
  // *lost says why (and *step_count is -1).  Never an error: a remote op
  // that fails taints the host's executor for the trainer's other ops.
  static void RenewLease(const std::string& name, std::string* lost, int64_t* step_count);
  // What a leased configure of `name` would meet, evicting what may be
  // evicted: "" (the host may be configured) or the refusal naming the
  // holder.  Never an error (see RenewLease).
  static std::string ClaimHost(const std::string& name, bool takeover);
  // The name of the leased engine installed in this process, or "".
  static std::string LeasedEngine();
  // "the default TPU embedding engine" or "TPU embedding engine 'name'".
  static std::string Label(const std::string& name);

  ~Engine() override;
  std::string DebugString() const override;

  const TPUEmbeddingConfiguration& config() const { return config_; }
  bool table_mode() const { return table_mode_; }
  int num_replicas() const { return num_replicas_; }
  int num_tables() const { return tables_.size(); }
  const std::vector<OutputSpec>& outputs() const { return outputs_; }
  Table& table(int t) { return tables_[t]; }
  const Table& table(int t) const { return tables_[t]; }
  // The config's sharding_strategy: Load/Retrieve's shard row mapping
  // (CopyShard) and the hosts' row layout (core/sharding.h).
  ShardingStrategy sharding() const { return ShardingOf(config_); }
  // Host sharding: this engine holds shard host_id() of num_hosts() of every
  // table (num_hosts() == 1, host_id() == 0 for an engine holding them whole).
  int num_hosts() const { return num_hosts_; }
  int host_id() const { return host_id_; }
  // The part of table `t`'s local storage that Load/Retrieve(num_shards,
  // shard_id) address: `rows` rows, in CopyShard's terms `local_shards` and
  // `local_shard_id` of the local storage.  A host-sharded engine accepts
  // only its own shard (num_hosts, host_id) and returns all its rows.
  struct LocalShard {
    int64_t rows = 0;
    int local_shards = 1, local_shard_id = 0;
  };
  absl::Status ResolveShard(const std::string& op, int t, int num_shards, int shard_id,
                            LocalShard* shard) const;
  // Index of the table called `name`, or -1.
  int FindTable(const std::string& name) const;
  bool training_by_default() const;

  // Guards table contents: lookups share it, Load/Send hold it exclusively.
  std::shared_mutex& tables_mutex() { return tables_mu_; }
  // Training steps applied so far (under tables_mutex()): the count that
  // seeds bfloat16 storage's stochastic rounding (engine/apply.cc), part of
  // a checkpoint (RetrieveTPUEmbeddingStepCount / LoadTPUEmbeddingStepCount)
  // so that a resumed run rounds as the uninterrupted one.
  uint64_t steps_applied() const { return steps_applied_; }
  void set_steps_applied(uint64_t steps) { steps_applied_ = steps; }
  // Whether a table stores bfloat16 (the step count seeds its rounding).
  bool stochastic_rounding() const;

  // Queues `batch` for `replica` and resumes the oldest Recv waiting on
  // that replica (only that replica), if its step allows.
  void Enqueue(int replica, Batch batch);
  // An embedding host's routed batches (engine/routing.h, "Packet
  // integrity"): the session of the model whose router may feed this
  // engine (ConfigureTPUEmbeddingHostShard's `session`; set before the
  // engine is installed), and the enqueue of a routed batch, refused with
  // FailedPrecondition naming `op`, this host, the replica and the sequence
  // when replica's queue already took that sequence or a later one (a
  // replayed packet); nothing changes then.  An engine without a session
  // (0: fed by hand, the benchmarks of the hosts' kernels) checks no
  // sequence.
  uint64_t routed_session() const { return routed_session_; }
  void set_routed_session(uint64_t session) { routed_session_ = session; }
  absl::Status EnqueueRouted(const std::string& op, int replica, Batch batch);
  // Recv's wait: the next batch of `replica` once one is enqueued and,
  // unless the config pipelines execution, the step this replica sent
  // gradients for has been applied.  Returns true when that holds now
  // (*status and *batch set; Aborted when the previous step was aborted);
  // otherwise returns false and `later` runs exactly once, outside the
  // engine's locks and on whichever thread resolves the wait: with the batch
  // when it arrives, DeadlineExceeded after the barrier's timeout (naming the
  // replica and what never came), Cancelled when the engine is shut down.
  using RecvResume = StepBarrier<Batch>::Resume;
  bool Recv(int replica, absl::Status* status, Batch* batch, RecvResume later);
  // Recv keeps each replica's last batch: the backward pass
  // (SendTPUEmbeddingGradients) needs its ids, weights and combiners.
  void SetInFlight(int replica, Batch batch);

  // ------------------------------------------------------- training step
  // Number of dynamic inputs (learning-rate tags) Send must receive.
  int num_dynamic_inputs() const { return num_dynamic_; }
  // The first table whose optimization_parameters have no learning_rate
  // (Send refuses to train it), or -1.
  int table_without_learning_rate() const { return table_without_learning_rate_; }
  // Validate Send's gradients for NaN/Inf (off by default, as on TPU; set
  // TF_TPU_EMB_CHECK_NUMERICS=1 before configure).
  bool check_numerics() const { return check_numerics_; }
  // Hands in replica's gradients for its in-flight batch.  When every
  // replica has sent, the step's update runs (before this returns) over the
  // global batch: per row, the sum of all contributions, then gradient
  // clipping, the optimizer, weight decay and weight clipping.  A C++
  // exception while the update runs (an allocation failing) propagates to
  // the kernel's guard; the step is over, rows updated before it keep their
  // update, and waiting Recvs are released.
  absl::Status Submit(int replica, std::vector<::tensorflow::Tensor> gradients,
                      const std::vector<float>& dynamic_inputs, ::tsl::thread::ThreadPool* pool);
  // The same with the gradient rows of output o at grads[o] (bags x dim
  // floats of the in-flight batch), inside the tensors `keep`.  With
  // `async` (a host's routed Send, engine/routing.h) the update the last Send
  // of a step completes runs on its own thread (its loops on `pool`) after
  // Submit returns, so that the
  // worker routes the next batch meanwhile: every Recv waits for it (as for
  // an inline update), Load/Retrieve wait for it (WaitForApply), and an error
  // it raises aborts the next Recv of every replica.
  absl::Status Submit(int replica, std::vector<::tensorflow::Tensor> keep,
                      std::vector<const float*> grads, const std::vector<float>& dynamic_inputs,
                      ::tsl::thread::ThreadPool* pool, bool async = false);
  // Blocks until no step update is running (Load/Retrieve: tables as of
  // every Send that returned); with pipeline_execution_with_tensor_core it
  // first starts a deferred update (see `deferred_`).
  void WaitForApply();
  // What replica's in-flight training batch needs from a Send: per output
  // the floats of its gradient (bags x dim) and the batch's sequence
  // (routed batches); FailedPrecondition, as Submit, when there is none.
  absl::Status InFlightGradientFloats(int replica, std::vector<int64_t>* floats, int64_t* sequence);
  // Fails the current step for every replica (a replica's Send was invalid):
  // parts already handed in are dropped and waiting Recvs get the error.
  void AbortStep(const std::string& reason);
  // Ends every wait of this engine with Cancelled(reason).
  void CancelWaits(const std::string& reason);
  // Ends the waits present now with Cancelled(reason); later ones wait.
  void InterruptWaits(const std::string& reason);
  // Ends the present waits of every engine of the process (the SIGINT
  // watcher of engine/interrupts_and_c_api.cc).
  static void InterruptAllWaits(const std::string& reason);
  // From now on no wait of any engine lasts more than `grace_seconds`
  // (step_barrier.h's WaitsClosing: the program's main thread has finished).
  static void CloseWaits(double grace_seconds);
  // Whether a Recv on `replica` has something to wait for: a batch queued
  // for it, or the error of an aborted step it must report.
  bool HasPendingBatch(int replica);

  // The fused multi-output lookup: out[o] is float[positions_o * dim_o].
  void Lookup(const Batch& batch, const std::vector<float*>& out, ::tsl::thread::ThreadPool* pool);

 private:
  Engine() = default;
  absl::Status Init(const std::string& config_bytes, int host_id);

  TPUEmbeddingConfiguration config_;  // completed (feature descriptors filled)
  bool table_mode_ = false;           // the user's config had no feature descriptors
  int num_replicas_ = 1;
  int num_hosts_ = 1, host_id_ = 0;
  bool host_sharded_ = false;  // configured by ConfigureTPUEmbeddingHostShard
  std::vector<Table> tables_;
  std::vector<OutputSpec> outputs_;
  std::shared_mutex tables_mu_;

  std::mutex queue_mu_;
  std::vector<std::deque<Batch>> queues_;  // per replica
  uint64_t routed_session_ = 0;
  std::vector<int64_t> routed_sequence_;  // per replica: the last routed batch enqueued
  std::vector<Batch> in_flight_;          // per replica
  // What replica r's in-flight batch is (Send accepts only a training one).
  enum InFlight { kNoBatch, kTraining, kInference };
  std::vector<InFlight> in_flight_state_;  // per replica
  // The step being collected: parts_[r] is set once replica r has sent.
  std::vector<std::unique_ptr<StepPart>> parts_;
  int submitted_ = 0;
  int applying_ = 0;                      // updates formed and not yet finished (queued or running)
  std::vector<std::string> step_errors_;  // per replica, from AbortStep
  StepBarrier<Batch> step_barrier_{&queue_mu_};  // Recvs waiting, under queue_mu_
  std::condition_variable applied_cv_;           // applying_ became false (queue_mu_)
  int num_dynamic_ = 0;
  int table_without_learning_rate_ = -1;
  bool check_numerics_ = false;
  bool pipelined_ = false;
  // pipeline_execution_with_tensor_core (docs/tpu_embedding_semantics.md,
  // config field 7: "the forward pass of step N+1 may run before the
  // backward pass of step N"): the step's update is deferred until every
  // replica's next lookup has read the tables, so the next lookup never sees
  // the current update, whatever order the ops reach the engine in (one
  // rule for the in-process engine and the hosts' shards).  The update then
  // runs on its own thread while the lookup's outputs travel on; a Recv
  // waits for a running update (the lookup after next sees it), and a
  // replica's Recv that comes while the update still waits for another
  // replica's lookup starts it (at most one step stale).  Load/Retrieve and
  // the step-count ops start it too (WaitForApply).
  std::vector<std::unique_ptr<StepPart>> deferred_;  // empty: none
  std::vector<float> deferred_rates_;
  ::tsl::thread::ThreadPool* deferred_pool_ = nullptr;
  std::vector<bool> deferred_waiting_;   // per replica: its lookup not yet done
  std::vector<bool> looked_since_send_;  // per replica: a lookup since its last Send
  // A host's shard with pipelining (`lookahead_`): a replica may look up its
  // next batch before it sent the gradients of the one in flight, so that
  // step k+1's lookup and its activations' trip to the worker overlap step
  // k's gradients coming back (benchmarks/RESULTS.md, "the hosts as separate
  // machines").  ahead_[r] holds that next batch until in_flight_[r] is
  // sent; at most one: the lookup after next must see the current update.  The routed Send names
  // the batch it answers (its sequence), so the order stays checked.
  bool lookahead_ = false;
  std::vector<std::deque<Batch>> ahead_;  // per replica, at most one batch
  // The rows the next lookup reads first (embedding hosts without
  // pipelining: a background update, engine/apply.cc ApplyStep): when every
  // replica's next batch is queued as the update starts, the rows those
  // batches read are updated first, then the tables lock is released and
  // those batches' Recvs (each replica's first, `early_batch_`) look up while
  // the update's other rows -- which they do not read -- are updated.  The
  // lookup sees the whole update of every row it reads, as it would after
  // the whole update; the Recv after it, Load and Retrieve wait for the end.
  std::vector<std::vector<uint8_t>> first_rows_;  // per table, per row: read next
  std::vector<const Batch*> early_batch_;         // per replica; null: none
  bool early_ready_ = false;                      // the first rows are updated
  // Under queue_mu_: whether the starting update can put the next lookups'
  // rows first (sets first_rows_ and early_batch_).
  bool PrepareFirstRowsLocked();
  // Under queue_mu_: whether replica's Recv may look up during the update.
  bool EarlyRecvLocked(int replica) const;
  // Starts the deferred update on its own thread (under queue_mu_).
  void StartDeferredLocked();
  // The same once no update runs and every replica's next lookup is done.
  void StartDeferredIfReadyLocked();
  // Runs `parts`'s update on its own thread (the async Send's update), then
  // marks the step applied.
  void LaunchApply(std::vector<std::unique_ptr<StepPart>> parts, std::vector<float> rates,
                   ::tsl::thread::ThreadPool* pool);
  // Before a Recv of `replica` is resolved (under queue_mu_): a deferred
  // update this replica has already looked past starts now.
  void FlushDeferredFor(int replica);
  uint64_t steps_applied_ = 0;
  // The memory reservation (engine.cc): bytes counted in LiveStateBytes while
  // this engine lives; `pending` until its tables are allocated.
  int64_t reserved_bytes_ = 0;
  bool reservation_pending_ = false;
  absl::Status ReserveMemory(const std::vector<int64_t>& rows);
  void CommitReservation();

  // With queue_mu_ held: whether replica's Recv can complete now; Resolve
  // then pops its batch (or the step's abort error).
  bool RecvReady(int replica) const;
  absl::Status Resolve(int replica, Batch* batch);
  // Resumes the waiting Recvs of `replicas` that can complete now.
  void ReleaseWaiters(int first_replica, int end_replica);
  // What replica's Recv still waits for (timeout and cancel messages).
  std::string RecvWaitingFor(int replica) const;

  // The step's update (engine/apply.cc).  With `first` (first_rows_) the
  // rows it marks are updated first, then `after_first` runs, then the rest.
  void ApplyStep(const std::vector<std::unique_ptr<StepPart>>& parts,
                 const std::vector<float>& dynamic_inputs, ::tsl::thread::ThreadPool* pool,
                 const std::vector<std::vector<uint8_t>>* first = nullptr,
                 const std::function<void()>& after_first = nullptr);
};

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_ENGINE_H_
