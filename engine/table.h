// Table storage: the state buffers of one embedding table (its parameters
// and optimizer slots; float32, or bfloat16 where TF_TPU_EMB_STORAGE asks
// for it), the settings its update reads every step
// (fixed at configure), and the row mapping between a Load/Retrieve shard and
// the table (docs/tpu_embedding_semantics.md §2.7).
#ifndef TF_TPU_EMB_ENGINE_TABLE_H_
#define TF_TPU_EMB_ENGINE_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/bf16.h"
#include "core/config.h"
#include "core/optimizers.h"

namespace tf_tpu_emb {

// Rows of floats, stored as float32 (data()) or bfloat16 (half(),
// core/bf16.h); a large buffer 2 MiB aligned and backed by transparent huge
// pages where the kernel allows (random row gathers are bound by TLB
// misses), a small one cache-line aligned (core/huge_pages.h AllocateRows).
class FloatBuffer {
 public:
  FloatBuffer() = default;
  ~FloatBuffer();
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  // `fill` is rounded to nearest even for bfloat16 storage.
  absl::Status Allocate(int64_t num_floats, float fill, bool bf16 = false);
  bool bf16() const { return bf16_; }
  int element_bytes() const { return bf16_ ? 2 : 4; }
  float* data() { return static_cast<float*>(data_); }
  const float* data() const { return static_cast<const float*>(data_); }
  Bf16* half() { return static_cast<Bf16*>(data_); }
  const Bf16* half() const { return static_cast<const Bf16*>(data_); }

 private:
  void* data_ = nullptr;
  bool bf16_ = false;
};

// What the backward step of a table reads from its OptimizationParameters,
// read once at configure (the step only binds its dynamic inputs).
struct UpdateSettings {
  HyperParams hp{};  // the optimizer's hyper-parameters
  int lr_tag = -1;   // dynamic learning rate tag, or -1: lr_constant
  float lr_constant = 0;
  float weight_decay = 0;       // weight_decay_factor
  bool decay_times_lr = false;  // multiply_weight_decay_factor_by_learning_rate
  bool clip_g_lo = false, clip_g_hi = false, clip_w_lo = false, clip_w_hi = false;
  float g_lo = 0, g_hi = 0, w_lo = 0, w_hi = 0;
  bool accumulate = true;         // gradient accumulation (sum per row, then update)
  bool non_lazy = false;          // rows the step did not touch see g = 0
  bool has_learning_rate = true;  // false: Send refuses the table
};

// Reads `p` (a validated table's parameters) into settings.
UpdateSettings ReadUpdateSettings(const OptimizationParameters& p, const OptimizerSpec& spec);

struct Table {
  std::string name;
  int64_t vocabulary_size = 0;
  int dimension = 0;
  OptimizationParameters params;
  const OptimizerSpec* optimizer = nullptr;
  UpdateSettings update;
  // state[0] = parameters, state[1 + i] = optimizer slot i; [vocab, dim] each.
  std::vector<std::unique_ptr<FloatBuffer>> state;
  // Reduced-precision storage: every state buffer holds bfloat16; row
  // updates compute in float32 and round stochastically, seeded by the
  // number of steps the engine applied so far (results do not depend on
  // threads; Engine::steps_applied).
  bool bf16 = false;
  std::vector<std::string> state_names;  // incl. trailing gradient_accumulators
  // Non-lazy optimizers: the rows the step being applied touched (scratch of
  // the backward step, one byte per row, allocated at configure).
  std::vector<uint8_t> touched;
  // Forward-pass simulated quantization (OptimizationParameters).
  bool quantize = false;
  float quant_lower = 0, quant_upper = 0, quant_step = 0;
};

// Sets Table::bf16 of every table from the environment variable
// TF_TPU_EMB_STORAGE (README "Reduced-precision storage"): a comma list of
// `fp32` / `bf16` (every table) and `TABLE=fp32` / `TABLE=bf16` (one table,
// overriding).  Unset or empty: float32 everywhere.  An invalid setting is an
// InvalidArgument naming the entry, and no table is changed.
absl::Status ReadStorageFromEnvironment(std::vector<Table>* tables);

// Copies the `rows` rows of shard `shard_id` of `num_shards` between a shard
// tensor's data `shard` ([rows, dim], float32) and the state variable `state`
// of `table` ([vocab, dim]): into the table when `to_state` (rounded to
// nearest even for bfloat16 storage), else out of it (widened, exact).
// `strategy`: the config's sharding_strategy (core/sharding.h).
void CopyShard(const Table& table, ShardingStrategy strategy, int num_shards, int shard_id,
               int64_t rows, FloatBuffer* state, float* shard, bool to_state);

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_TABLE_H_
