// The CPU embedding engine: tables + optimizer slots, per-replica queues of
// enqueued batches, and the fused lookup that RecvTPUEmbeddingActivations
// runs.  One engine per process (see Engine::Current): with MirroredStrategy
// over N logical CPU devices every replica's kernels run on a different
// device, so a per-device ResourceMgr could not give them one shared engine.
#ifndef TF_TPU_EMB_KERNELS_ENGINE_H_
#define TF_TPU_EMB_KERNELS_ENGINE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/bag.h"
#include "kernels/config.h"
#include "kernels/optimizers.h"
#include "kernels/step_barrier.h"
#include "tensorflow/core/framework/resource_base.h"
#include "tensorflow/core/framework/tensor.h"

namespace tsl {
namespace thread {
class ThreadPool;
}  // namespace thread
}  // namespace tsl

namespace tf_tpu_emb {


// float32 rows, 2 MiB aligned and backed by transparent huge pages where the
// kernel allows: random row gathers are bound by TLB misses.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  ~FloatBuffer();
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  absl::Status Allocate(int64_t num_floats, float fill);
  float* data() { return data_; }
  const float* data() const { return data_; }

 private:
  float* data_ = nullptr;
  size_t bytes_ = 0;
};

struct Table {
  std::string name;
  int64_t vocabulary_size = 0;
  int dimension = 0;
  OptimizationParameters params;
  const OptimizerSpec* optimizer = nullptr;
  // state[0] = parameters, state[1 + i] = optimizer slot i; [vocab, dim] each.
  std::vector<std::unique_ptr<FloatBuffer>> state;
  std::vector<std::string> state_names;  // incl. trailing gradient_accumulators
  // Forward-pass simulated quantization (OptimizationParameters).
  bool quantize = false;
  float quant_lower = 0, quant_upper = 0, quant_step = 0;
};

// One output (feature descriptor of the completed config) of the engine.
struct OutputSpec {
  int table = 0;
  std::vector<int64_t> shape;  // input_shape; the Recv output adds [dim]
  int64_t positions = 0;       // product of shape: bags in the output
  ::tensorflow::TensorShape recv_shape;  // shape + [dim]: Recv's output, Send's gradient
};

// The ids of one output of one enqueued batch, as CSR over the output's
// positions (bags): bag p holds ids[offsets[p] .. offsets[p+1]).
struct OutputBatch {
  std::vector<int64_t> offsets;
  std::vector<int64_t> ids;
  std::vector<float> weights;          // empty: every weight is 1
  // Combiner of bag p is slot_combiners[p % slot_combiners.size()]: in table
  // mode several features with their own combiners interleave in a table.
  std::vector<Combiner> slot_combiners;
};

struct Batch {
  std::vector<OutputBatch> outputs;  // one per OutputSpec
  bool training = true;
};

// One replica's share of a training step: the batch its Recv produced and
// the gradients its Send handed in (one per output, shaped like Recv's).
struct StepPart {
  Batch batch;
  std::vector<::tensorflow::Tensor> gradients;
};

class Engine : public ::tensorflow::ResourceBase {
 public:
  // Validates and completes `config_bytes` and allocates every table.
  static absl::Status Create(const std::string& config_bytes,
                             std::unique_ptr<Engine>* engine);

  // The configured engine of this process (with a reference the caller
  // owns), or FailedPrecondition naming `op` when there is none.
  static absl::Status Current(const std::string& op, Engine** engine);
  // Installs `engine`; FailedPrecondition when one is already configured.
  static absl::Status Install(std::unique_ptr<Engine> engine);
  static bool IsConfigured();
  // Uninstalls the engine and cancels its waits (a Recv waiting for other
  // replicas returns Cancelled); kernels still running keep their reference.
  static void Shutdown();

  std::string DebugString() const override;

  const TPUEmbeddingConfiguration& config() const { return config_; }
  bool table_mode() const { return table_mode_; }
  int num_replicas() const { return num_replicas_; }
  int num_tables() const { return tables_.size(); }
  const std::vector<OutputSpec>& outputs() const { return outputs_; }
  Table& table(int t) { return tables_[t]; }
  // Index of the table called `name`, or -1.
  int FindTable(const std::string& name) const;
  bool training_by_default() const;

  // Guards table contents: lookups share it, Load/Send hold it exclusively.
  std::shared_mutex& tables_mutex() { return tables_mu_; }

  void Enqueue(int replica, Batch batch);
  // Pops the oldest batch of `replica`; FailedPrecondition when none.
  absl::Status Dequeue(int replica, Batch* batch);
  int64_t QueuedBatches(int replica);
  // Recv keeps each replica's last batch: the backward pass
  // (SendTPUEmbeddingGradients) needs its ids, weights and combiners.
  void SetInFlight(int replica, Batch batch);

  // ------------------------------------------------------- training step
  // Number of dynamic inputs (learning-rate tags) Send must receive.
  int num_dynamic_inputs() const { return num_dynamic_; }
  // Validate Send's gradients for NaN/Inf (off by default, as on TPU; set
  // TF_TPU_EMB_CHECK_NUMERICS=1 before configure).
  bool check_numerics() const { return check_numerics_; }
  // Hands in replica's gradients for its in-flight batch.  When every
  // replica has sent, the step's update runs (before this returns) over the
  // global batch: per row, the sum of all contributions, then gradient
  // clipping, the optimizer, weight decay and weight clipping.
  absl::Status Submit(int replica, std::vector<::tensorflow::Tensor> gradients,
                      const std::vector<float>& dynamic_inputs,
                      ::tsl::thread::ThreadPool* pool);
  // Fails the current step for every replica (a replica's Send was invalid):
  // parts already handed in are dropped and waiting Recvs get the error.
  void AbortStep(const std::string& reason);
  // Recv calls this first: unless the config pipelines execution, it waits
  // until the step this replica sent gradients for has been applied: at most
  // the step barrier's timeout (DeadlineExceeded naming the replicas that
  // never sent), Cancelled when the engine is shut down meanwhile.
  absl::Status WaitForStep(int replica);
  // Ends every wait of this engine with Cancelled(reason).
  void CancelWaits(const std::string& reason);

  // The fused multi-output lookup: out[o] is float[positions_o * dim_o].
  void Lookup(const Batch& batch, const std::vector<float*>& out,
              ::tsl::thread::ThreadPool* pool);

 private:
  Engine() = default;
  absl::Status Init(const std::string& config_bytes);

  TPUEmbeddingConfiguration config_;  // completed (feature descriptors filled)
  bool table_mode_ = false;  // the user's config had no feature descriptors
  int num_replicas_ = 1;
  std::vector<Table> tables_;
  std::vector<OutputSpec> outputs_;
  std::shared_mutex tables_mu_;

  std::mutex queue_mu_;
  std::vector<std::deque<Batch>> queues_;  // per replica
  std::vector<Batch> in_flight_;           // per replica
  std::vector<int> in_flight_state_;       // kNone / kTraining / kInference
  // The step being collected: parts_[r] is set once replica r has sent.
  std::vector<std::unique_ptr<StepPart>> parts_;
  int submitted_ = 0;
  bool applying_ = false;
  std::vector<std::string> step_errors_;   // per replica, from AbortStep
  StepBarrier step_barrier_;  // waits on queue_mu_
  int num_dynamic_ = 0;
  bool check_numerics_ = false;
  bool pipelined_ = false;

  void ApplyStep(const std::vector<std::unique_ptr<StepPart>>& parts,
                 const std::vector<float>& dynamic_inputs, ::tsl::thread::ThreadPool* pool);
};

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_ENGINE_H_
