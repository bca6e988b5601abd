// Fuzz target: the sharded training step end to end against one engine
// (engine/routing.h): a worker's Router plans and packs each replica's
// batch for S embedding hosts, every host (an Engine holding its shard)
// takes its packet (EnqueueRoutedBatch), Recv's it and looks it up as
// RecvTPUEmbeddingRoutedActivations does, the worker combines the hosts'
// outputs into the replica's activations, splits the activation gradients
// per host, and every host applies its part of the step, in the background
// as SendTPUEmbeddingRoutedGradients does by default.  An unsharded engine
// of the same config runs the same batches and gradients beside it: the
// reference.  Config from fuzz/targets/fuzz_config.h (every optimizer,
// 1-4 hosts and replicas, DIV or MOD sharding, feature or table mode).
// clang-format off
// fuzz-sources: engine/engine.cc engine/table.cc engine/step.cc engine/apply.cc engine/lookup.cc engine/routing.cc engine/routed_mapper.cc engine/mapper_base.cc engine/positional_mappers.cc engine/feature_batch_mapper.cc
// fuzz-needs: tensorflow
// clang-format on
//
// Two steps, pipelined or not.  The input picks the routing form (auto,
// bags, rows), whether the worker's and hosts' loops use a thread pool, per
// host and replica whether its Recv starts before its packet arrives (the
// wait, resumed by the enqueue), whether the hosts apply in the background,
// and whether the
// second step's packets reach the hosts before the first step's Sends (as
// a worker routes the next batch meanwhile: the hosts' Recvs of it may look
// up the rows the update applied first while it applies the rest).  Then
// one of Recv's other endings: a wait interrupted (Ctrl-C) and one
// cancelled (shutdown), naming what it waited for; a wait for a replica
// that has not sent; a wait that times out; a malformed timeout setting.
//
// Invariants: every packet the router made is accepted; each host's Recv
// output has the floats the plan gives it and answers the plan's sequence;
// the combined activations equal the reference's lookup, bit for bit where
// engine/routing.h says they are (the rows form, or one host) and up to the
// order of the hosts' partial sums otherwise; after each step every
// table's parameters and slots on the hosts equal the reference's rows bit
// for bit (both until the rows form has added several replicas' sums of a
// row first, a reassociation: Step::Backward); each Recv resumes exactly
// once, with the status its ending gives.
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/sharding.h"
#include "engine/engine.h"
#include "engine/input_mappers.h"
#include "engine/routed_mapper.h"
#include "engine/routing.h"
#include "fuzz/targets/fuzz_batch.h"
#include "fuzz/targets/fuzz_config.h"
#include "fuzz/targets/fuzz_input.h"
#include "tensorflow/core/framework/tensor.h"
#include "tsl/platform/env.h"
#include "tsl/platform/threadpool.h"

namespace tf_tpu_emb {
namespace {

using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

constexpr uint64_t kSession = 0x5EC0DE5EC0DE0002ull;
constexpr const char* kRouter = "fuzz_routed_step";
constexpr const char* kEnqueueOp = "EnqueueTPUEmbeddingRoutedBatch";

::tsl::thread::ThreadPool* Pool() {
  static auto* pool = new ::tsl::thread::ThreadPool(::tsl::Env::Default(), "fuzz_routed", 2);
  return pool;
}

const InputMapper& Mapper() {
  static const auto* mapper = new std::unique_ptr<InputMapper>(RoutedBatchMapper(kEnqueueOp));
  return **mapper;
}

// Parameter d of global row `row` of table t (slots keep their init).
float Initial(int t, int64_t row, int d) {
  return static_cast<float>((t * 131 + row * 31 + d * 7) % 17 - 8) / 8.0f;
}

// A Recv resolved now or later, on whichever thread resolves its wait.
struct PendingRecv {
  std::mutex mu;
  std::condition_variable cv;
  int resumes = 0;
  absl::Status status;
  Batch batch;
};

std::shared_ptr<PendingRecv> StartRecv(Engine& e, int replica) {
  auto p = std::make_shared<PendingRecv>();
  absl::Status status;
  Batch batch;
  const bool now = e.Recv(replica, &status, &batch, [p](absl::Status s, Batch b) {
    std::lock_guard<std::mutex> lock(p->mu);
    ++p->resumes;
    p->status = std::move(s);
    p->batch = std::move(b);
    p->cv.notify_all();
  });
  if (now) {
    std::lock_guard<std::mutex> lock(p->mu);
    ++p->resumes;
    p->status = std::move(status);
    p->batch = std::move(batch);
  }
  return p;
}

bool Resolved(PendingRecv& p) {
  std::lock_guard<std::mutex> lock(p.mu);
  return p.resumes > 0;
}

// Waits for the Recv's one resume (a wait no ending resolves is a finding).
void Await(PendingRecv& p) {
  std::unique_lock<std::mutex> lock(p.mu);
  const bool resumed = p.cv.wait_for(lock, std::chrono::seconds(20), [&] { return p.resumes > 0; });
  FUZZ_CHECK(resumed, "a Recv was never resumed");
  FUZZ_CHECK(p.resumes == 1, "a Recv resumed %d times", p.resumes);
}

// Awaits a Recv that must succeed, then looks its batch up as the Recv
// kernels do (under the tables' shared lock) and puts it in flight.
// Returns RecvTPUEmbeddingRoutedActivations' output: each output's bags x
// dim floats end to end, then the sequence; *sequence: the batch's.
std::vector<float> Finish(Engine& e, int replica, PendingRecv& p, int64_t* sequence,
                          ::tsl::thread::ThreadPool* pool) {
  Await(p);
  FUZZ_CHECK(p.status.ok(), "%s", std::string(p.status.message()).c_str());
  Batch batch = std::move(p.batch);
  std::vector<int64_t> at;
  int64_t floats = 0;
  for (size_t o = 0; o < batch.outputs.size(); ++o) {
    at.push_back(floats);
    floats += static_cast<int64_t>(batch.outputs[o].offsets.size() - 1) *
              e.table(e.outputs()[o].table).dimension;
  }
  // As RecvTPUEmbeddingRoutedActivations' output: then the sequence's floats.
  std::vector<float> out(floats + packed::kSequenceFloats);
  PutSequence(batch.sequence, out.data() + floats);
  std::vector<float*> ptrs;
  for (int64_t a : at) ptrs.push_back(out.data() + a);
  {
    std::shared_lock<std::shared_mutex> lock(e.tables_mutex());
    e.Lookup(batch, ptrs, pool);
  }
  *sequence = batch.sequence;
  e.SetInFlight(replica, std::move(batch));
  return out;
}

// Equal up to a reassociation of a sum: within `relative` of the terms'
// size; past 1e30 one order may overflow where another does not.
bool Close(float a, float b, float relative) {
  if (std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b))) return true;
  if (!(std::fabs(a) < 1e30f) || !(std::fabs(b) < 1e30f)) return true;
  return std::fabs(a - b) <= relative * (1.0f + std::fabs(a) + std::fabs(b));
}

// Every host's rows of every table and slot against the reference's.
void CompareTables(const TPUEmbeddingConfiguration& config, Engine& ref,
                   const std::vector<EnginePtr>& hosts, int step) {
  for (int t = 0; t < ref.num_tables(); ++t) {
    const ShardLayout layout = HostLayout(config, t);
    const Table& whole = ref.table(t);
    for (size_t k = 0; k < hosts.size(); ++k) {
      const Table& part = hosts[k]->table(t);
      FUZZ_CHECK(part.vocabulary_size == layout.Rows(k) && part.state.size() == whole.state.size());
      for (size_t i = 0; i < whole.state.size(); ++i) {
        const float* w = whole.state[i]->data();
        const float* h = part.state[i]->data();
        for (int64_t r = 0; r < part.vocabulary_size; ++r) {
          const int64_t g = layout.Global(k, r);
          for (int d = 0; d < whole.dimension; ++d) {
            const float a = w[g * whole.dimension + d], b = h[r * whole.dimension + d];
            FUZZ_CHECK(std::memcmp(&a, &b, sizeof a) == 0,
                       "step %d: table %d state %zu row %ld (host %zu row %ld) dim %d: "
                       "%.9g on the hosts, %.9g on one engine; config %s",
                       step, t, i, static_cast<long>(g), k, static_cast<long>(r), d, b, a,
                       config.ShortDebugString().c_str());
          }
        }
      }
    }
  }
}

// One replica's batch routed and packed for every host.
struct Routed {
  Batch batch;  // the whole batch, global ids: the reference's
  int64_t sequence = 0;
  std::vector<Tensor> packets;  // per host
};

Routed Route(fuzz::FuzzInput& in, Router& router, int replica, RouteChoice choice,
             ::tsl::thread::ThreadPool* pool) {
  Routed out;
  out.batch = fuzz::RandomBatch(in, router.engine());
  out.batch.training = true;
  auto plan = std::make_unique<RoutePlan>();
  const absl::Status planned = router.Plan(out.batch, choice, pool, plan.get());
  FUZZ_CHECK(planned.ok(), "%s", std::string(planned.message()).c_str());
  plan->session = kSession;
  std::vector<char*> at;
  for (int k = 0; k < router.num_hosts(); ++k) {
    out.packets.emplace_back(::tensorflow::DT_UINT8, TensorShape({plan->host_bytes[k]}));
    at.push_back(reinterpret_cast<char*>(out.packets.back().flat<uint8_t>().data()));
  }
  FUZZ_CHECK(router.Pack(*plan, at, pool).ok());
  out.sequence = plan->sequence;
  FUZZ_CHECK(router.Push(replica, std::move(plan)).ok());
  return out;
}

void Deliver(Engine& host, int replica, const Tensor& packet, ::tsl::thread::ThreadPool* pool) {
  const absl::Status s = EnqueueRoutedBatch(Mapper(), kEnqueueOp, &host, replica, packet, pool);
  FUZZ_CHECK(s.ok(), "host %d refused the router's packet: %s", host.host_id(),
             std::string(s.message()).c_str());
}

bool Contains(const absl::Status& s, const char* text) {
  return s.message().find(text) != absl::string_view::npos;
}

// The state every Recv ending leaves: resumed once with `code` and `text`.
void ExpectEnded(PendingRecv& p, absl::StatusCode code, const char* text) {
  Await(p);
  FUZZ_CHECK(p.status.code() == code && Contains(p.status, text), "%s",
             p.status.ToString().c_str());
}

class Step {
 public:
  Step(fuzz::FuzzInput& in, const TPUEmbeddingConfiguration& config, Router& router, Engine& ref,
       std::vector<EnginePtr>& hosts)
      : in_(in), config_(config), router_(router), ref_(ref), hosts_(hosts) {
    const RouteChoice choices[] = {RouteChoice::kAuto, RouteChoice::kBags, RouteChoice::kRows};
    choice_ = choices[in.In(0, 2)];
    pool_ = in.ConsumeBool() ? Pool() : nullptr;
    background_ = in.ConsumeBool();
  }

  int replicas() const { return ref_.num_replicas(); }

  std::vector<Routed> RouteAll() {
    std::vector<Routed> routed;
    for (int r = 0; r < replicas(); ++r) routed.push_back(Route(in_, router_, r, choice_, pool_));
    return routed;
  }

  void DeliverAll(const std::vector<Routed>& routed) {
    for (int r = 0; r < replicas(); ++r) {
      for (size_t k = 0; k < hosts_.size(); ++k)
        Deliver(*hosts_[k], r, routed[r].packets[k], pool_);
    }
  }

  // Recv on every host (before or after the packets arrive, as the input
  // says, unless they have arrived), the worker's combine against the
  // reference's lookup.
  void Forward(const std::vector<Routed>& routed, bool delivered, int step) {
    const int hosts = static_cast<int>(hosts_.size());
    std::vector<std::vector<std::shared_ptr<PendingRecv>>> pending(replicas());
    if (!delivered) {
      for (int r = 0; r < replicas(); ++r) {
        for (int k = 0; k < hosts; ++k) {
          if (in_.ConsumeBool()) {  // Recv first: it waits, the enqueue resumes it
            pending[r].push_back(StartRecv(*hosts_[k], r));
            Deliver(*hosts_[k], r, routed[r].packets[k], pool_);
          } else {
            Deliver(*hosts_[k], r, routed[r].packets[k], pool_);
            pending[r].push_back(StartRecv(*hosts_[k], r));
          }
        }
      }
    } else {
      for (int r = 0; r < replicas(); ++r) {
        for (int k = 0; k < hosts; ++k) pending[r].push_back(StartRecv(*hosts_[k], r));
      }
    }
    for (int r = 0; r < replicas(); ++r) {
      std::vector<std::vector<float>> host_out(hosts);
      std::vector<const float*> host_ptrs;
      for (int k = 0; k < hosts; ++k) {
        int64_t sequence = 0;
        host_out[k] = Finish(*hosts_[k], r, *pending[r][k], &sequence, pool_);
        FUZZ_CHECK(sequence == routed[r].sequence, "host %d answered #%ld for #%ld", k,
                   static_cast<long>(sequence), static_cast<long>(routed[r].sequence));
        host_ptrs.push_back(host_out[k].data());
      }
      std::unique_ptr<RoutePlan> plan;
      FUZZ_CHECK(router_.Pop(r, routed[r].sequence, &plan).ok());
      for (int k = 0; k < hosts; ++k) {
        FUZZ_CHECK(static_cast<int64_t>(host_out[k].size()) ==
                       plan->host_floats[k] + packed::kSequenceFloats,
                   "host %d's Recv output has %zu floats, the plan %ld", k, host_out[k].size(),
                   static_cast<long>(plan->host_floats[k]));
      }
      // The worker's activations and the reference's.
      const auto& outs = ref_.outputs();
      std::vector<std::vector<float>> combined(outs.size()), expected(outs.size());
      std::vector<float*> combined_ptrs, expected_ptrs;
      for (size_t o = 0; o < outs.size(); ++o) {
        const int64_t n = outs[o].positions * ref_.table(outs[o].table).dimension;
        combined[o].assign(n, std::nanf(""));
        expected[o].assign(n, std::nanf(""));
        combined_ptrs.push_back(combined[o].data());
        expected_ptrs.push_back(expected[o].data());
      }
      FUZZ_CHECK(router_.Combine(*plan, host_ptrs, combined_ptrs, pool_).ok());
      ref_.Enqueue(r, routed[r].batch);
      auto mine = StartRecv(ref_, r);
      FUZZ_CHECK(Resolved(*mine), "the reference's Recv waited");
      FUZZ_CHECK(mine->status.ok(), "%s", mine->status.ToString().c_str());
      ref_.Lookup(mine->batch, expected_ptrs, nullptr);
      ref_.SetInFlight(r, std::move(mine->batch));
      for (size_t o = 0; o < outs.size(); ++o) {
        if (drift_) break;
        const bool exact = plan->outputs[o].form == packed::kRows || hosts == 1;
        for (size_t j = 0; j < combined[o].size(); ++j) {
          FUZZ_CHECK(exact ? std::memcmp(&combined[o][j], &expected[o][j], 4) == 0
                           : Close(combined[o][j], expected[o][j], 1e-5f),
                     "step %d replica %d output %zu (form %d) float %zu: combined %.9g, one "
                     "engine %.9g",
                     step, r, o, static_cast<int>(plan->outputs[o].form), j, combined[o][j],
                     expected[o][j]);
        }
      }
      for (const RoutedOutput& ro : plan->outputs) rows_form_ |= ro.form == packed::kRows;
      router_.SetInFlight(r, std::move(plan));
    }
  }

  // Every replica's gradients to the reference and, split, to the hosts;
  // `only` < 0: every replica, else that replica alone.
  void Backward(int only = -1) {
    const int hosts = static_cast<int>(hosts_.size());
    const auto& outs = ref_.outputs();
    for (int r = 0; r < replicas(); ++r) {
      if (only >= 0 && r != only) continue;
      std::vector<Tensor> grads;
      std::vector<const float*> grad_ptrs;
      for (const OutputSpec& o : outs) {
        Tensor g(::tensorflow::DT_FLOAT, o.recv_shape);
        float* v = g.flat<float>().data();
        for (int64_t k = 0; k < g.NumElements(); ++k) v[k] = in_.FiniteIn(-1, 1);
        grad_ptrs.push_back(v);
        grads.push_back(std::move(g));
      }
      std::vector<float> rates(ref_.num_dynamic_inputs());
      for (float& rate : rates) rate = in_.FiniteIn(0, 0.5f);
      std::unique_ptr<RoutePlan> plan;
      FUZZ_CHECK(router_.TakeInFlight("SplitTPUEmbeddingRoutedGradients", r, &plan).ok());
      // Each host's gradients as its Send gets them: floats, rates, sequence.
      std::vector<Tensor> host_grads;
      std::vector<float*> host_ptrs;
      for (int k = 0; k < hosts; ++k) {
        const int64_t n = plan->host_floats[k];
        host_grads.emplace_back(
            ::tensorflow::DT_FLOAT,
            TensorShape({n + static_cast<int64_t>(rates.size()) + packed::kSequenceFloats}));
        float* v = host_grads.back().flat<float>().data();
        std::fill(v, v + n, std::nanf(""));
        std::copy(rates.begin(), rates.end(), v + n);
        PutSequence(plan->sequence, v + n + rates.size());
        host_ptrs.push_back(v);
      }
      FUZZ_CHECK(router_.Split(*plan, grad_ptrs, host_ptrs, pool_).ok());
      FUZZ_CHECK(ref_.Submit(r, std::move(grads), rates, nullptr).ok());
      for (int k = 0; k < hosts; ++k) {
        std::vector<int64_t> floats;
        int64_t sequence = 0;
        Engine& host = *hosts_[k];
        FUZZ_CHECK(host.InFlightGradientFloats(r, &floats, &sequence).ok());
        FUZZ_CHECK(sequence == plan->sequence);
        std::vector<const float*> parts;
        const float* at = host_ptrs[k];
        int64_t total = 0;
        for (int64_t f : floats) {
          parts.push_back(at);
          at += f;
          total += f;
        }
        FUZZ_CHECK(total == plan->host_floats[k]);
        for (int64_t j = 0; j < total; ++j) {
          FUZZ_CHECK(!std::isnan(host_ptrs[k][j]), "Split left host %d's float %ld unwritten", k,
                     static_cast<long>(j));
        }
        const absl::Status sent =
            host.Submit(r, {host_grads[k]}, std::move(parts), rates, Pool(), background_);
        FUZZ_CHECK(sent.ok(), "%s", std::string(sent.message()).c_str());
      }
    }
    // The rows form adds the replicas' sums of a row first (engine/routing.h):
    // from here on the hosts' tables may differ from the reference's by that
    // reassociation, which an optimizer whose defaults divide by a difference
    // of near-equal sums (centered RMSProp: ms - mg^2, epsilon 0) turns into
    // any value, inf or NaN: no comparison holds after it.
    drift_ |= rows_form_ && replicas() > 1;
  }

  void CheckTables(int step) {
    ref_.WaitForApply();  // pipelined: the deferred update
    for (auto& host : hosts_) host->WaitForApply();
    if (!drift_) CompareTables(config_, ref_, hosts_, step);
  }

 private:
  fuzz::FuzzInput& in_;
  const TPUEmbeddingConfiguration& config_;
  Router& router_;
  Engine& ref_;
  std::vector<EnginePtr>& hosts_;
  RouteChoice choice_ = RouteChoice::kAuto;
  ::tsl::thread::ThreadPool* pool_ = nullptr;
  bool background_ = true;
  bool rows_form_ = false;
  bool drift_ = false;
};

// Recv's endings other than a batch, on host 0 (its steps are over).
void Endings(fuzz::FuzzInput& in, Step& step, const std::string& config_bytes, bool pipelined,
             std::vector<EnginePtr>& hosts) {
  Engine& host = *hosts[0];
  switch (in.In(0, 4)) {
    case 0: {  // interrupted (present waits only), then shut down
      auto waiting = StartRecv(host, 0);
      FUZZ_CHECK(!Resolved(*waiting), "a Recv with nothing enqueued did not wait");
      host.InterruptWaits("fuzz: interrupted");
      ExpectEnded(*waiting, absl::StatusCode::kCancelled, "nothing was enqueued for replica 0");
      FUZZ_CHECK(Contains(waiting->status, "fuzz: interrupted"));
      auto again = StartRecv(host, 0);
      FUZZ_CHECK(!Resolved(*again), "an interrupt ended a later wait");
      host.CancelWaits("fuzz: shut down");
      ExpectEnded(*again, absl::StatusCode::kCancelled, "fuzz: shut down");
      auto after = StartRecv(host, 0);  // a Recv after shutdown ends at once
      FUZZ_CHECK(Resolved(*after) && after->status.code() == absl::StatusCode::kCancelled);
      break;
    }
    case 1: {  // a replica waits for the step's other replicas' gradients
      // (pipelined, a Recv does not wait for the step's gradients)
      if (step.replicas() < 2 || pipelined) break;
      const std::vector<Routed> routed = step.RouteAll();
      step.Forward(routed, false, 3);
      step.Backward(/*only=*/0);
      auto waiting = StartRecv(host, 0);
      FUZZ_CHECK(!Resolved(*waiting), "a Recv did not wait for the other replicas' gradients");
      host.InterruptWaits("fuzz: interrupted");
      ExpectEnded(*waiting, absl::StatusCode::kCancelled,
                  "waited for the previous step's gradients from replica(s) 1");
      for (int r = 1; r < step.replicas(); ++r) step.Backward(r);
      step.CheckTables(3);
      break;
    }
    case 2: {  // a wait that times out (an engine of its own: a short limit)
      setenv("TF_TPU_EMB_STEP_TIMEOUT_SECONDS", "0.002", 1);
      EnginePtr quick;
      const absl::Status made = Engine::Create(config_bytes, &quick);
      unsetenv("TF_TPU_EMB_STEP_TIMEOUT_SECONDS");
      FUZZ_CHECK(made.ok(), "%s", std::string(made.message()).c_str());
      auto waiting = StartRecv(*quick, 0);
      ExpectEnded(*waiting, absl::StatusCode::kDeadlineExceeded, "timed out after 0.002 s");
      FUZZ_CHECK(Contains(waiting->status, "nothing was enqueued for replica 0"));
      break;
    }
    case 3: {  // a malformed timeout setting: configure refuses it
      const char* const malformed[] = {"0", "-1", "abc", "1e9", "nan", "5s", "inf"};
      const std::string value = malformed[in.In(0, 6)];
      setenv("TF_TPU_EMB_STEP_TIMEOUT_SECONDS", value.c_str(), 1);
      EnginePtr refused;
      const absl::Status made = Engine::Create(config_bytes, &refused);
      unsetenv("TF_TPU_EMB_STEP_TIMEOUT_SECONDS");
      FUZZ_CHECK(made.code() == absl::StatusCode::kInvalidArgument &&
                     Contains(made, "TF_TPU_EMB_STEP_TIMEOUT_SECONDS"),
                 "timeout '%s': %s", value.c_str(), made.ToString().c_str());
      break;
    }
    default: break;
  }
}

}  // namespace
}  // namespace tf_tpu_emb

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("TF_CPP_MIN_LOG_LEVEL", "3", 0);
  unsetenv("TF_TPU_EMB_STORAGE");
  unsetenv("TF_TPU_EMB_STEP_TIMEOUT_SECONDS");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tf_tpu_emb;  // NOLINT
  fuzz::FuzzInput in(data, size);
  fuzz::ConfigLimits limits;
  limits.every_optimizer = true;
  TPUEmbeddingConfiguration config = fuzz::BuildConfig(in, limits);
  config.set_mode(TPUEmbeddingConfiguration::TRAINING);
  // Pipelined, a host looks up ahead (Engine's lookahead_) and every update
  // waits for the next lookups.
  config.set_pipeline_execution_with_tensor_core(in.ConsumeBool());
  const std::string bytes = config.SerializeAsString();
  EnginePtr ref;
  if (!Engine::Create(bytes, &ref).ok()) return 0;
  if (ref->table_without_learning_rate() >= 0) return 0;
  std::shared_ptr<Router> router;
  Router::Drop(kRouter);
  const absl::Status got = Router::Get(kRouter, bytes, &router);
  FUZZ_CHECK(got.ok(), "a config one engine takes, the router refuses: %s",
             std::string(got.message()).c_str());
  std::vector<EnginePtr> hosts(router->num_hosts());
  for (int k = 0; k < router->num_hosts(); ++k) {
    const absl::Status made = Engine::Create(bytes, &hosts[k], k);
    FUZZ_CHECK(made.ok(), "host %d: %s", k, std::string(made.message()).c_str());
    hosts[k]->set_routed_session(kSession);
  }
  // The same parameters on one engine and on the hosts' shards.
  for (int t = 0; t < ref->num_tables(); ++t) {
    const ShardLayout layout = HostLayout(config, t);
    Table& whole = ref->table(t);
    for (int64_t g = 0; g < whole.vocabulary_size; ++g) {
      for (int d = 0; d < whole.dimension; ++d) {
        whole.state[0]->data()[g * whole.dimension + d] = Initial(t, g, d);
      }
    }
    for (int k = 0; k < router->num_hosts(); ++k) {
      Table& part = hosts[k]->table(t);
      for (int64_t r = 0; r < part.vocabulary_size; ++r) {
        for (int d = 0; d < part.dimension; ++d) {
          part.state[0]->data()[r * part.dimension + d] = Initial(t, layout.Global(k, r), d);
        }
      }
    }
  }
  Step step(in, config, *router, *ref, hosts);
  const std::vector<Routed> first = step.RouteAll();
  step.Forward(first, false, 1);
  // The worker routes the next batch while the hosts apply this step, or
  // after it.
  const bool ahead = in.ConsumeBool();
  const std::vector<Routed> second = step.RouteAll();
  if (ahead) step.DeliverAll(second);
  step.Backward();
  // Unless the next lookups overlap the update (ahead, or pipelined: the
  // update waits for them), the tables after the first step.
  if (!ahead && !config.pipeline_execution_with_tensor_core()) step.CheckTables(1);
  step.Forward(second, ahead, 2);
  step.Backward();
  step.CheckTables(2);
  Endings(in, step, bytes, config.pipeline_execution_with_tensor_core(), hosts);
  for (auto& host : hosts) host->WaitForApply();
  Router::Drop(kRouter);
  return 0;
}
