// Unit tests of engine/: the StepBarrier, an input mapper, the forward
// lookup, the backward step, the shard copy and the router's split of a
// batch over host engines (engine/routing.h), on tiny tables whose
// expected values are computed by hand (docs/tpu_embedding_semantics.md).
// Linked with the engine's object files of the library build (the same
// flags; see tests/cpp/build.py), so only this file compiles here.
#include "engine/engine.h"

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/input_mappers.h"
#include "engine/routed_mapper.h"
#include "engine/routing.h"
#include "engine/step_barrier.h"
#include "engine/table.h"
#include "tests/cpp/unit.h"

namespace tf_tpu_emb {
namespace {

using Code = absl::StatusCode;
using ::tensorflow::DT_FLOAT;
using ::tensorflow::DT_INT64;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// A waiter's resumes, counted (each must run exactly once).
struct Resumed {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<absl::Status, int>> calls;
  StepBarrier<int>::Resume Callback() {
    return [this](absl::Status s, int payload) {
      std::lock_guard<std::mutex> lock(mu);
      calls.emplace_back(std::move(s), payload);
      cv.notify_all();
    };
  }
  // Waits (at most 60 s) until `n` resumes ran.
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return calls.size() >= n; });
  }
};

TEST(StepBarrierCancelEndsTheWait) {
  std::mutex mu;
  StepBarrier<int> barrier(&mu);
  Resumed resumed;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_TRUE(barrier.Wait(1, resumed.Callback(), [] { return "waiting for r1"; }, &status));
  }
  std::vector<std::pair<StepBarrier<int>::Resume, absl::Status>> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu);
    cancelled = barrier.Cancel("shut down");
  }
  ASSERT_EQ(cancelled.size(), size_t{1});
  cancelled[0].first(cancelled[0].second, 0);
  ASSERT_EQ(resumed.calls.size(), size_t{1});
  EXPECT_ERROR(resumed.calls[0].first, Code::kCancelled, "shut down; waiting for r1");
  // Every later wait is cancelled at once (and registers nothing).
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(!barrier.Wait(1, resumed.Callback(), [] { return "again"; }, &status));
  EXPECT_ERROR(status, Code::kCancelled, "again");
  EXPECT_TRUE(!barrier.HasWaiter(1));
}

// Ctrl-C (engine/interrupts_and_c_api.cc): Interrupt ends the waits present now, and later
// waits wait as usual; ActiveWaits (what the SIGINT handler reads) counts
// every registered waiter until it is claimed.
TEST(StepBarrierInterruptEndsOnlyPresentWaits) {
  std::mutex mu;
  StepBarrier<int> barrier(&mu);
  Resumed resumed;
  absl::Status status;
  const int before = ActiveWaits().load();
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_TRUE(barrier.Wait(0, resumed.Callback(), [] { return "waiting for r0"; }, &status));
  }
  EXPECT_EQ(ActiveWaits().load(), before + 1);
  std::vector<std::pair<StepBarrier<int>::Resume, absl::Status>> interrupted;
  {
    std::lock_guard<std::mutex> lock(mu);
    interrupted = barrier.Interrupt("interrupted (SIGINT)");
  }
  EXPECT_EQ(ActiveWaits().load(), before);
  ASSERT_EQ(interrupted.size(), size_t{1});
  interrupted[0].first(interrupted[0].second, 0);
  EXPECT_ERROR(resumed.calls[0].first, Code::kCancelled, "interrupted (SIGINT); waiting for r0");
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_TRUE(barrier.Wait(0, resumed.Callback(), [] { return "again"; }, &status));
    EXPECT_TRUE(barrier.HasWaiter(0));
  }
  StepBarrier<int>::Resume next;
  {
    std::lock_guard<std::mutex> lock(mu);
    next = barrier.Take(0);
  }
  ASSERT_TRUE(next != nullptr);
  next(absl::OkStatus(), 7);
  ASSERT_EQ(resumed.calls.size(), size_t{2});
  EXPECT_TRUE(resumed.calls[1].first.ok() && resumed.calls[1].second == 7);
  EXPECT_EQ(ActiveWaits().load(), before);
}

// Shorten brings a long wait's deadline forward (the main thread finished).
TEST(StepBarrierShortenBringsTheDeadlineForward) {
  std::mutex mu;
  StepBarrier<int> barrier(&mu);
  barrier.set_timeout_seconds(3600);
  Resumed resumed;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_TRUE(barrier.Wait(2, resumed.Callback(), [] { return "waiting for r2"; }, &status));
    barrier.Shorten(DeadlineTimer::Clock::now() + std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(resumed.WaitFor(1));
  EXPECT_ERROR(resumed.calls[0].first, Code::kDeadlineExceeded, "waiting for r2");
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(!barrier.HasWaiter(2));
}

TEST(StepBarrierTimesOut) {
  std::mutex mu;
  StepBarrier<int> barrier(&mu);
  barrier.set_timeout_seconds(0.01);
  Resumed resumed;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_TRUE(
        barrier.Wait(1, resumed.Callback(), [] { return "replica 1 never sent"; }, &status));
  }
  ASSERT_TRUE(resumed.WaitFor(1));
  EXPECT_ERROR(resumed.calls[0].first, Code::kDeadlineExceeded,
               "replica 1 never sent (timed out after 0.01 s; TF_TPU_EMB_STEP_TIMEOUT_SECONDS");
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(!barrier.HasWaiter(1));
  EXPECT_TRUE(barrier.Take(1) == nullptr);
}

// The timer thread waits for its earliest entry; removing that entry (a
// Recv handed its batch) and adding another wakes the thread, which must not
// read the removed entry's deadline (a use after free the sanitizer build
// reports).  The new entry must still fire.
TEST(DeadlineTimerSurvivesRemovalOfTheEntryItWaitsFor) {
  DeadlineTimer& timer = DeadlineTimer::Get();
  for (int round = 0; round < 20; ++round) {
    const auto far = DeadlineTimer::Clock::now() + std::chrono::hours(1);
    const DeadlineTimer::Key key = timer.Add(far, [] {});
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the thread waits for it
    timer.Remove(key);
    std::mutex mu;
    std::condition_variable cv;
    bool fired = false;
    timer.Add(DeadlineTimer::Clock::now() + std::chrono::milliseconds(1), [&] {
      std::lock_guard<std::mutex> lock(mu);
      fired = true;
      cv.notify_one();
    });
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return fired; }));
  }
}

TEST(StepBarrierTakeHandsOverTheOldestWaiterOfItsKeyOnly) {
  std::mutex mu;
  StepBarrier<int> barrier(&mu);
  Resumed r0, r1a, r1b;
  absl::Status status;
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_TRUE(barrier.Wait(0, r0.Callback(), [] { return "0"; }, &status));
  ASSERT_TRUE(barrier.Wait(1, r1a.Callback(), [] { return "1a"; }, &status));
  ASSERT_TRUE(barrier.Wait(1, r1b.Callback(), [] { return "1b"; }, &status));
  EXPECT_TRUE(barrier.Take(2) == nullptr);
  StepBarrier<int>::Resume first = barrier.Take(1);
  ASSERT_TRUE(first != nullptr);
  first(absl::OkStatus(), 7);
  EXPECT_EQ(r1a.calls.size(), size_t{1});
  EXPECT_EQ(r1b.calls.size(), size_t{0});
  EXPECT_EQ(r0.calls.size(), size_t{0});
  EXPECT_EQ(r1a.calls[0].second, 7);
  EXPECT_TRUE(barrier.HasWaiter(0) && barrier.HasWaiter(1));
  barrier.Take(1)(absl::OkStatus(), 8);
  barrier.Take(0)(absl::OkStatus(), 9);
  EXPECT_TRUE(!barrier.HasWaiter(0) && !barrier.HasWaiter(1));
  EXPECT_EQ(r1b.calls[0].second, 8);
  EXPECT_EQ(r0.calls[0].second, 9);
}

// Hand-over, timeout and cancel race on many waiters: each resumes once.
TEST(StepBarrierResumesEachWaiterExactlyOnceUnderRaces) {
  std::mutex mu;
  StepBarrier<int> barrier(&mu);
  barrier.set_timeout_seconds(0.002);
  constexpr int kWaiters = 400;
  Resumed resumed;
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < kWaiters; ++i) {
      ASSERT_TRUE(barrier.Wait(i % 4, resumed.Callback(), [] { return "w"; }, &status));
    }
  }
  std::vector<std::thread> takers;
  for (int k = 0; k < 4; ++k) {
    takers.emplace_back([&, k] {
      for (;;) {
        StepBarrier<int>::Resume r;
        {
          std::lock_guard<std::mutex> lock(mu);
          r = barrier.Take(k);
          if (r == nullptr && !barrier.HasWaiter(k)) return;
        }
        if (r) r(absl::OkStatus(), k);
      }
    });
  }
  std::vector<std::pair<StepBarrier<int>::Resume, absl::Status>> cancelled;
  {
    std::lock_guard<std::mutex> lock(mu);
    cancelled = barrier.Cancel("shut down");
  }
  for (auto& [r, s] : cancelled) r(s, -1);
  for (auto& t : takers) t.join();
  ASSERT_TRUE(resumed.WaitFor(kWaiters));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a late duplicate would show
  std::lock_guard<std::mutex> lock(resumed.mu);
  EXPECT_EQ(resumed.calls.size(), size_t{kWaiters});
}

TEST(StepBarrierTimeoutFromEnvironment) {
  setenv(StepBarrier<int>::kTimeoutVariable, "2.5", 1);
  absl::StatusOr<double> t = StepBarrier<int>::TimeoutFromEnvironment();
  ASSERT_OK(t.status());
  EXPECT_NEAR(*t, 2.5, 0.0);
  setenv(StepBarrier<int>::kTimeoutVariable, "-1", 1);
  EXPECT_ERROR(StepBarrier<int>::TimeoutFromEnvironment().status(), Code::kInvalidArgument,
               "TF_TPU_EMB_STEP_TIMEOUT_SECONDS must be a number of seconds");
  unsetenv(StepBarrier<int>::kTimeoutVariable);
  t = StepBarrier<int>::TimeoutFromEnvironment();
  ASSERT_OK(t.status());
  EXPECT_NEAR(*t, StepBarrier<int>::kDefaultTimeoutSeconds, 0.0);
}

// One SGD table "t" (vocab 4, dim 2, lr 0.5) and one feature "f" of
// input_shape [2] (two bags) with the given combiner.
EnginePtr TinyEngine() {
  TPUEmbeddingConfiguration c;
  c.set_mode(TPUEmbeddingConfiguration::TRAINING);
  c.set_num_tensor_cores(1);
  auto* t = c.add_table_descriptor();
  t->set_name("t");
  t->set_vocabulary_size(4);
  t->set_dimension(2);
  auto* p = t->mutable_optimization_parameters();
  p->mutable_stochastic_gradient_descent();
  p->mutable_learning_rate()->set_constant(0.5f);
  auto* f = c.add_feature_descriptor();
  f->set_name("f");
  f->set_table_id(0);
  f->add_input_shape(2);
  EnginePtr e;
  const absl::Status s = Engine::Create(c.SerializeAsString(), &e);
  if (!s.ok()) std::fprintf(stderr, "Engine::Create: %s\n", std::string(s.message()).c_str());
  if (e) {  // row r = (r, 10 r)
    float* w = e->table(0).state[0]->data();
    for (int r = 0; r < 4; ++r) {
      w[2 * r] = r;
      w[2 * r + 1] = 10 * r;
    }
  }
  return e;
}

template <typename T>
Tensor Vec(::tensorflow::DataType dtype, const std::vector<T>& v) {
  Tensor t(dtype, TensorShape({static_cast<int64_t>(v.size())}));
  for (size_t i = 0; i < v.size(); ++i) t.flat<T>()(i) = v[i];
  return t;
}

// Row splits [0, 2, 3]: bag 0 = ids {1, 3}, bag 1 = {2}; mean combiner.
TEST(ArbitraryTensorMapperRowSplitsThenLookup) {
  EnginePtr e = TinyEngine();
  ASSERT_TRUE(e != nullptr);
  const Tensor splits = Vec<int64_t>(DT_INT64, {0, 2, 3});
  const Tensor ids = Vec<int64_t>(DT_INT64, {1, 3, 2});
  const Tensor weights(DT_FLOAT, TensorShape({0}));
  EnqueueInputs in{{&splits}, {&ids}, {&weights}};
  auto mapper = InputMapper::ArbitraryTensorBatch("Enq", {Combiner::kMean});
  Batch batch;
  ASSERT_OK(mapper->Map(*e, in, nullptr, &batch));
  ASSERT_EQ(batch.outputs.size(), size_t{1});
  const OutputBatch& ob = batch.outputs[0];
  EXPECT_TRUE((ob.offsets == std::vector<int64_t>{0, 2, 3}));
  EXPECT_TRUE((ob.ids == std::vector<int64_t>{1, 3, 2}));
  EXPECT_TRUE(ob.weights.empty());
  ASSERT_EQ(ob.slot_combiners.size(), size_t{1});
  EXPECT_TRUE(ob.slot_combiners[0] == Combiner::kMean);

  std::vector<float> out(4);
  e->Lookup(batch, {out.data()}, nullptr);
  EXPECT_NEAR(out[0], 2.0f, 1e-6f);  // mean of rows 1 and 3
  EXPECT_NEAR(out[1], 20.0f, 1e-6f);
  EXPECT_NEAR(out[2], 2.0f, 1e-6f);  // row 2
  EXPECT_NEAR(out[3], 20.0f, 1e-6f);

  // The backward step (§4.3, §5.1): bag 0's gradient reaches rows 1 and 3
  // with the mean's 1/2, bag 1's reaches row 2; w <- w - 0.5 g.
  e->Enqueue(0, Batch(batch));
  Batch popped;
  absl::Status status;
  ASSERT_TRUE(e->Recv(0, &status, &popped, nullptr));  // ready: `later` unused
  ASSERT_OK(status);
  e->SetInFlight(0, std::move(popped));
  Tensor grad(DT_FLOAT, TensorShape({2, 2}));
  auto g = grad.flat<float>();
  g(0) = 4;
  g(1) = 8;
  g(2) = 2;
  g(3) = 2;
  ASSERT_OK(e->Submit(0, {grad}, {}, nullptr));
  const float* w = e->table(0).state[0]->data();
  EXPECT_NEAR(w[0], 0.0f, 0.0f);  // row 0 untouched
  EXPECT_NEAR(w[2], 1.0f - 0.5f * 2.0f, 1e-6f);
  EXPECT_NEAR(w[3], 10.0f - 0.5f * 4.0f, 1e-6f);
  EXPECT_NEAR(w[4], 2.0f - 0.5f * 2.0f, 1e-6f);
  EXPECT_NEAR(w[6], 3.0f - 0.5f * 2.0f, 1e-6f);
  EXPECT_NEAR(w[7], 30.0f - 0.5f * 4.0f, 1e-6f);
  // A second Send for the same Recv is refused.
  EXPECT_ERROR(e->Submit(0, {grad}, {}, nullptr), Code::kFailedPrecondition,
               "has no batch to send gradients for");
}

TEST(InputMapperRefusesBadInputNamingTheFeature) {
  EnginePtr e = TinyEngine();
  ASSERT_TRUE(e != nullptr);
  const Tensor splits = Vec<int64_t>(DT_INT64, {0, 2, 3});
  const Tensor ids = Vec<int64_t>(DT_INT64, {1, 4, 2});  // 4 is outside [0, 4)
  const Tensor weights(DT_FLOAT, TensorShape({0}));
  EnqueueInputs in{{&splits}, {&ids}, {&weights}};
  Batch batch;
  EXPECT_ERROR(InputMapper::ArbitraryTensorBatch("Enq", {})->Map(*e, in, nullptr, &batch),
               Code::kInvalidArgument,
               "Enq: input 0 (feature 'f', table 't'): embedding id 4 at index 1 is outside");
  EXPECT_TRUE(batch.outputs.empty());
  const Tensor bad_splits = Vec<int64_t>(DT_INT64, {0, 4, 3});
  EnqueueInputs in2{{&bad_splits}, {&ids}, {&weights}};
  EXPECT_ERROR(InputMapper::ArbitraryTensorBatch("Enq", {})->Map(*e, in2, nullptr, &batch),
               Code::kInvalidArgument, "row splits must be non-decreasing; split 2 is 3 after 4");
  std::vector<Combiner> combiners;
  EXPECT_ERROR(ParseCombiners("Enq", {"sum", "max"}, &combiners), Code::kInvalidArgument,
               "Enq: Invalid combiner 'max'");
}

// §2.7 MOD sharding: shard 1 of 2 of a 5-row table holds rows 1 and 3.
TEST(CopyShardModAndDiv) {
  Table t;
  t.vocabulary_size = 5;
  t.dimension = 1;
  FloatBuffer state;
  EXPECT_TRUE(state.Allocate(5, 0.0f).ok());
  float shard[] = {7, 9};
  CopyShard(t, ShardingStrategy::kMod, 2, 1, 2, &state, shard, /*to_state=*/true);
  EXPECT_TRUE(
      (std::vector<float>(state.data(), state.data() + 5) == std::vector<float>{0, 7, 0, 9, 0}));
  // DIV_DEFAULT: shard 1 of 2 holds rows 3 and 4.
  float out[2];
  for (int i = 0; i < 5; ++i) state.data()[i] = i;
  CopyShard(t, ShardingStrategy::kDivDefault, 2, 1, 2, &state, out, /*to_state=*/false);
  EXPECT_NEAR(out[0], 3.0f, 0.0f);
  EXPECT_NEAR(out[1], 4.0f, 0.0f);
}

// bfloat16 storage: Load rounds to nearest even, Retrieve widens exactly.
TEST(CopyShardBf16RoundsOnLoad) {
  Table t;
  t.vocabulary_size = 2;
  t.dimension = 2;
  FloatBuffer state;
  EXPECT_TRUE(state.Allocate(4, 0.5f, /*bf16=*/true).ok());
  EXPECT_NEAR(ToFloat(state.half()[3]), 0.5f, 0.0f);
  // 1 + 2^-8 is half-way between 1 and 1 + 2^-7: ties to even (1);
  // 1 + 3 * 2^-8 is half-way between 1 + 2^-7 and 1 + 2^-6: to 1 + 2^-6.
  float shard[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.0f, 1.0f + 0x1p-9f};
  CopyShard(t, ShardingStrategy::kDivDefault, 1, 0, 2, &state, shard, /*to_state=*/true);
  float out[4];
  CopyShard(t, ShardingStrategy::kDivDefault, 1, 0, 2, &state, out, /*to_state=*/false);
  EXPECT_NEAR(out[0], 1.0f, 0.0f);
  EXPECT_NEAR(out[1], 1.0f + 0x1p-6f, 0.0f);
  EXPECT_NEAR(out[2], -2.0f, 0.0f);
  EXPECT_NEAR(out[3], 1.0f, 0.0f);
}

// The tiny table over 2 hosts (DIV_DEFAULT: host 0 rows 0-1, host 1 rows 2-3).
std::string TwoHostConfig() {
  TPUEmbeddingConfiguration c;
  c.set_mode(TPUEmbeddingConfiguration::TRAINING);
  c.set_num_tensor_cores(1);
  c.set_num_hosts(2);
  auto* t = c.add_table_descriptor();
  t->set_name("t");
  t->set_vocabulary_size(4);
  t->set_dimension(2);
  t->mutable_optimization_parameters()->mutable_adagrad();
  t->mutable_optimization_parameters()->mutable_learning_rate()->set_constant(0.5f);
  auto* f = c.add_feature_descriptor();
  f->set_name("f");
  f->set_table_id(0);
  f->add_input_shape(3);
  return c.SerializeAsString();
}

// Bags [1, 3], [], [2, 2] (weights 1, 2 / - / 3, 1) split over 2 hosts: the
// bags form gives host 0 bag 0's id 1 and host 1 bags 0 and 2 (local rows
// 1, then 0, 0); the rows form gives each host its distinct rows.  Each
// host's mapper rebuilds exactly that; a batch for the other host, or cut
// short, is refused whole.
TEST(RouterSplitsABatchAndHostsRebuildTheirParts) {
  const std::string config = TwoHostConfig();
  std::shared_ptr<Router> router;
  ASSERT_OK(Router::Get("unit", config, &router));
  const Tensor splits = Vec<int64_t>(DT_INT64, {0, 2, 2, 4});
  const Tensor ids = Vec<int64_t>(DT_INT64, {1, 3, 2, 2});
  const Tensor weights = Vec<float>(DT_FLOAT, {1, 2, 3, 1});
  EnqueueInputs in{{&splits}, {&ids}, {&weights}};
  EnginePtr hosts[2];
  for (int k = 0; k < 2; ++k) ASSERT_OK(Engine::Create(config, &hosts[k], k));
  for (RouteChoice choice : {RouteChoice::kBags, RouteChoice::kRows}) {
    Batch batch;
    ASSERT_OK(InputMapper::ArbitraryTensorBatch("Route", {Combiner::kMean})
                  ->Map(router->engine(), in, nullptr, &batch));
    RoutePlan plan;
    ASSERT_OK(router->Plan(std::move(batch), choice, nullptr, &plan));
    std::vector<Tensor> packed;
    std::vector<char*> out;
    for (int k = 0; k < 2; ++k) {
      packed.emplace_back(::tensorflow::DT_UINT8, TensorShape({plan.host_bytes[k]}));
    }
    for (int k = 0; k < 2; ++k) {
      out.push_back(reinterpret_cast<char*>(packed[k].flat<uint8_t>().data()));
    }
    ASSERT_OK(router->Pack(plan, out, nullptr));
    Batch got[2];
    for (int k = 0; k < 2; ++k) {
      EnqueueInputs host_in{{}, {&packed[k]}, {}};
      ASSERT_OK(RoutedBatchMapper("EnqRouted")->Map(*hosts[k], host_in, nullptr, &got[k]));
      EXPECT_EQ(got[k].sequence, plan.sequence);
      EXPECT_TRUE(got[k].training);
    }
    const OutputBatch& h0 = got[0].outputs[0];
    const OutputBatch& h1 = got[1].outputs[0];
    if (choice == RouteChoice::kBags) {
      EXPECT_TRUE((h0.offsets == std::vector<int64_t>{0, 1}));
      EXPECT_TRUE((h0.ids == std::vector<int64_t>{1}));
      EXPECT_TRUE((h0.weights == std::vector<float>{1}));
      EXPECT_TRUE((h0.bag_scales == std::vector<float>{1.0f / 3}));  // mean over the whole bag
      EXPECT_TRUE((h1.offsets == std::vector<int64_t>{0, 1, 3}));
      EXPECT_TRUE((h1.ids == std::vector<int64_t>{1, 0, 0}));
      EXPECT_TRUE((h1.weights == std::vector<float>{2, 3, 1}));
      EXPECT_TRUE((h1.bag_scales == std::vector<float>{1.0f / 3, 1.0f / 4}));
      EXPECT_EQ(plan.host_floats[0], 2);  // one bag of dim 2
      EXPECT_EQ(plan.host_floats[1], 4);
    } else {
      EXPECT_TRUE((h0.ids == std::vector<int64_t>{1}));
      EXPECT_TRUE((h1.ids == std::vector<int64_t>{1, 0}));  // ids 3 then 2: first use
      EXPECT_TRUE((h1.offsets == std::vector<int64_t>{0, 1, 2}));
      EXPECT_TRUE(h1.weights.empty() && h1.bag_scales.empty());
    }
    // Host 0's batch on host 1's engine, and a truncated one: refused.
    EnqueueInputs wrong{{}, {&packed[0]}, {}};
    Batch refused;
    EXPECT_ERROR(RoutedBatchMapper("EnqRouted")->Map(*hosts[1], wrong, nullptr, &refused),
                 Code::kInvalidArgument, "routed for host 0 of 2 but this engine is host 1 of 2");
    const Tensor cut = packed[1].Slice(0, plan.host_bytes[1] - 4);
    EnqueueInputs short_in{{}, {&cut}, {}};
    EXPECT_ERROR(RoutedBatchMapper("EnqRouted")->Map(*hosts[1], short_in, nullptr, &refused),
                 Code::kDataLoss, "EnqRouted: host 1 of 2: the routed packet");
    // One bit of the last array flipped: the checksum refuses it.
    Tensor flipped(::tensorflow::DT_UINT8, TensorShape({plan.host_bytes[1]}));
    flipped.flat<uint8_t>() = packed[1].flat<uint8_t>();
    flipped.flat<uint8_t>()(plan.host_bytes[1] - 1) ^= 1;
    EnqueueInputs flipped_in{{}, {&flipped}, {}};
    EXPECT_ERROR(RoutedBatchMapper("EnqRouted")->Map(*hosts[1], flipped_in, nullptr, &refused),
                 Code::kDataLoss, "is corrupt");
    EXPECT_TRUE(refused.outputs.empty());
  }
  Router::Drop("unit");
}

}  // namespace
}  // namespace tf_tpu_emb

int main(int argc, char** argv) { return ::unit::RunAll(argc, argv); }
