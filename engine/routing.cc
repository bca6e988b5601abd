// The sharded data path's arithmetic (engine/routing.h): the worker's
// Router (registry, queues, plan, pack, combine, split).  The hosts' input
// mapper of packed batches is in engine/routed_mapper.cc.
#include "engine/routing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "absl/crc/crc32c.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/bag.h"
#include "core/cpu_dispatch.h"
#include "engine/mapper_base.h"

namespace tf_tpu_emb {

using mapping::ParallelForStatus;
using packed::Align8;
using packed::PayloadBytes;

absl::Status ParseRouteChoice(const std::string& form, RouteChoice* choice) {
  if (form == "auto") *choice = RouteChoice::kAuto;
  else if (form == "bags") *choice = RouteChoice::kBags;
  else if (form == "rows") *choice = RouteChoice::kRows;
  else if (form == "host_filter") *choice = RouteChoice::kHostFilter;
  else {
    return absl::InvalidArgumentError(absl::StrCat(
        "form must be \"auto\", \"bags\", \"rows\" or \"host_filter\", got \"", form, "\""));
  }
  return absl::OkStatus();
}

void PutSequence(int64_t sequence, float* out) { std::memcpy(out, &sequence, sizeof sequence); }

uint32_t packed::Checksum(const char* data, int64_t size) {
  static constexpr char kZero[8] = {};
  constexpr int64_t at = kChecksumWord * 8;
  absl::crc32c_t crc = absl::ComputeCrc32c(absl::string_view(data, at));
  crc = absl::ExtendCrc32c(crc, absl::string_view(kZero, 8));
  crc = absl::ExtendCrc32c(crc, absl::string_view(data + at + 8, size - at - 8));
  return static_cast<uint32_t>(crc);
}

int64_t GetSequence(const float* in) {
  int64_t sequence;
  std::memcpy(&sequence, in, sizeof sequence);
  return sequence;
}

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::mutex g_routers_mu;
std::map<std::string, std::shared_ptr<Router>>& Routers() {
  static auto* routers = new std::map<std::string, std::shared_ptr<Router>>();
  return *routers;
}

// The activations of a rows-form output: every bag reduced over the hosts'
// rows (laid end to end at `rows`) exactly as the engine's lookup reduces it
// over its table (core/bag.h, same order and the same CPU dispatch, so the
// same arithmetic).
TF_TPU_EMB_CPU_DISPATCH
void CombineRows(const float* rows, int dim, const OutputBatch& ob, const int64_t* row_of_id,
                 float* out) {
  const int64_t bags = ob.offsets.size() - 1;
  const auto identity = [](float x) { return x; };
  const auto none = [](int64_t) {};
  for (int64_t p = 0; p < bags; ++p) {
    const int64_t lo = ob.offsets[p], n = ob.offsets[p + 1] - lo;
    const Combiner c = ob.slot_combiners[p % ob.slot_combiners.size()];
    if (ob.weights.empty()) {
      ReduceBagWith<false>(rows, dim, row_of_id + lo, nullptr, n, c, out + p * dim, identity, none);
    } else {
      ReduceBagWith<true>(rows, dim, row_of_id + lo, ob.weights.data() + lo, n, c, out + p * dim,
                          identity, none);
    }
  }
}

// The gradients of a rows-form output: each row's sum over the batch of
// w * scale * g (the engine's per-row accumulation, engine/apply.cc, in the
// same order and with the same CPU dispatch).  `dst[j]` is the row of id j.
TF_TPU_EMB_CPU_DISPATCH
void SplitRows(const RoutedOutput& r, const OutputBatch& ob, const float* grads,
               const std::vector<float*>& dst) {
  const int dim = r.dim;
  const int64_t bags = ob.offsets.size() - 1;
  for (int64_t p = 0; p < bags; ++p) {
    const float scale = r.scale[p];
    const float* g = grads + p * dim;
    for (int64_t j = ob.offsets[p]; j < ob.offsets[p + 1]; ++j) {
      const float coef = (ob.weights.empty() ? 1.0f : ob.weights[j]) * scale;
      float* acc = dst[j];
      for (int d = 0; d < dim; ++d) acc[d] += coef * g[d];
    }
  }
}

}  // namespace

// ------------------------------------------------------------ the registry

absl::Status Router::Get(const std::string& name, const std::string& config,
                         std::shared_ptr<Router>* out) {
  std::lock_guard<std::mutex> lock(g_routers_mu);
  auto& routers = Routers();
  const auto it = routers.find(name);
  if (it != routers.end()) {
    if (it->second->config_ != config) {
      return absl::FailedPreconditionError(
          absl::StrCat("the embedding router '", name,
                       "' routes the batches of another config; shut it "
                       "down (ShutdownTPUEmbeddingRouter) before routing for a new one"));
    }
    *out = it->second;
    return absl::OkStatus();
  }
  std::shared_ptr<Router> router(new Router());
  TF_RETURN_IF_ERROR(Engine::Create(config, &router->engine_, Engine::kRoutingOnly));
  const Engine& e = *router->engine_;
  router->config_ = config;
  router->num_hosts_ = std::max(1, e.config().num_hosts());
  for (int t = 0; t < e.num_tables(); ++t) {
    router->layouts_.emplace_back(HostLayout(e.config(), t));
    router->per_id_updates_.push_back(!e.table(t).update.accumulate);
  }
  router->bags_for_.reset(new std::atomic<int>[e.num_tables()]);
  for (int t = 0; t < e.num_tables(); ++t) router->bags_for_[t] = 0;
  router->table_outputs_.resize(e.num_tables());
  for (int o = 0; o < static_cast<int>(e.outputs().size()); ++o) {
    router->table_outputs_[e.outputs()[o].table].push_back(o);
  }
  router->queues_.resize(e.num_replicas());
  router->in_flight_.resize(e.num_replicas());
  routers[name] = router;
  *out = std::move(router);
  return absl::OkStatus();
}

void Router::Drop(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_routers_mu);
  Routers().erase(name);
}

// ------------------------------------------------------------------ queues

absl::Status Router::Push(int replica, std::unique_ptr<RoutePlan> plan) {
  std::lock_guard<std::mutex> lock(mu_);
  if (replica < 0 || replica >= static_cast<int>(queues_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica ", replica, " is out of range: the config has ", queues_.size(),
                     " tensor core(s) (num_tensor_cores)"));
  }
  queues_[replica].push_back(std::move(plan));
  return absl::OkStatus();
}

absl::Status Router::Pop(int replica, int64_t sequence, std::unique_ptr<RoutePlan>* plan) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& queue = queues_.at(replica);
  while (!queue.empty() && queue.front()->sequence < sequence) queue.pop_front();
  if (queue.empty() || queue.front()->sequence != sequence) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the embedding hosts answered routed batch #", sequence, " of replica ", replica,
        ", which this worker did not route (or already combined): were the hosts' engines "
        "used by another worker process as replica ",
        replica, "?"));
  }
  *plan = std::move(queue.front());
  queue.pop_front();
  return absl::OkStatus();
}

void Router::SetInFlight(int replica, std::unique_ptr<RoutePlan> plan) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.at(replica) = std::move(plan);
}

absl::Status Router::TakeInFlight(const std::string& op, int replica,
                                  std::unique_ptr<RoutePlan>* plan) {
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<RoutePlan>& slot = in_flight_.at(replica);
  if (slot == nullptr || !slot->batch.training) {
    return absl::FailedPreconditionError(absl::StrCat(
        op, ": replica ", replica,
        slot == nullptr ? " has no routed batch to send gradients for: dequeue (Recv) first, "
                          "and send once per Recv"
                        : " received an inference-mode batch; gradients can only be sent for "
                          "a batch enqueued in training mode"));
  }
  *plan = std::move(slot);
  return absl::OkStatus();
}

// -------------------------------------------------------------------- plan

// The combiner scales, owners, local rows and bags-form split of output o.
void Router::PlanOutput(int o, bool host_filter, bool training, RoutePlan* plan) const {
  const Engine& e = *engine_;
  const int t = e.outputs()[o].table;
  const FastShardLayout& fast = layouts_[t];
  const ShardLayout& layout = fast.layout;
  const OutputBatch& ob = plan->batch.outputs[o];
  RoutedOutput& r = plan->outputs[o];
  const int hosts = num_hosts_;
  const int64_t bags = ob.offsets.size() - 1, n = ob.ids.size();
  const float* w = ob.weights.empty() ? nullptr : ob.weights.data();
  r.dim = e.table(t).dimension;
  r.carrier = o;
  r.ids64 = (host_filter ? layout.vocab : layout.Rows(0)) > kInt32Max;

  // The combiner scale of every bag, over the whole bag (core/bag.h).
  r.scale.assign(bags, 1.0f);
  bool all_sum = true;
  for (Combiner c : ob.slot_combiners) all_sum &= c == Combiner::kSum;
  if (!all_sum) {
    for (int64_t p = 0; p < bags; ++p) {
      const int64_t lo = ob.offsets[p];
      r.scale[p] = BagScale(ob.slot_combiners[p % ob.slot_combiners.size()], w ? w + lo : nullptr,
                            ob.offsets[p + 1] - lo);
    }
  }
  r.scales = training && !all_sum;

  // Owner and local row of every id.
  r.local.resize(n);
  if (hosts > 1) {
    r.owner.resize(n);
    for (int64_t j = 0; j < n; ++j) {
      int64_t k;
      fast.Map(ob.ids[j], &k, &r.local[j]);
      r.owner[j] = static_cast<int32_t>(k);
    }
  } else {
    std::copy(ob.ids.begin(), ob.ids.end(), r.local.begin());
  }

  // Bags form: the bags each host holds ids of.
  r.form = packed::kBags;
  r.bags.assign(hosts, {});
  r.host_ids.assign(hosts, 0);
  std::vector<int64_t> last(hosts, -1);
  for (int64_t p = 0; p < bags; ++p) {
    for (int64_t j = ob.offsets[p]; j < ob.offsets[p + 1]; ++j) {
      const int k = hosts > 1 ? r.owner[j] : 0;
      ++r.host_ids[k];
      if (last[k] != p) {
        last[k] = p;
        r.bags[k].push_back(p);
      }
    }
  }
}

// The form of table t's outputs: bags, or (smaller, or forced) rows.
void Router::PlanTable(int t, RouteChoice choice, bool training, RoutePlan* plan) const {
  const std::vector<int>& outs = table_outputs_[t];
  const bool host_filter = choice == RouteChoice::kHostFilter;
  for (int o : outs) PlanOutput(o, host_filter, training, plan);
  if (outs.empty() || choice == RouteChoice::kBags || host_filter ||
      (training && per_id_updates_[t])) {
    return;
  }
  if (choice == RouteChoice::kAuto) {  // bags won lately: keep it without counting
    int left = bags_for_[t].load(std::memory_order_relaxed);
    if (left > 0) {
      bags_for_[t].store(left - 1, std::memory_order_relaxed);
      return;
    }
  }
  // Rows form: each host's distinct rows of the table, in first-use order
  // (outputs in order, then the batch's order).
  const int hosts = num_hosts_;
  RoutedOutput& carrier = plan->outputs[outs[0]];
  std::vector<std::vector<int64_t>> rows(hosts);
  int64_t total = 0;
  for (int o : outs) total += plan->batch.outputs[o].ids.size();
  int64_t cap = 16;
  while (cap < 2 * total) cap <<= 1;
  thread_local std::vector<int64_t> keys, slot;
  keys.assign(cap, -1);
  slot.resize(cap);
  for (int o : outs) {
    RoutedOutput& r = plan->outputs[o];
    const std::vector<int64_t>& ids = plan->batch.outputs[o].ids;
    r.row_of_id.resize(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) {
      const int64_t id = ids[j];
      uint64_t h = (static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> 20 & (cap - 1);
      while (keys[h] != -1 && keys[h] != id) h = (h + 1) & (cap - 1);
      if (keys[h] == -1) {
        keys[h] = id;
        const int k = hosts > 1 ? r.owner[j] : 0;
        slot[h] = rows[k].size();
        rows[k].push_back(r.local[j]);
      }
      r.row_of_id[j] = slot[h];
    }
  }
  // Bytes of both forms (the batch, the Recv output, for training the
  // gradients), the smaller wins; a tie keeps bags (exact tables always).
  const int64_t dim = carrier.dim, id_bytes = carrier.ids64 ? 8 : 4, passes = training ? 2 : 1;
  int64_t bags_bytes = 0, rows_bytes = 0;
  for (int o : outs) {
    const RoutedOutput& r = plan->outputs[o];
    const int64_t flags = (plan->batch.outputs[o].weights.empty() ? 0 : packed::kWeights) |
                          (r.scales ? packed::kScales : 0) | (r.ids64 ? packed::kIds64 : 0);
    for (int k = 0; k < hosts; ++k) {
      const int64_t b = r.bags[k].size();
      bags_bytes += PayloadBytes(packed::kBags, b, r.host_ids[k], flags) + passes * b * dim * 4;
    }
  }
  for (int k = 0; k < hosts; ++k) {
    rows_bytes += Align8(rows[k].size() * id_bytes) + passes * rows[k].size() * dim * 4;
  }
  if (choice != RouteChoice::kRows && rows_bytes >= bags_bytes) {
    for (int o : outs) plan->outputs[o].row_of_id.clear();
    bags_for_[t].store(kRecheckSteps, std::memory_order_relaxed);
    return;
  }
  std::vector<int64_t> start(hosts + 1, 0);
  for (int k = 0; k < hosts; ++k) start[k + 1] = start[k] + rows[k].size();
  for (int o : outs) {
    RoutedOutput& r = plan->outputs[o];
    r.form = packed::kRows;
    r.carrier = outs[0];
    r.bags.clear();
    r.rows.assign(hosts, {});
    if (hosts > 1) {
      for (size_t j = 0; j < r.row_of_id.size(); ++j) r.row_of_id[j] += start[r.owner[j]];
    }
  }
  carrier.rows = std::move(rows);
  carrier.row_start = std::move(start);
}

absl::Status Router::Plan(Batch batch, RouteChoice choice, ::tsl::thread::ThreadPool* pool,
                          RoutePlan* plan) {
  const bool host_filter = choice == RouteChoice::kHostFilter;
  plan->batch = std::move(batch);
  plan->host_filter = host_filter;
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan->sequence = next_sequence_++;
  }
  const int outputs = engine_->outputs().size(), hosts = num_hosts_;
  const bool training = plan->batch.training;
  plan->outputs.assign(outputs, RoutedOutput());
  TF_RETURN_IF_ERROR(ParallelForStatus(pool, table_outputs_.size(), [&](int t) {
    PlanTable(t, choice, training, plan);
    return absl::OkStatus();
  }));
  plan->host_floats.assign(hosts, 0);
  plan->host_bytes.assign(hosts, 0);
  plan->host_float_offsets.assign(hosts, std::vector<int64_t>(outputs));
  plan->host_byte_offsets.assign(hosts, std::vector<int64_t>(outputs));
  for (int k = 0; k < hosts; ++k) {
    int64_t floats = 0, bytes = (packed::kHeaderWords + packed::kOutputWords * outputs) * 8;
    for (int o = 0; o < outputs; ++o) {
      const RoutedOutput& r = plan->outputs[o];
      const OutputBatch& ob = plan->batch.outputs[o];
      plan->host_float_offsets[k][o] = floats;
      floats += r.HostBags(k) * r.dim;
      plan->host_byte_offsets[k][o] = bytes;
      const int64_t flags = (ob.weights.empty() ? 0 : packed::kWeights) |
                            (r.scales ? packed::kScales : 0) | (r.ids64 ? packed::kIds64 : 0);
      if (host_filter) {
        bytes += PayloadBytes(packed::kBags, ob.offsets.size() - 1, ob.ids.size(), flags);
      } else if (r.form == packed::kRows) {
        bytes += PayloadBytes(packed::kRows, r.rows[k].size(), r.rows[k].size(), flags);
      } else {
        bytes += PayloadBytes(packed::kBags, r.bags[k].size(), r.host_ids[k], flags);
      }
    }
    plan->host_floats[k] = floats;
    plan->host_bytes[k] = bytes;
  }
  return absl::OkStatus();
}

// -------------------------------------------------------------------- pack

namespace {

// Where one output's arrays go in one host's packed batch.
struct Cursor {
  int32_t* length = nullptr;
  char* ids = nullptr;
  float* weight = nullptr;
  float* scale = nullptr;
  int64_t count = 0;  // ids of the current bag
};

template <typename Id>
void PutId(Cursor* c, int64_t id) {
  *reinterpret_cast<Id*>(c->ids) = static_cast<Id>(id);
  c->ids += sizeof(Id);
}

// Cursor of an output's bags-form arrays at `at`.
Cursor BagsCursor(char* at, int64_t bags, int64_t ids, int64_t flags) {
  Cursor c;
  const int64_t id_bytes = (flags & packed::kIds64) ? 8 : 4;
  c.length = reinterpret_cast<int32_t*>(at);
  c.ids = at + Align8(bags * 4);
  char* next = c.ids + Align8(ids * id_bytes);
  if (flags & packed::kWeights) {
    c.weight = reinterpret_cast<float*>(next);
    next += Align8(ids * 4);
  }
  if (flags & packed::kScales) c.scale = reinterpret_cast<float*>(next);
  return c;
}

}  // namespace

absl::Status Router::Pack(const RoutePlan& plan, const std::vector<char*>& out,
                          ::tsl::thread::ThreadPool* pool) const {
  const int outputs = plan.outputs.size();
  const int hosts = plan.host_filter ? 1 : num_hosts_;
  for (int k = 0; k < hosts; ++k) {
    int64_t* h = reinterpret_cast<int64_t*>(out[k]);
    const int64_t header[packed::kHeaderWords] = {packed::kMagic,
                                                  packed::kVersion,
                                                  num_hosts_,
                                                  plan.host_filter ? -1 : k,
                                                  outputs,
                                                  plan.batch.training ? 1 : 0,
                                                  plan.host_filter ? 1 : 0,
                                                  plan.sequence,
                                                  static_cast<int64_t>(plan.session),
                                                  0};
    std::memcpy(h, header, sizeof header);
    for (int o = 0; o < outputs; ++o) {
      const RoutedOutput& r = plan.outputs[o];
      const OutputBatch& ob = plan.batch.outputs[o];
      int64_t* meta = h + packed::kHeaderWords + packed::kOutputWords * o;
      const int64_t flags =
          (r.ids64 ? packed::kIds64 : 0) |
          (r.form == packed::kBags && !ob.weights.empty() ? packed::kWeights : 0) |
          (r.form == packed::kBags && r.scales ? packed::kScales : 0);
      if (plan.host_filter) {
        meta[0] = packed::kBags, meta[1] = ob.offsets.size() - 1, meta[2] = ob.ids.size();
      } else if (r.form == packed::kRows) {
        meta[0] = packed::kRows, meta[1] = meta[2] = r.rows[k].size();
      } else {
        meta[0] = packed::kBags, meta[1] = r.bags[k].size(), meta[2] = r.host_ids[k];
      }
      meta[3] = flags;
    }
  }
  TF_RETURN_IF_ERROR(ParallelForStatus(pool, outputs, [&](int o) {
    const RoutedOutput& r = plan.outputs[o];
    const OutputBatch& ob = plan.batch.outputs[o];
    const int64_t bags = ob.offsets.size() - 1;
    const bool ids64 = r.ids64;
    auto put = [ids64](Cursor* c, int64_t id) {
      if (ids64) PutId<int64_t>(c, id);
      else PutId<int32_t>(c, id);
    };
    if (plan.host_filter) {  // every bag, global ids: one batch for every host
      const int64_t* meta = reinterpret_cast<const int64_t*>(out[0]) + packed::kHeaderWords +
                            packed::kOutputWords * o;
      Cursor c = BagsCursor(out[0] + plan.host_byte_offsets[0][o], meta[1], meta[2], meta[3]);
      for (int64_t p = 0; p < bags; ++p) {
        *c.length++ = static_cast<int32_t>(ob.offsets[p + 1] - ob.offsets[p]);
        if (c.scale) *c.scale++ = r.scale[p];
      }
      for (size_t j = 0; j < ob.ids.size(); ++j) put(&c, ob.ids[j]);
      if (c.weight) std::memcpy(c.weight, ob.weights.data(), ob.weights.size() * 4);
      return absl::OkStatus();
    }
    if (r.form == packed::kRows) {
      for (int k = 0; k < num_hosts_; ++k) {
        Cursor c;
        c.ids = out[k] + plan.host_byte_offsets[k][o];
        for (int64_t row : r.rows[k]) put(&c, row);
      }
      return absl::OkStatus();
    }
    std::vector<Cursor> cursors(num_hosts_);
    for (int k = 0; k < num_hosts_; ++k) {
      const int64_t* meta = reinterpret_cast<const int64_t*>(out[k]) + packed::kHeaderWords +
                            packed::kOutputWords * o;
      cursors[k] = BagsCursor(out[k] + plan.host_byte_offsets[k][o], meta[1], meta[2], meta[3]);
    }
    std::vector<int> touched;
    for (int64_t p = 0; p < bags; ++p) {
      for (int64_t j = ob.offsets[p]; j < ob.offsets[p + 1]; ++j) {
        const int k = num_hosts_ > 1 ? r.owner[j] : 0;
        Cursor& c = cursors[k];
        if (c.count++ == 0) touched.push_back(k);
        put(&c, r.local[j]);
        if (c.weight) *c.weight++ = ob.weights[j];
      }
      for (int k : touched) {  // hosts in order of first id: each host's bags ascend
        Cursor& c = cursors[k];
        *c.length++ = static_cast<int32_t>(c.count);
        if (c.scale) *c.scale++ = r.scale[p];
        c.count = 0;
      }
      touched.clear();
    }
    return absl::OkStatus();
  }));
  // Last, each packet's checksum over its final bytes.
  return ParallelForStatus(pool, hosts, [&](int k) {
    const uint64_t sum = packed::Checksum(out[k], plan.host_bytes[k]);
    std::memcpy(out[k] + packed::kChecksumWord * 8, &sum, sizeof sum);
    return absl::OkStatus();
  });
}

// ------------------------------------------------------- combine and split

absl::Status Router::Combine(const RoutePlan& plan, const std::vector<const float*>& host,
                             const std::vector<float*>& out,
                             ::tsl::thread::ThreadPool* pool) const {
  // Rows form on several hosts: each table's rows, the hosts' end to end.
  std::vector<std::vector<float>> joined(table_outputs_.size());
  if (num_hosts_ > 1) {
    TF_RETURN_IF_ERROR(ParallelForStatus(pool, table_outputs_.size(), [&](int t) {
      if (table_outputs_[t].empty()) return absl::OkStatus();
      const int c = table_outputs_[t][0];
      const RoutedOutput& r = plan.outputs[c];
      // No row of the table in the batch: nothing to join (and memcpy must not
      // get the null data of an empty vector, even for 0 bytes).
      if (r.form != packed::kRows || r.row_start.back() == 0) return absl::OkStatus();
      joined[t].resize(r.row_start.back() * r.dim);
      for (int k = 0; k < num_hosts_; ++k) {
        if (r.rows[k].empty()) continue;
        std::memcpy(joined[t].data() + r.row_start[k] * r.dim,
                    host[k] + plan.host_float_offsets[k][c],
                    sizeof(float) * r.rows[k].size() * r.dim);
      }
      return absl::OkStatus();
    }));
  }
  return ParallelForStatus(pool, plan.outputs.size(), [&](int o) {
    const RoutedOutput& r = plan.outputs[o];
    const OutputBatch& ob = plan.batch.outputs[o];
    const int dim = r.dim;
    const int64_t bags = ob.offsets.size() - 1;
    float* dst = out[o];
    if (r.form == packed::kRows) {
      const float* rows = num_hosts_ > 1 ? joined[engine_->outputs()[o].table].data()
                                         : host[0] + plan.host_float_offsets[0][r.carrier];
      CombineRows(rows, dim, ob, r.row_of_id.data(), dst);
      return absl::OkStatus();
    }
    std::memset(dst, 0, sizeof(float) * bags * dim);
    for (int k = 0; k < num_hosts_; ++k) {
      const float* src = host[k] + plan.host_float_offsets[k][o];
      for (int64_t p : r.bags[k]) {
        float* a = dst + p * dim;
        for (int d = 0; d < dim; ++d) a[d] += src[d];
        src += dim;
      }
    }
    for (int64_t p = 0; p < bags; ++p) {  // as the lookup scales a bag (core/bag.h)
      const float scale = r.scale[p];
      if (scale != 1.0f) {
        for (int d = 0; d < dim; ++d) dst[p * dim + d] *= scale;
      }
    }
    return absl::OkStatus();
  });
}

absl::Status Router::Split(const RoutePlan& plan, const std::vector<const float*>& grads,
                           const std::vector<float*>& out, ::tsl::thread::ThreadPool* pool) const {
  // Per table: its outputs in order (a row's gradient sums them in order).
  return ParallelForStatus(pool, table_outputs_.size(), [&](int t) {
    for (int o : table_outputs_[t]) {
      const RoutedOutput& r = plan.outputs[o];
      const OutputBatch& ob = plan.batch.outputs[o];
      const int dim = r.dim;
      if (r.form == packed::kRows) {
        const RoutedOutput& c = plan.outputs[r.carrier];
        if (o == r.carrier) {
          for (int k = 0; k < num_hosts_; ++k) {
            std::memset(out[k] + plan.host_float_offsets[k][o], 0,
                        sizeof(float) * c.rows[k].size() * dim);
          }
        }
        std::vector<float*> dst(ob.ids.size());
        for (size_t j = 0; j < ob.ids.size(); ++j) {
          const int k = num_hosts_ > 1 ? r.owner[j] : 0;
          dst[j] = out[k] + plan.host_float_offsets[k][r.carrier] +
                   (r.row_of_id[j] - c.row_start[k]) * dim;
        }
        SplitRows(r, ob, grads[o], dst);
        continue;
      }
      for (int k = 0; k < num_hosts_; ++k) {
        float* dst = out[k] + plan.host_float_offsets[k][o];
        for (int64_t p : r.bags[k]) {
          std::memcpy(dst, grads[o] + p * dim, sizeof(float) * dim);
          dst += dim;
        }
      }
    }
    return absl::OkStatus();
  });
}

}  // namespace tf_tpu_emb
