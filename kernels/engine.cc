#include "kernels/engine.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <functional>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/platform/refcount.h"
#include "xla/tsl/platform/threadpool.h"

namespace tf_tpu_emb {

// ------------------------------------------------------------- FloatBuffer

FloatBuffer::~FloatBuffer() { std::free(data_); }

absl::Status FloatBuffer::Allocate(int64_t num_floats, float fill) {
  constexpr int64_t kHugePage = int64_t{2} << 20;
  int64_t bytes, padded;
  if (num_floats < 0 || !CheckedMul(std::max<int64_t>(num_floats, 1), 4, &bytes) ||
      !CheckedAdd(bytes, kHugePage - 1, &padded)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", num_floats, " floats for an embedding table: the byte count "
        "overflows int64"));
  }
  const size_t rounded = static_cast<size_t>(padded / kHugePage * kHugePage);
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", rounded, " bytes for an embedding table"));
  }
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE);
#endif
  data_ = static_cast<float*>(p);
  bytes_ = rounded;
  std::fill(data_, data_ + num_floats, fill);
  return absl::OkStatus();
}

// --------------------------------------------------------- engine registry

namespace {
constexpr int kNone = 0, kTraining = 1, kInference = 2;
std::mutex g_registry_mu;
Engine* g_engine = nullptr;  // owns one reference
}  // namespace

absl::Status Engine::Current(const std::string& op, Engine** engine) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  if (g_engine == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": the TPU embedding engine is not configured; run "
            "ConfigureTPUEmbedding first"));
  }
  g_engine->Ref();
  *engine = g_engine;
  return absl::OkStatus();
}

absl::Status Engine::Install(std::unique_ptr<Engine> engine) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  if (g_engine != nullptr) {
    return absl::FailedPreconditionError(
        "ConfigureTPUEmbedding: the TPU embedding engine is already "
        "configured; run ShutdownTPUEmbedding before configuring it again");
  }
  g_engine = engine.release();
  return absl::OkStatus();
}

bool Engine::IsConfigured() {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  return g_engine != nullptr;
}

void Engine::Shutdown() {
  Engine* old;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    old = g_engine;
    g_engine = nullptr;
  }
  // Kernels still running hold their own references.
  if (old != nullptr) {
    old->CancelWaits("ShutdownTPUEmbedding ran while this op waited");
    old->Unref();
  }
}

std::string Engine::DebugString() const {
  return absl::StrCat("tf_tpu_emb engine with ", tables_.size(), " tables, ",
                      outputs_.size(), " outputs, ", num_replicas_, " replicas");
}

int Engine::FindTable(const std::string& name) const {
  for (int t = 0; t < static_cast<int>(tables_.size()); ++t) {
    if (tables_[t].name == name) return t;
  }
  return -1;
}

bool Engine::training_by_default() const {
  return config_.mode() != TPUEmbeddingConfiguration::INFERENCE;
}

// ---------------------------------------------------------------- creation

absl::Status Engine::Create(const std::string& config_bytes,
                            std::unique_ptr<Engine>* engine) {
  std::unique_ptr<Engine> e(new Engine());
  TF_RETURN_IF_ERROR(e->Init(config_bytes));
  *engine = std::move(e);
  return absl::OkStatus();
}

namespace {

// Collects the OptimizerDynamicInput tags of a table (learning rate and, for
// FrequencyAwareAdagrad, the step counter).
void CollectDynamicTags(const OptimizationParameters& p, std::set<int>* tags) {
  if (p.learning_rate().has_dynamic()) tags->insert(p.learning_rate().dynamic().tag());
  if (p.has_frequency_aware_adagrad() &&
      p.frequency_aware_adagrad().has_step_counter()) {
    tags->insert(p.frequency_aware_adagrad().step_counter().tag());
  }
}

// Reads the first integer after `key` in a /proc or /sys file; -1 if absent.
int64_t ReadNumber(const char* path, const std::string& key = "") {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t value = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (key.empty() || std::strncmp(line, key.c_str(), key.size()) == 0) {
      char* end = nullptr;
      const long long v = std::strtoll(line + key.size(), &end, 10);
      if (end != line + key.size()) value = v;  // "max" (no cgroup limit) stays -1
      break;
    }
  }
  std::fclose(f);
  return value;
}

// Bytes the tables may take: TF_TPU_EMB_MEMORY_LIMIT_BYTES when set, else
// the smaller of MemAvailable and the room left under a cgroup (v2 or v1)
// memory limit; -1 when nothing is known.  `source` says which.
absl::Status MemoryBudget(int64_t* budget, std::string* source) {
  if (const char* env = std::getenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES"); env && *env) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(env, &end, 10);
    if (*end != '\0' || errno != 0 || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TF_TPU_EMB_MEMORY_LIMIT_BYTES must be a non-negative integer number of "
          "bytes, got '", env, "'"));
    }
    *budget = v;
    *source = "TF_TPU_EMB_MEMORY_LIMIT_BYTES";
    return absl::OkStatus();
  }
  *budget = -1;
  const int64_t kib = ReadNumber("/proc/meminfo", "MemAvailable:");
  if (kib >= 0) {
    *budget = kib * 1024;
    *source = "MemAvailable in /proc/meminfo";
  }
  const std::pair<const char*, const char*> cgroups[] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
       "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& [limit_path, usage_path] : cgroups) {
    const int64_t limit = ReadNumber(limit_path), usage = ReadNumber(usage_path);
    if (limit < 0 || usage < 0) continue;
    const int64_t room = std::max<int64_t>(0, limit - usage);
    if (*budget < 0 || room < *budget) {
      *budget = room;
      *source = absl::StrCat("the cgroup memory limit (", limit_path, " minus usage)");
    }
    break;
  }
  return absl::OkStatus();
}

// ResourceExhausted, before anything is allocated, when the tables and
// their optimizer slots need more bytes than the memory budget.
absl::Status CheckMemoryBudget(const TPUEmbeddingConfiguration& config) {
  std::vector<std::pair<int64_t, int>> bytes;  // (bytes, table)
  int64_t total = 0;
  for (int t = 0; t < config.table_descriptor_size(); ++t) {
    absl::StatusOr<int64_t> b = TableStateBytes(config, t);
    if (!b.ok()) return b.status();
    if (!CheckedAdd(total, *b, &total)) {
      return absl::InvalidArgumentError(
          "the tables' total size in bytes overflows int64");
    }
    bytes.push_back({*b, t});
  }
  int64_t budget;
  std::string source;
  TF_RETURN_IF_ERROR(MemoryBudget(&budget, &source));
  if (budget < 0 || total <= budget) return absl::OkStatus();
  std::sort(bytes.begin(), bytes.end(), std::greater<>());
  std::string largest;
  for (size_t i = 0; i < std::min<size_t>(3, bytes.size()); ++i) {
    absl::StrAppend(&largest, i ? ", " : "", "'",
                    config.table_descriptor(bytes[i].second).name(), "' ", bytes[i].first);
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "ConfigureTPUEmbedding: the tables and their optimizer slots need ", total,
      " bytes but the memory budget is ", budget, " bytes (", source,
      "); largest tables (bytes): ", largest,
      ". Set TF_TPU_EMB_MEMORY_LIMIT_BYTES to change the budget."));
}

}  // namespace

absl::Status Engine::Init(const std::string& config_bytes) {
  if (config_bytes.empty()) {
    return absl::InvalidArgumentError("TPU embedding config is empty.");
  }
  TF_RETURN_IF_ERROR(ParseConfig(config_bytes, &config_));
  table_mode_ = config_.feature_descriptor_size() == 0;
  TF_RETURN_IF_ERROR(CompleteConfig(&config_));
  TF_RETURN_IF_ERROR(ValidateConfig(config_));
  if (config_.mode() == TPUEmbeddingConfiguration::UNSPECIFIED) {
    return absl::InvalidArgumentError(
        "TPUEmbeddingConfiguration.mode is INVALID.  Must be INFERENCE, "
        "TRAINING, or BACKWARD_PASS_ONLY");
  }
  if (SpmdMultipliesOutputs(config_) && config_.spmd_sharding().num_cores_per_replica() != 1) {
    return absl::UnimplementedError(absl::StrCat(
        "spmd_sharding with num_cores_per_replica ",
        config_.spmd_sharding().num_cores_per_replica(),
        " is not supported by tf_tpu_emb's CPU engine (use 1 core per replica)"));
  }
  num_replicas_ = std::max(1, config_.num_tensor_cores());

  std::set<int> tags;
  std::set<std::string> names;
  tables_.resize(config_.table_descriptor_size());
  for (int t = 0; t < config_.table_descriptor_size(); ++t) {
    const auto& desc = config_.table_descriptor(t);
    const std::string label = TableLabel(config_, t);
    if (!desc.name().empty() && !names.insert(desc.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("two tables are named '", desc.name(), "'"));
    }
    const OptimizationParameters& p = desc.optimization_parameters();
    const OptimizerSpec* spec = FindOptimizer(p.parameters_case());
    if (spec == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": No optimization algorithm specified"));
    }
    if (!spec->implemented) {
      return absl::UnimplementedError(absl::StrCat(
          label, " uses the ", spec->proto_field,
          " optimizer, which tf_tpu_emb does not implement"));
    }
    if (p.learning_rate().has_dynamic() && p.learning_rate().dynamic().tag() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, " has a negative dynamic learning rate tag ",
          p.learning_rate().dynamic().tag()));
    }
    CollectDynamicTags(p, &tags);
    Table& table = tables_[t];
    table.name = desc.name();
    table.vocabulary_size = desc.vocabulary_size();
    table.dimension = desc.dimension();
    table.params = p;
    table.optimizer = spec;
    TF_RETURN_IF_ERROR(StateVariableNames(p, &table.state_names));
    absl::StatusOr<Quantization> q = TableQuantization(p, label);
    if (!q.ok()) return q.status();
    table.quantize = q->enabled;
    table.quant_lower = q->lower;
    table.quant_upper = q->upper;
    table.quant_step = q->step;
  }
  // Dynamic inputs are addressed by tag: tags must be exactly 0..n-1.
  int expected = 0;
  for (int tag : tags) {
    if (tag != expected++) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dynamic learning rate tags must be 0, 1, ..., n-1 without gaps; "
          "tag ", expected - 1, " is not used"));
    }
  }

  for (const auto& f : config_.feature_descriptor()) {
    OutputSpec out;
    out.table = f.table_id();
    out.shape.assign(f.input_shape().begin(), f.input_shape().end());
    out.positions = 1;
    for (int64_t d : out.shape) out.positions *= d;  // bounded by ValidateConfig
    std::vector<int64_t> dims = out.shape;
    dims.push_back(tables_[out.table].dimension);
    TF_RETURN_IF_ERROR(::tensorflow::TensorShapeUtils::MakeShape(dims, &out.recv_shape));
    outputs_.push_back(std::move(out));
  }

  TF_RETURN_IF_ERROR(CheckMemoryBudget(config_));
  for (Table& table : tables_) {
    const int64_t n = table.vocabulary_size * table.dimension;  // bounded by ValidateConfig
    auto params = std::make_unique<FloatBuffer>();
    TF_RETURN_IF_ERROR(params->Allocate(n, 0.0f));
    table.state.push_back(std::move(params));
    for (const SlotSpec& slot : table.optimizer->slots) {
      float init = slot.initial_value;
      if (table.params.has_frequency_aware_adagrad() &&
          std::string(slot.name) == "accumulators") {
        init = table.params.frequency_aware_adagrad().initial_accumulator_value();
      }
      auto buf = std::make_unique<FloatBuffer>();
      TF_RETURN_IF_ERROR(buf->Allocate(n, init));
      table.state.push_back(std::move(buf));
    }
  }
  queues_.resize(num_replicas_);
  in_flight_.resize(num_replicas_);
  in_flight_state_.assign(num_replicas_, kNone);
  parts_.resize(num_replicas_);
  step_errors_.resize(num_replicas_);
  num_dynamic_ = tags.size();
  pipelined_ = config_.pipeline_execution_with_tensor_core();
  absl::StatusOr<double> timeout = StepBarrier::TimeoutFromEnvironment();
  if (!timeout.ok()) return timeout.status();
  step_barrier_.set_timeout_seconds(*timeout);
  const char* check = std::getenv("TF_TPU_EMB_CHECK_NUMERICS");
  check_numerics_ = check != nullptr && (std::string(check) == "1" || std::string(check) == "true");
  return absl::OkStatus();
}

// ------------------------------------------------------------------ queues

void Engine::Enqueue(int replica, Batch batch) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  queues_[replica].push_back(std::move(batch));
}

absl::Status Engine::Dequeue(int replica, Batch* batch) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  if (queues_[replica].empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RecvTPUEmbeddingActivations: nothing has been enqueued for replica ",
        replica, "; run an EnqueueTPUEmbedding* op (device_ordinal ", replica,
        ") before each Recv"));
  }
  *batch = std::move(queues_[replica].front());
  queues_[replica].pop_front();
  return absl::OkStatus();
}

void Engine::SetInFlight(int replica, Batch batch) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  in_flight_state_[replica] = batch.training ? kTraining : kInference;
  in_flight_[replica] = std::move(batch);
}

int64_t Engine::QueuedBatches(int replica) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  return queues_[replica].size();
}

// ------------------------------------------------------------------ lookup

namespace {

inline float Quantize(const Table& t, float x) {
  const float c = std::min(std::max(x, t.quant_lower), t.quant_upper);
  const float q = std::floor((c - t.quant_lower) / t.quant_step + 0.5f);
  return q * t.quant_step + t.quant_lower;
}

}  // namespace

void Engine::Lookup(const Batch& batch, const std::vector<float*>& out,
                    ::tsl::thread::ThreadPool* pool) {
  // Flatten every output's bags into one index space so that one ParallelFor
  // covers all tables and features.
  const int num_outputs = outputs_.size();
  std::vector<int64_t> starts(num_outputs + 1, 0);
  int64_t total_ids = 0, total_dims = 0;
  for (int o = 0; o < num_outputs; ++o) {
    starts[o + 1] = starts[o] + outputs_[o].positions;
    total_ids += batch.outputs[o].ids.size();
    total_dims += tables_[outputs_[o].table].dimension;
  }
  const int64_t total = starts[num_outputs];
  if (total == 0) return;
  const int64_t avg_dim = std::max<int64_t>(1, total_dims / std::max(1, num_outputs));
  const int64_t cost = (1 + total_ids / total) * avg_dim * 4 + avg_dim;

  auto work = [&](int64_t begin, int64_t end) {
    int o = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
    for (int64_t i = begin; i < end; ++i) {
      while (i >= starts[o + 1]) ++o;
      const int64_t p = i - starts[o];
      const OutputBatch& ob = batch.outputs[o];
      const Table& table = tables_[outputs_[o].table];
      const int64_t lo = ob.offsets[p], n = ob.offsets[p + 1] - lo;
      const int64_t* ids = ob.ids.data() + lo;
      const float* w = ob.weights.empty() ? nullptr : ob.weights.data() + lo;
      const Combiner c = ob.slot_combiners[p % ob.slot_combiners.size()];
      float* dst = out[o] + p * table.dimension;
      const float* base = table.state[0]->data();
      const int dim = table.dimension;
      if (table.quantize) {
        auto q = [&table](float x) { return Quantize(table, x); };
        if (w) ReduceBag<true>(base, dim, ids, w, n, c, dst, q);
        else ReduceBag<false>(base, dim, ids, w, n, c, dst, q);
      } else {
        auto identity = [](float x) { return x; };
        if (w) ReduceBag<true>(base, dim, ids, w, n, c, dst, identity);
        else ReduceBag<false>(base, dim, ids, w, n, c, dst, identity);
      }
    }
  };
  if (pool == nullptr) {
    work(0, total);
  } else {
    pool->ParallelFor(total, cost, work);
  }
}

}  // namespace tf_tpu_emb

namespace tf_tpu_emb {

// ------------------------------------------------------------ training step

absl::Status Engine::Submit(int replica, std::vector<::tensorflow::Tensor> gradients,
                            const std::vector<float>& dynamic_inputs,
                            ::tsl::thread::ThreadPool* pool) {
  // Allocated before anything changes: an allocation failure leaves the
  // engine as it was.
  std::vector<std::unique_ptr<StepPart>> parts, fresh(num_replicas_);
  auto part = std::make_unique<StepPart>();
  {
    std::unique_lock<std::mutex> lock(queue_mu_);
    if (in_flight_state_[replica] != kTraining) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SendTPUEmbeddingGradients: replica ", replica,
          in_flight_state_[replica] == kInference
              ? " received an inference-mode batch; gradients can only be sent for a "
                "batch enqueued in training mode"
              : " has no batch to send gradients for: run RecvTPUEmbeddingActivations "
                "first, and send once per Recv"));
    }
    part->batch = std::move(in_flight_[replica]);
    part->gradients = std::move(gradients);
    in_flight_state_[replica] = kNone;
    parts_[replica] = std::move(part);
    if (++submitted_ < num_replicas_) return absl::OkStatus();
    parts.swap(parts_);
    parts_.swap(fresh);
    submitted_ = 0;
    applying_ = true;
  }
  auto applied = [this] {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      applying_ = false;
    }
    step_barrier_.NotifyAll();
  };
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
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (submitted_ == 0) return;
    for (int r = 0; r < num_replicas_; ++r) {
      if (parts_[r]) step_errors_[r] = reason;
      parts_[r].reset();
    }
    submitted_ = 0;
  }
  step_barrier_.NotifyAll();
}

absl::Status Engine::WaitForStep(int replica) {
  if (pipelined_) return absl::OkStatus();
  std::unique_lock<std::mutex> lock(queue_mu_);
  auto waiting = [&] {
    std::string missing;
    for (int r = 0; r < num_replicas_; ++r) {
      if (!parts_[r]) absl::StrAppend(&missing, missing.empty() ? "" : ", ", r);
    }
    return absl::StrCat(
        "RecvTPUEmbeddingActivations on replica ", replica,
        applying_ ? " waited for the previous training step to be applied"
                  : absl::StrCat(" waited for the previous step's gradients from replica(s) ",
                                 missing, " (of ", num_replicas_,
                                 ", num_tensor_cores), which never sent them"));
  };
  const absl::Status status = step_barrier_.Wait(
      lock,
      [&] { return !step_errors_[replica].empty() || (!parts_[replica] && !applying_); },
      waiting);
  if (!status.ok()) return status;
  if (!step_errors_[replica].empty()) {
    const std::string error = std::move(step_errors_[replica]);
    step_errors_[replica].clear();
    return absl::AbortedError(absl::StrCat(
        "RecvTPUEmbeddingActivations: the previous training step was aborted: ", error));
  }
  return absl::OkStatus();
}

void Engine::CancelWaits(const std::string& reason) {
  std::lock_guard<std::mutex> lock(queue_mu_);
  step_barrier_.Cancel(reason);
}

namespace {

// One occurrence of an id in the global batch: it contributes coef * grad
// to the id's row gradient.
struct Contribution {
  int64_t id;
  float coef;
  const float* grad;
};

struct TableStep {
  Table* table = nullptr;
  RowArgs args{};  // lr, dynamic, hp; row pointers filled per row
  float hp[kMaxHyper] = {};
  float decay = 0;  // effective weight decay factor
  bool clip_g_lo = false, clip_g_hi = false, clip_w_lo = false, clip_w_hi = false;
  float g_lo = 0, g_hi = 0, w_lo = 0, w_hi = 0;
  bool accumulate = true, non_lazy = false;
  std::vector<Contribution> contributions;  // grouped by partition
  std::vector<int64_t> partition_starts;
  std::vector<uint8_t> touched;             // non-lazy tables only
};

// Gradient clipping, the optimizer, weight decay (from the pre-update
// weight), weight clipping: one row of one table.
void UpdateRow(const TableStep& ts, int64_t id, float* g, float* w_old) {
  Table& t = *ts.table;
  const int dim = t.dimension;
  RowArgs a = ts.args;
  a.w = t.state[0]->data() + id * dim;
  for (size_t i = 1; i < t.state.size(); ++i) a.s[i - 1] = t.state[i]->data() + id * dim;
  a.g = g;
  a.dim = dim;
  a.hp = ts.hp;
  if (ts.clip_g_lo || ts.clip_g_hi) {
    const float lo = ts.clip_g_lo ? ts.g_lo : -std::numeric_limits<float>::infinity();
    const float hi = ts.clip_g_hi ? ts.g_hi : std::numeric_limits<float>::infinity();
    for (int d = 0; d < dim; ++d) g[d] = std::min(std::max(g[d], lo), hi);
  }
  if (ts.decay != 0) std::memcpy(w_old, a.w, sizeof(float) * dim);
  t.optimizer->update(a);
  if (ts.decay != 0) {
    for (int d = 0; d < dim; ++d) a.w[d] -= ts.decay * w_old[d];
  }
  if (ts.clip_w_lo || ts.clip_w_hi) {
    const float lo = ts.clip_w_lo ? ts.w_lo : -std::numeric_limits<float>::infinity();
    const float hi = ts.clip_w_hi ? ts.w_hi : std::numeric_limits<float>::infinity();
    for (int d = 0; d < dim; ++d) a.w[d] = std::min(std::max(a.w[d], lo), hi);
  }
}

// Prefetches every state row (parameters and slots) of row `id`.
inline void PrefetchRow(const Table& t, int64_t id) {
  const int64_t offset = id * t.dimension;
  for (const auto& buffer : t.state) {
    const char* row = reinterpret_cast<const char*>(buffer->data() + offset);
    for (int b = 0; b < t.dimension * 4; b += 64) __builtin_prefetch(row + b, 1);
  }
}

inline int PartitionOf(int64_t id, int bits) {
  return bits == 0 ? 0
                   : static_cast<int>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >>
                                      (64 - bits));
}

// Accumulates (or, without gradient accumulation, applies one by one) the
// contributions [begin, end) of one partition: ids of a partition belong to
// no other, so partitions update disjoint rows.  Order is the contribution
// order, so results do not depend on the number of threads.
void ApplyPartition(TableStep& ts, int64_t begin, int64_t end) {
  const int dim = ts.table->dimension;
  std::vector<float> g(dim), w_old(dim);
  const Contribution* c = ts.contributions.data();
  if (!ts.accumulate) {
    for (int64_t i = begin; i < end; ++i) {
      for (int d = 0; d < dim; ++d) g[d] = c[i].coef * c[i].grad[d];
      UpdateRow(ts, c[i].id, g.data(), w_old.data());
      if (ts.non_lazy) ts.touched[c[i].id] = 1;
    }
    return;
  }
  // Open-addressing map id -> slot, then one accumulator row per unique id.
  const int64_t n = end - begin;
  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  std::vector<int64_t> keys(cap, -1);
  std::vector<int32_t> slot_of(cap);
  std::vector<int32_t> slot(n);
  std::vector<int64_t> uniques;
  uniques.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = c[begin + i].id;
    uint64_t h = (static_cast<uint64_t>(id) * 0xC2B2AE3D27D4EB4Full) & (cap - 1);
    while (keys[h] != -1 && keys[h] != id) h = (h + 1) & (cap - 1);
    if (keys[h] == -1) {
      keys[h] = id;
      slot_of[h] = uniques.size();
      uniques.push_back(id);
    }
    slot[i] = slot_of[h];
  }
  std::vector<float> acc(uniques.size() * dim, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    float* dst = acc.data() + static_cast<int64_t>(slot[i]) * dim;
    const float coef = c[begin + i].coef;
    const float* src = c[begin + i].grad;
    for (int d = 0; d < dim; ++d) dst[d] += coef * src[d];
  }
  constexpr size_t kAhead = 4;  // rows are random: fetch them ahead of use
  for (size_t u = 0; u < std::min(kAhead, uniques.size()); ++u) PrefetchRow(*ts.table, uniques[u]);
  for (size_t u = 0; u < uniques.size(); ++u) {
    if (u + kAhead < uniques.size()) PrefetchRow(*ts.table, uniques[u + kAhead]);
    UpdateRow(ts, uniques[u], acc.data() + u * dim, w_old.data());
    if (ts.non_lazy) ts.touched[uniques[u]] = 1;
  }
}

}  // namespace

void Engine::ApplyStep(const std::vector<std::unique_ptr<StepPart>>& parts,
                       const std::vector<float>& dynamic_inputs,
                       ::tsl::thread::ThreadPool* pool) {
  const int num_tables = tables_.size();
  std::vector<TableStep> steps(num_tables);
  auto run = [&](int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    if (pool != nullptr) pool->ParallelFor(n, cost, fn);
    else fn(0, n);
  };
  // Per table: its hyper-parameters and every contribution of the global
  // batch (outputs in order, then replicas, then bags), grouped by partition.
  run(num_tables, 1 << 20, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      TableStep& ts = steps[t];
      Table& table = tables_[t];
      const OptimizationParameters& p = table.params;
      ts.table = &table;
      table.optimizer->read(p, ts.hp);
      const float lr = p.learning_rate().has_dynamic()
                           ? dynamic_inputs[p.learning_rate().dynamic().tag()]
                           : p.learning_rate().constant();
      ts.args.lr = lr;
      if (p.has_frequency_aware_adagrad() && p.frequency_aware_adagrad().has_step_counter()) {
        ts.args.dynamic = dynamic_inputs[p.frequency_aware_adagrad().step_counter().tag()];
      }
      ts.decay = p.weight_decay_factor() *
                 (p.multiply_weight_decay_factor_by_learning_rate() ? lr : 1.0f);
      const auto& gc = p.gradient_clipping_limits();
      ts.clip_g_lo = gc.has_lower(); ts.g_lo = gc.lower().value();
      ts.clip_g_hi = gc.has_upper(); ts.g_hi = gc.upper().value();
      const auto& wc = p.clipping_limits();
      ts.clip_w_lo = wc.has_lower(); ts.w_lo = wc.lower().value();
      ts.clip_w_hi = wc.has_upper(); ts.w_hi = wc.upper().value();
      ts.accumulate = UsesGradientAccumulation(p);
      ts.non_lazy = table.optimizer->non_lazy(p);
      if (ts.non_lazy) ts.touched.assign(table.vocabulary_size, 0);

      int64_t total = 0;
      for (size_t o = 0; o < outputs_.size(); ++o) {
        if (outputs_[o].table != t) continue;
        for (const auto& part : parts) total += part->batch.outputs[o].ids.size();
      }
      int bits = 0;
      while (bits < 6 && (int64_t{4096} << bits) < total) ++bits;
      const int num_partitions = 1 << bits;
      std::vector<int64_t> count(num_partitions + 1, 0);
      for (size_t o = 0; o < outputs_.size(); ++o) {
        if (outputs_[o].table != t) continue;
        for (const auto& part : parts) {
          for (int64_t id : part->batch.outputs[o].ids) ++count[PartitionOf(id, bits) + 1];
        }
      }
      for (int i = 0; i < num_partitions; ++i) count[i + 1] += count[i];
      ts.partition_starts = count;
      ts.contributions.resize(total);
      std::vector<int64_t> cursor(count.begin(), count.end() - 1);
      const int dim = table.dimension;
      for (size_t o = 0; o < outputs_.size(); ++o) {
        if (outputs_[o].table != t) continue;
        for (const auto& part : parts) {
          const OutputBatch& ob = part->batch.outputs[o];
          const float* grads = part->gradients[o].flat<float>().data();
          const int64_t bags = ob.offsets.size() - 1;
          for (int64_t b = 0; b < bags; ++b) {
            const int64_t lo = ob.offsets[b], hi = ob.offsets[b + 1];
            if (lo == hi) continue;
            const float scale = BagScale(ob.slot_combiners[b % ob.slot_combiners.size()],
                                         ob.weights.empty() ? nullptr : ob.weights.data() + lo,
                                         hi - lo);
            for (int64_t k = lo; k < hi; ++k) {
              const float w = ob.weights.empty() ? 1.0f : ob.weights[k];
              const int64_t id = ob.ids[k];
              ts.contributions[cursor[PartitionOf(id, bits)]++] = {id, w * scale, grads + b * dim};
            }
          }
        }
      }
    }
  });
  // Every (table, partition) is an independent task over disjoint rows.
  std::vector<std::pair<int, int>> tasks;
  for (int t = 0; t < num_tables; ++t) {
    for (size_t i = 0; i + 1 < steps[t].partition_starts.size(); ++i) {
      if (steps[t].partition_starts[i + 1] > steps[t].partition_starts[i]) tasks.push_back({t, i});
    }
  }
  run(tasks.size(), 1 << 20, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      TableStep& ts = steps[tasks[i].first];
      ApplyPartition(ts, ts.partition_starts[tasks[i].second],
                     ts.partition_starts[tasks[i].second + 1]);
    }
  });
  // Non-lazy optimizers: every row the step did not touch sees g = 0.
  for (int t = 0; t < num_tables; ++t) {
    TableStep& ts = steps[t];
    if (!ts.non_lazy) continue;
    const int dim = ts.table->dimension;
    run(ts.table->vocabulary_size, 50 * dim, [&](int64_t begin, int64_t end) {
      std::vector<float> g(dim), w_old(dim);
      for (int64_t id = begin; id < end; ++id) {
        if (ts.touched[id]) continue;
        std::fill(g.begin(), g.end(), 0.0f);
        UpdateRow(ts, id, g.data(), w_old.data());
      }
    });
  }
}

}  // namespace tf_tpu_emb
