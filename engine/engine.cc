#include "engine/engine.h"

// Engine lifecycle: the process registry (Current/Install/Shutdown, host
// leases) and configure (Init: validate and complete the config, reserve
// the memory budget, allocate tables and slots, fix every per-table setting).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tensorflow/core/platform/errors.h"

namespace tf_tpu_emb {

// --------------------------------------------------------- engine registry

namespace {
using Clock = std::chrono::steady_clock;

struct Entry {
  Engine* engine = nullptr;  // owns one reference
  double lease_seconds = 0;  // > 0: a host lease (EvictLeases/RenewLease)
  Clock::time_point renewed;
};

std::mutex g_registry_mu;
// name -> engine, under g_registry_mu.
std::map<std::string, Entry>& Registry() {
  static auto* registry = new std::map<std::string, Entry>();
  return *registry;
}
// Why recently evicted leased engines are gone (name -> reason), so that
// their trainer's next op says so; bounded, under g_registry_mu.
std::deque<std::pair<std::string, std::string>>& Gone() {
  static auto* gone = new std::deque<std::pair<std::string, std::string>>();
  return *gone;
}
constexpr size_t kMaxGone = 64;

void ForgetGone(const std::string& name) {
  auto& gone = Gone();
  gone.erase(std::remove_if(gone.begin(), gone.end(),
                            [&](const auto& g) { return g.first == name; }),
             gone.end());
}

std::string Seconds(double s) { return absl::StrFormat("%.1f s", s); }

// The memory budget's reservations (Engine::ReserveMemory), under
// g_memory_mu: every live engine's bytes, and those of engines still
// allocating (not yet visible in MemAvailable).
std::mutex g_memory_mu;
int64_t g_reserved_bytes = 0;
int64_t g_pending_bytes = 0;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool LeaseRuns(const Entry& e) {
  return e.lease_seconds > 0 && SecondsSince(e.renewed) < e.lease_seconds;
}

// Uninstalls `it` (under g_registry_mu); the caller shuts the engine down
// outside the lock (ShutdownUnlocked).
Engine* Uninstall(std::map<std::string, Entry>::iterator it, const std::string& why) {
  Engine* engine = it->second.engine;
  if (!why.empty()) {
    Gone().push_back({it->first, why});
    if (Gone().size() > kMaxGone) Gone().pop_front();
  }
  Registry().erase(it);
  return engine;
}

void ShutdownUnlocked(Engine* engine, const std::string& reason) {
  // Kernels still running hold their own references.
  engine->CancelWaits(reason);
  engine->Unref();
}

// FailedPrecondition when a lease other than `name`'s runs and `takeover`
// is not set; else collects in *evicted the leased engines to remove (under
// g_registry_mu).
absl::Status CheckLeasesLocked(const std::string& name, bool takeover,
                               std::vector<Engine*>* evicted) {
  auto& registry = Registry();
  for (auto it = registry.begin(); it != registry.end();) {
    const Entry& e = it->second;
    if (it->first == name || e.lease_seconds <= 0) {
      ++it;
      continue;
    }
    const double idle = SecondsSince(e.renewed);
    if (LeaseRuns(e) && !takeover) {
      return absl::FailedPreconditionError(
          absl::StrCat("this host's tables are held by trainer session '", it->first,
                       "' (its last heartbeat was ", Seconds(idle), " ago; its lease of ",
                       Seconds(e.lease_seconds), " ends in ", Seconds(e.lease_seconds - idle),
                       "): shut that trainer's TPUEmbedding down, wait for its lease to end, or "
                       "build with takeover=True"));
    }
    const std::string why = LeaseRuns(e)
                                ? absl::StrCat("it was taken over by trainer session '", name, "'")
                                : absl::StrCat("its lease of ", Seconds(e.lease_seconds),
                                               " ended without a heartbeat (for ", Seconds(idle),
                                               ") and trainer session '", name, "' took the host");
    evicted->push_back(Uninstall(it++, why));
  }
  return absl::OkStatus();
}
}  // namespace

std::string Engine::Label(const std::string& name) {
  return name.empty() ? "the default TPU embedding engine"
                      : absl::StrCat("TPU embedding engine '", name, "'");
}

absl::Status Engine::Current(const std::string& op, Engine** engine, const std::string& name) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    for (const auto& [gone, why] : Gone()) {
      if (gone == name) {
        return absl::FailedPreconditionError(absl::StrCat(
            op, ": ", Label(name), " is not configured any more: ", why,
            "; this trainer lost the host: build the TPUEmbedding again (takeover=True "
            "to take the host back) and restore the last checkpoint"));
      }
    }
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": ", Label(name), " is not configured; run ConfigureTPUEmbedding",
                     name.empty() ? "" : absl::StrCat(" with engine='", name, "'"), " first"));
  }
  it->second.engine->Ref();
  *engine = it->second.engine;
  return absl::OkStatus();
}

absl::Status Engine::Install(EnginePtr engine, const std::string& name) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  if (Registry().count(name) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ConfigureTPUEmbedding: ", Label(name),
        " is already configured; run ShutdownTPUEmbedding before configuring it again"));
  }
  ForgetGone(name);
  Registry()[name].engine = engine.release();
  return absl::OkStatus();
}

absl::Status Engine::EvictLeases(const std::string& name, bool takeover) {
  std::vector<Engine*> evicted;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    status = CheckLeasesLocked(name, takeover, &evicted);
  }
  for (Engine* e : evicted) ShutdownUnlocked(e, "its host lease was taken over");
  return status;
}

absl::Status Engine::InstallLeased(EnginePtr engine, const std::string& name,
                                   double lease_seconds) {
  std::vector<Engine*> evicted;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    // A concurrent configure may have taken the host since EvictLeases.
    status = CheckLeasesLocked(name, /*takeover=*/false, &evicted);
    if (status.ok() && Registry().count(name) != 0) {
      status = absl::FailedPreconditionError(
          absl::StrCat("ConfigureTPUEmbeddingHostShard: ", Label(name), " is already configured"));
    }
    if (status.ok()) {
      ForgetGone(name);
      Entry& entry = Registry()[name];
      entry.engine = engine.release();
      entry.lease_seconds = lease_seconds;
      entry.renewed = Clock::now();
    }
  }
  for (Engine* e : evicted) ShutdownUnlocked(e, "its host lease ended");
  return status;
}

void Engine::RenewLease(const std::string& name, std::string* lost, int64_t* step_count) {
  Engine* engine = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto it = Registry().find(name);
    if (it != Registry().end()) {
      it->second.renewed = Clock::now();
      engine = it->second.engine;
      engine->Ref();
    }
  }
  if (engine == nullptr) {
    Engine* none = nullptr;
    *lost = std::string(Current("RenewTPUEmbeddingLease", &none, name).message());
    *step_count = -1;
    return;
  }
  {
    std::shared_lock<std::shared_mutex> tables(engine->tables_mutex());
    *step_count = static_cast<int64_t>(engine->steps_applied());
  }
  engine->Unref();
  lost->clear();
}

std::string Engine::ClaimHost(const std::string& name, bool takeover) {
  std::vector<Engine*> evicted;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    status = CheckLeasesLocked(name, takeover, &evicted);
  }
  for (Engine* e : evicted) ShutdownUnlocked(e, "its host lease was taken over");
  return std::string(status.message());
}

std::string Engine::LeasedEngine() {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (const auto& [name, entry] : Registry()) {
    if (LeaseRuns(entry)) return name;
  }
  return "";
}

bool Engine::IsConfigured(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  return Registry().count(name) != 0;
}

void Engine::Shutdown(const std::string& name) {
  Engine* old = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    auto it = Registry().find(name);
    if (it != Registry().end()) old = Uninstall(it, "");
  }
  if (old != nullptr) ShutdownUnlocked(old, "ShutdownTPUEmbedding ran while this op waited");
}

namespace {
// A reference to every installed engine (for the process-wide wait controls).
std::vector<EnginePtr> LiveEngines() {
  std::vector<EnginePtr> engines;
  std::lock_guard<std::mutex> lock(g_registry_mu);
  for (auto& entry : Registry()) {
    entry.second.engine->Ref();
    engines.emplace_back(entry.second.engine);
  }
  return engines;
}
}  // namespace

void Engine::InterruptAllWaits(const std::string& reason) {
  for (auto& engine : LiveEngines()) engine->InterruptWaits(reason);
}

void Engine::CloseWaits(double grace_seconds) {
  WaitsClosing& closing = WaitsClosing::Get();
  const auto deadline =
      DeadlineTimer::Clock::now() + std::chrono::duration_cast<DeadlineTimer::Clock::duration>(
                                        std::chrono::duration<double>(grace_seconds));
  closing.grace_seconds = grace_seconds;
  closing.deadline = deadline.time_since_epoch().count();
  closing.closing = true;
  for (auto& engine : LiveEngines()) {
    std::lock_guard<std::mutex> lock(engine->queue_mu_);
    engine->step_barrier_.Shorten(deadline);
  }
}

int64_t Engine::LiveStateBytes() {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  return g_reserved_bytes;
}

Engine::~Engine() {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  g_reserved_bytes -= reserved_bytes_;
  if (reservation_pending_) g_pending_bytes -= reserved_bytes_;
}

bool Engine::stochastic_rounding() const {
  return std::any_of(tables_.begin(), tables_.end(), [](const Table& t) { return t.bf16; });
}

std::string Engine::DebugString() const {
  return absl::StrCat("tf_tpu_emb engine with ", tables_.size(), " tables, ", outputs_.size(),
                      " outputs, ", num_replicas_, " replicas");
}

absl::Status Engine::ResolveShard(const std::string& op, int t, int num_shards, int shard_id,
                                  LocalShard* shard) const {
  const Table& table = tables_[t];
  if (!host_sharded_) {
    absl::StatusOr<int64_t> rows = NumIdsInShard(table.vocabulary_size, shard_id, num_shards);
    if (!rows.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": table '", table.name, "': ", rows.status().message()));
    }
    *shard = {*rows, num_shards, shard_id};
    return absl::OkStatus();
  }
  if (num_shards != num_hosts_ || shard_id != host_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": table '", table.name, "': this engine is host ", host_id_, " of ",
                     num_hosts_, " and holds only shard ", host_id_, " of ", num_hosts_,
                     " of every table; use num_shards=", num_hosts_, ", shard_id=", host_id_,
                     " (got num_shards=", num_shards, ", shard_id=", shard_id, ")"));
  }
  *shard = {table.vocabulary_size, 1, 0};
  return absl::OkStatus();
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

absl::Status Engine::Create(const std::string& config_bytes, EnginePtr* engine, int host_id) {
  EnginePtr e(new Engine());
  TF_RETURN_IF_ERROR(e->Init(config_bytes, host_id));
  *engine = std::move(e);
  return absl::OkStatus();
}

namespace {

// Collects the OptimizerDynamicInput tags of a table: its learning rate and
// its optimizer's other dynamic inputs.
void CollectDynamicTags(const OptimizationParameters& p, const OptimizerSpec& spec,
                        std::set<int>* tags) {
  if (p.learning_rate().has_dynamic()) tags->insert(p.learning_rate().dynamic().tag());
  std::vector<int> extra;
  spec.dynamic_tags(p, &extra);
  tags->insert(extra.begin(), extra.end());
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
      return absl::InvalidArgumentError(
          absl::StrCat("TF_TPU_EMB_MEMORY_LIMIT_BYTES must be a non-negative integer number of "
                       "bytes, got '",
                       env, "'"));
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

// The bytes of every table's state (parameters and slots) over `rows[t]`
// rows of table t (this engine's shard); *largest names the biggest three.
absl::Status StateBytes(const TPUEmbeddingConfiguration& config, const std::vector<int64_t>& rows,
                        int64_t* total_bytes, std::string* largest) {
  std::vector<std::pair<int64_t, int>> bytes;  // (bytes, table)
  int64_t total = 0;
  for (int t = 0; t < config.table_descriptor_size(); ++t) {
    absl::StatusOr<int64_t> b = TableStateBytes(config, t, rows[t]);
    if (!b.ok()) return b.status();
    if (!CheckedAdd(total, *b, &total)) {
      return absl::InvalidArgumentError("the tables' total size in bytes overflows int64");
    }
    bytes.push_back({*b, t});
  }
  *total_bytes = total;
  std::sort(bytes.begin(), bytes.end(), std::greater<>());
  for (size_t i = 0; i < std::min<size_t>(3, bytes.size()); ++i) {
    absl::StrAppend(largest, i ? ", " : "", "'", config.table_descriptor(bytes[i].second).name(),
                    "' ", bytes[i].first);
  }
  return absl::OkStatus();
}

}  // namespace

// The memory budget is a reservation: under one lock, the tables' bytes are
// checked against the budget and reserved before anything is allocated, so
// engines configured at the same instant cannot both pass; ~Engine (a failed
// configure or a shutdown) returns them.  TF_TPU_EMB_MEMORY_LIMIT_BYTES
// bounds every live engine together; the measured budgets (MemAvailable, a
// cgroup's room) already see allocated engines, so only reservations still
// being allocated (pending) are subtracted from them.  ResourceExhausted
// names what the others hold.
absl::Status Engine::ReserveMemory(const std::vector<int64_t>& rows) {
  int64_t total = 0;
  std::string largest;
  TF_RETURN_IF_ERROR(StateBytes(config_, rows, &total, &largest));
  std::lock_guard<std::mutex> lock(g_memory_mu);
  int64_t budget = -1;
  std::string source;
  TF_RETURN_IF_ERROR(MemoryBudget(&budget, &source));
  const bool limit = source == "TF_TPU_EMB_MEMORY_LIMIT_BYTES";
  const int64_t others = limit ? g_reserved_bytes : g_pending_bytes;
  if (budget >= 0 && !(total <= budget && others <= budget - total)) {
    std::string held;
    if (others > 0) {
      held = limit ? absl::StrCat(" (other live engines hold ", others, " bytes)")
                   : absl::StrCat(" (other engines being configured now have reserved ", others,
                                  " bytes not yet allocated)");
    }
    return absl::ResourceExhaustedError(
        absl::StrCat("ConfigureTPUEmbedding: the tables and their optimizer slots need ", total,
                     " bytes", held, " but the memory budget is ", budget, " bytes (", source,
                     "); largest tables (bytes): ", largest,
                     ". Set TF_TPU_EMB_MEMORY_LIMIT_BYTES to change the budget."));
  }
  reserved_bytes_ = total;
  reservation_pending_ = true;
  g_reserved_bytes += total;
  g_pending_bytes += total;
  return absl::OkStatus();
}

void Engine::CommitReservation() {
  std::lock_guard<std::mutex> lock(g_memory_mu);
  if (reservation_pending_) g_pending_bytes -= reserved_bytes_;
  reservation_pending_ = false;
}

absl::Status Engine::Init(const std::string& config_bytes, int host_id) {
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
    return absl::UnimplementedError(
        absl::StrCat("spmd_sharding with num_cores_per_replica ",
                     config_.spmd_sharding().num_cores_per_replica(),
                     " is not supported by tf_tpu_emb's CPU engine (use 1 core per replica)"));
  }
  num_replicas_ = std::max(1, config_.num_tensor_cores());
  host_sharded_ = host_id >= 0;
  const bool routing_only = host_id == kRoutingOnly;
  if (host_sharded_) {
    if (config_.num_hosts() < 1 || host_id >= config_.num_hosts()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ConfigureTPUEmbeddingHostShard: host_id ", host_id,
                       " is not a host of the config's "
                       "num_hosts ",
                       config_.num_hosts(), "; must be in [0, num_hosts)"));
    }
    num_hosts_ = config_.num_hosts();
    host_id_ = host_id;
  }

  std::set<int> tags;
  std::set<std::string> names;
  tables_.resize(config_.table_descriptor_size());
  for (int t = 0; t < config_.table_descriptor_size(); ++t) {
    const auto& desc = config_.table_descriptor(t);
    const std::string label = TableLabel(config_, t);
    if (!desc.name().empty() && !names.insert(desc.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("two tables are named '", desc.name(), "'"));
    }
    const OptimizationParameters& p = desc.optimization_parameters();
    const OptimizerSpec* spec = FindOptimizer(p.parameters_case());
    if (spec == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": No optimization algorithm specified"));
    }
    if (!spec->implemented) {
      return absl::UnimplementedError(
          absl::StrCat(label, " uses the ", spec->proto_field,
                       " optimizer, which tf_tpu_emb does not implement"));
    }
    if (p.learning_rate().has_dynamic() && p.learning_rate().dynamic().tag() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, " has a negative dynamic learning rate tag ", p.learning_rate().dynamic().tag()));
    }
    CollectDynamicTags(p, *spec, &tags);
    Table& table = tables_[t];
    table.name = desc.name();
    // The rows this host holds: its shard of the table (all of it on one
    // host; none on host k >= vocabulary_size, as in TF's own layout).
    table.vocabulary_size =
        host_sharded_ ? HostLayout(config_, t).Rows(host_id_) : desc.vocabulary_size();
    table.dimension = desc.dimension();
    table.params = p;
    table.optimizer = spec;
    table.update = ReadUpdateSettings(p, *spec);
    if (!table.update.has_learning_rate && table_without_learning_rate_ < 0) {
      table_without_learning_rate_ = t;
    }
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
      return absl::InvalidArgumentError(
          absl::StrCat("dynamic learning rate tags must be 0, 1, ..., n-1 without gaps; "
                       "tag ",
                       expected - 1, " is not used"));
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

  queues_.resize(num_replicas_);
  routed_sequence_.assign(num_replicas_, 0);
  in_flight_.resize(num_replicas_);
  in_flight_state_.assign(num_replicas_, kNoBatch);
  parts_.resize(num_replicas_);
  step_errors_.resize(num_replicas_);
  deferred_waiting_.assign(num_replicas_, false);
  looked_since_send_.assign(num_replicas_, false);
  num_dynamic_ = tags.size();
  pipelined_ = config_.pipeline_execution_with_tensor_core();
  lookahead_ = pipelined_ && host_sharded_;
  ahead_.resize(num_replicas_);
  early_batch_.assign(num_replicas_, nullptr);
  if (routing_only) return absl::OkStatus();
  std::vector<int64_t> rows;
  for (const Table& table : tables_) rows.push_back(table.vocabulary_size);
  TF_RETURN_IF_ERROR(ReserveMemory(rows));
  TF_RETURN_IF_ERROR(ReadStorageFromEnvironment(&tables_));
  for (Table& table : tables_) {
    const int64_t n = table.vocabulary_size * table.dimension;  // bounded by ValidateConfig
    auto params = std::make_unique<FloatBuffer>();
    TF_RETURN_IF_ERROR(params->Allocate(n, 0.0f, table.bf16));
    table.state.push_back(std::move(params));
    float init[kMaxSlots];
    table.optimizer->slot_init(table.params, init);
    for (size_t i = 0; i < table.optimizer->slots.size(); ++i) {
      auto buf = std::make_unique<FloatBuffer>();
      TF_RETURN_IF_ERROR(buf->Allocate(n, init[i], table.bf16));
      table.state.push_back(std::move(buf));
    }
    if (table.update.non_lazy) table.touched.assign(table.vocabulary_size, 0);
  }
  CommitReservation();
  absl::StatusOr<double> timeout = StepBarrier<Batch>::TimeoutFromEnvironment();
  if (!timeout.ok()) return timeout.status();
  step_barrier_.set_timeout_seconds(*timeout);
  const char* check = std::getenv("TF_TPU_EMB_CHECK_NUMERICS");
  check_numerics_ = check != nullptr && (std::string(check) == "1" || std::string(check) == "true");
  return absl::OkStatus();
}

}  // namespace tf_tpu_emb
