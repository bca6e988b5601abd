// Fuzz target: an embedding host's routed packets (engine/routing.h, "Packet
// integrity"), as EnqueueTPUEmbeddingRoutedBatch receives them: a packed
// per-host tensor, its header and sizes, fed to EnqueueRoutedBatch (the
// kernel's one call, engine/routed_mapper.h) on a small host engine (host 1
// of 2, two replicas, an Adagrad table and an FTRL table, three features).
// clang-format off
// fuzz-sources: engine/engine.cc engine/table.cc engine/step.cc engine/apply.cc engine/lookup.cc engine/routing.cc engine/routed_mapper.cc engine/mapper_base.cc engine/positional_mappers.cc engine/feature_batch_mapper.cc
// fuzz-needs: tensorflow
// clang-format on
//
// Input: byte 0 picks the mode, byte 1 the replica; then
//  * mode 0: the rest is the packet, as it arrived;
//  * mode 1: the same with its checksum made right (an intact packet that
//    the router did not make: the layout and content checks);
//  * modes 2-7: the rest describes one replica's batch (per feature its
//    bags' lengths, ids, weights; the mode, combiners, the routing form),
//    which the worker's Router (the same Plan and Pack as
//    RouteTPUEmbeddingArbitraryTensorBatch) packs for this host; then
//    mode 2 enqueues it as made, 3 flips one bit, 4 cuts it short, 5 stamps
//    another session on it (checksum made right), 6 enqueues it twice (a
//    replay), 7 overwrites a few bytes and makes the checksum right.
// With HOST_PACKETS_WRITE_SEEDS=<folder> set, the target writes its seeds
// there at start-up (fuzz/corpus/host_packets/ holds them): the packets
// of a few valid batches in modes 0 and 2.
//
// Invariants: a refused packet leaves the engine's tables, slots and queues
// bit-equal (the state buffers compared byte by byte, no batch pending);
// a packet the router made is accepted; a flipped bit, a cut, another
// session or a replay is refused (another session and a replay with
// FailedPrecondition, a flip or a cut with DataLoss, or InvalidArgument
// when the flip hits the header's magic or version); an accepted packet's
// batch is queued once, and looking it up reads only this host's rows.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "engine/engine.h"
#include "engine/input_mappers.h"
#include "engine/routed_mapper.h"
#include "engine/routing.h"
#include "fuzz/targets/fuzz_input.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace {

using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

constexpr uint64_t kSession = 0x5EC0DE5EC0DE0001ull;
constexpr int kHost = 1;
constexpr const char* kOp = "EnqueueTPUEmbeddingRoutedBatch";

// Two hosts, two replicas; "a" (Adagrad, 10 x 4) read by features 0 and 2,
// "b" (FTRL, 5 x 2) by feature 1.
std::string Config() {
  TPUEmbeddingConfiguration c;
  c.set_mode(TPUEmbeddingConfiguration::TRAINING);
  c.set_num_tensor_cores(2);
  c.set_num_hosts(2);
  auto* a = c.add_table_descriptor();
  a->set_name("a");
  a->set_vocabulary_size(10);
  a->set_dimension(4);
  a->mutable_optimization_parameters()->mutable_adagrad();
  a->mutable_optimization_parameters()->mutable_learning_rate()->set_constant(0.5f);
  auto* b = c.add_table_descriptor();
  b->set_name("b");
  b->set_vocabulary_size(5);
  b->set_dimension(2);
  b->mutable_optimization_parameters()->mutable_ftrl();
  b->mutable_optimization_parameters()->mutable_learning_rate()->set_constant(0.25f);
  const int tables[] = {0, 1, 0};
  const int positions[] = {4, 3, 2};
  for (int f = 0; f < 3; ++f) {
    auto* d = c.add_feature_descriptor();
    d->set_name("f" + std::to_string(f));
    d->set_table_id(tables[f]);
    d->add_input_shape(positions[f]);
  }
  return c.SerializeAsString();
}

const std::string& TheConfig() {
  static const std::string* config = new std::string(Config());
  return *config;
}

Router& TheRouter() {
  static std::shared_ptr<Router>* router = [] {
    auto* r = new std::shared_ptr<Router>();
    const absl::Status s = Router::Get("fuzz_host_packets", TheConfig(), r);
    FUZZ_CHECK(s.ok(), "%s", std::string(s.message()).c_str());
    return r;
  }();
  return **router;
}

// A fresh host engine with every state buffer holding a pattern.
EnginePtr NewHost() {
  EnginePtr engine;
  const absl::Status s = Engine::Create(TheConfig(), &engine, kHost);
  FUZZ_CHECK(s.ok(), "%s", std::string(s.message()).c_str());
  engine->set_routed_session(kSession);
  for (int t = 0; t < engine->num_tables(); ++t) {
    Table& table = engine->table(t);
    const int64_t n = table.vocabulary_size * table.dimension;
    for (size_t i = 0; i < table.state.size(); ++i) {
      float* x = table.state[i]->data();
      for (int64_t j = 0; j < n; ++j) x[j] = 0.25f * static_cast<float>(j + 7 * i + 3 * t);
    }
  }
  return engine;
}

std::vector<char> Snapshot(Engine& e) {
  std::vector<char> bytes;
  for (int t = 0; t < e.num_tables(); ++t) {
    const Table& table = e.table(t);
    const int64_t n = table.vocabulary_size * table.dimension * 4;
    for (const auto& buffer : table.state) {
      const char* x = reinterpret_cast<const char*>(buffer->data());
      bytes.insert(bytes.end(), x, x + n);
    }
  }
  return bytes;
}

Tensor PacketTensor(const char* data, int64_t size) {
  Tensor t(::tensorflow::DT_UINT8, TensorShape({size}));
  if (size > 0) std::memcpy(t.flat<uint8_t>().data(), data, size);
  return t;
}

void FixChecksum(Tensor* packet) {
  const int64_t size = packet->NumElements();
  if (size < packed::kHeaderWords * 8) return;
  char* data = reinterpret_cast<char*>(packet->flat<uint8_t>().data());
  const uint64_t sum = packed::Checksum(data, size);
  std::memcpy(data + packed::kChecksumWord * 8, &sum, sizeof sum);
}

// One replica's batch from the input, routed and packed for this host as
// the worker's Route op does; false when the worker refuses it.
bool MakePacket(fuzz::FuzzInput& in, Tensor* packet) {
  Router& router = TheRouter();
  const Engine& e = router.engine();
  const int features = e.outputs().size();
  std::vector<Tensor> splits, ids, weights;
  std::vector<Combiner> combiners;
  const bool weighted = in.ConsumeBool();
  for (int f = 0; f < features; ++f) {
    const int64_t positions = e.outputs()[f].positions;
    const int64_t vocab = e.config().table_descriptor(e.outputs()[f].table).vocabulary_size();
    std::vector<int64_t> split = {0}, id;
    std::vector<float> weight;
    for (int64_t p = 0; p < positions; ++p) {
      const int n = in.In(0, 3);
      for (int j = 0; j < n; ++j) {
        id.push_back(in.In<int64_t>(0, vocab - 1));
        if (weighted) weight.push_back(in.ConsumeFloatingPointInRange<float>(0.125f, 4.0f));
      }
      split.push_back(id.size());
    }
    Tensor s(::tensorflow::DT_INT64, TensorShape({static_cast<int64_t>(split.size())}));
    std::memcpy(s.flat<int64_t>().data(), split.data(), split.size() * 8);
    Tensor i(::tensorflow::DT_INT64, TensorShape({static_cast<int64_t>(id.size())}));
    if (!id.empty()) std::memcpy(i.flat<int64_t>().data(), id.data(), id.size() * 8);
    Tensor w(::tensorflow::DT_FLOAT, TensorShape({static_cast<int64_t>(weight.size())}));
    if (!weight.empty()) std::memcpy(w.flat<float>().data(), weight.data(), weight.size() * 4);
    splits.push_back(std::move(s));
    ids.push_back(std::move(i));
    weights.push_back(std::move(w));
    combiners.push_back(static_cast<Combiner>(in.In(0, 2)));
  }
  EnqueueInputs mapped;
  for (int f = 0; f < features; ++f) {
    mapped.splits.push_back(&splits[f]);
    mapped.ids.push_back(&ids[f]);
    mapped.weights.push_back(&weights[f]);
  }
  Batch batch;
  batch.training = in.ConsumeBool();
  if (!InputMapper::ArbitraryTensorBatch("Route", combiners)
           ->Map(e, mapped, nullptr, &batch)
           .ok()) {
    return false;
  }
  const RouteChoice choices[] = {RouteChoice::kAuto, RouteChoice::kBags, RouteChoice::kRows,
                                 RouteChoice::kHostFilter};
  const RouteChoice choice = choices[in.In(0, 3)];
  RoutePlan plan;
  FUZZ_CHECK(router.Plan(std::move(batch), choice, nullptr, &plan).ok());
  plan.session = kSession;
  const int hosts = choice == RouteChoice::kHostFilter ? 1 : router.num_hosts();
  std::vector<Tensor> out;
  std::vector<char*> at;
  for (int k = 0; k < hosts; ++k)
    out.emplace_back(::tensorflow::DT_UINT8, TensorShape({plan.host_bytes[k]}));
  for (int k = 0; k < hosts; ++k)
    at.push_back(reinterpret_cast<char*>(out[k].flat<uint8_t>().data()));
  FUZZ_CHECK(router.Pack(plan, at, nullptr).ok());
  *packet = out[choice == RouteChoice::kHostFilter ? 0 : kHost];
  return true;
}

// Enqueues `packet` on `replica`; a refusal must leave everything as it was.
absl::Status Enqueue(Engine& e, int replica, const Tensor& packet) {
  static const std::unique_ptr<InputMapper>* mapper =
      new std::unique_ptr<InputMapper>(RoutedBatchMapper(kOp));
  const std::vector<char> before = Snapshot(e);
  const bool pending = e.HasPendingBatch(replica);
  const absl::Status s = EnqueueRoutedBatch(**mapper, kOp, &e, replica, packet, nullptr);
  FUZZ_CHECK(Snapshot(e) == before, "the tables or slots changed (%s)",
             std::string(s.message()).c_str());
  if (!s.ok()) {
    FUZZ_CHECK(e.HasPendingBatch(replica) == pending, "a refused packet changed the queue: %s",
               std::string(s.message()).c_str());
    FUZZ_CHECK(s.message().find(kOp) != absl::string_view::npos, "unnamed: %s",
               std::string(s.message()).c_str());
  } else {
    FUZZ_CHECK(e.HasPendingBatch(replica));
  }
  return s;
}

// The accepted batch: queued once; its lookup reads only this host's rows.
void TakeAccepted(Engine& e, int replica) {
  absl::Status status;
  Batch batch;
  FUZZ_CHECK(e.Recv(replica, &status, &batch, [](absl::Status, Batch) {}));
  FUZZ_CHECK(status.ok(), "%s", std::string(status.message()).c_str());
  FUZZ_CHECK(!e.HasPendingBatch(replica), "one packet, two batches");
  FUZZ_CHECK(batch.outputs.size() == e.outputs().size());
  std::vector<std::vector<float>> out(batch.outputs.size());
  std::vector<float*> at;
  for (size_t o = 0; o < batch.outputs.size(); ++o) {
    const OutputBatch& ob = batch.outputs[o];
    const Table& table = e.table(e.outputs()[o].table);
    FUZZ_CHECK(!ob.offsets.empty() && ob.offsets[0] == 0 &&
               ob.offsets.back() == static_cast<int64_t>(ob.ids.size()));
    for (size_t b = 1; b < ob.offsets.size(); ++b) FUZZ_CHECK(ob.offsets[b - 1] <= ob.offsets[b]);
    for (int64_t id : ob.ids) FUZZ_CHECK(id >= 0 && id < table.vocabulary_size);
    out[o].resize((ob.offsets.size() - 1) * table.dimension);
    at.push_back(out[o].data());
  }
  e.Lookup(batch, at, nullptr);
}

bool Is(const absl::Status& s, absl::StatusCode code) { return s.code() == code; }

void WriteSeeds(const char* folder) {
  for (int i = 0; i < 12; ++i) {
    std::vector<uint8_t> bytes(96);
    uint32_t x = 0x9E3779B9u * (i + 1);
    for (uint8_t& b : bytes) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      b = static_cast<uint8_t>(x);
    }
    fuzz::FuzzInput in(bytes.data(), bytes.size());
    Tensor packet;
    if (!MakePacket(in, &packet)) continue;
    for (int mode : {0, 2}) {
      std::string seed = {static_cast<char>(mode), static_cast<char>(i % 2)};
      if (mode == 0) {
        seed.append(reinterpret_cast<const char*>(packet.flat<uint8_t>().data()),
                    packet.NumElements());
      } else {
        seed.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      }
      const std::string path =
          std::string(folder) + "/seed_" + std::to_string(mode) + "_" + std::to_string(i);
      FILE* f = std::fopen(path.c_str(), "wb");
      FUZZ_CHECK(f != nullptr, "cannot write %s", path.c_str());
      std::fwrite(seed.data(), 1, seed.size(), f);
      std::fclose(f);
    }
  }
}

}  // namespace
}  // namespace tf_tpu_emb

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace tf_tpu_emb;  // NOLINT
  TheRouter();
  if (const char* folder = std::getenv("HOST_PACKETS_WRITE_SEEDS")) WriteSeeds(folder);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tf_tpu_emb;  // NOLINT
  if (size < 2) return 0;
  const int mode = data[0] % 8, replica = data[1] % 2;
  EnginePtr host = NewHost();
  Engine& e = *host;
  if (mode <= 1) {
    Tensor packet = PacketTensor(reinterpret_cast<const char*>(data + 2), size - 2);
    if (mode == 1) FixChecksum(&packet);
    if (Enqueue(e, replica, packet).ok()) TakeAccepted(e, replica);
    return 0;
  }
  fuzz::FuzzInput in(data + 2, size - 2);
  Tensor packet;
  if (!MakePacket(in, &packet)) return 0;
  const int64_t bytes = packet.NumElements();
  char* raw = reinterpret_cast<char*>(packet.flat<uint8_t>().data());
  absl::Status s;
  switch (mode) {
    case 2:
      s = Enqueue(e, replica, packet);
      FUZZ_CHECK(s.ok(), "the router's packet was refused: %s", std::string(s.message()).c_str());
      TakeAccepted(e, replica);
      break;
    case 3: {
      const int64_t at = in.In<int64_t>(0, bytes - 1);
      raw[at] ^= static_cast<char>(1 << in.In(0, 7));
      s = Enqueue(e, replica, packet);
      FUZZ_CHECK(Is(s, absl::StatusCode::kDataLoss) ||
                     (at < 16 && Is(s, absl::StatusCode::kInvalidArgument)),
                 "a flipped bit at %ld: %s", static_cast<long>(at),
                 std::string(s.message()).c_str());
      break;
    }
    case 4: {
      const Tensor cut = packet.Slice(0, in.In<int64_t>(0, bytes - 1));
      s = Enqueue(e, replica, cut);
      FUZZ_CHECK(Is(s, absl::StatusCode::kDataLoss), "a cut packet: %s",
                 std::string(s.message()).c_str());
      break;
    }
    case 5: {
      uint64_t other = in.ConsumeIntegral<uint64_t>();
      if (other == kSession) other ^= 1;
      std::memcpy(raw + packed::kSessionWord * 8, &other, sizeof other);
      FixChecksum(&packet);
      s = Enqueue(e, replica, packet);
      FUZZ_CHECK(Is(s, absl::StatusCode::kFailedPrecondition) &&
                     s.message().find("session") != absl::string_view::npos,
                 "another session: %s", std::string(s.message()).c_str());
      break;
    }
    case 6: {
      FUZZ_CHECK(Enqueue(e, replica, packet).ok());
      s = Enqueue(e, replica, packet);
      FUZZ_CHECK(Is(s, absl::StatusCode::kFailedPrecondition) &&
                     s.message().find("replayed") != absl::string_view::npos,
                 "a replay: %s", std::string(s.message()).c_str());
      TakeAccepted(e, replica);
      break;
    }
    default: {
      for (int n = in.In(1, 4); n > 0 && in.remaining_bytes() > 0; --n) {
        raw[in.In<int64_t>(0, bytes - 1)] = static_cast<char>(in.ConsumeIntegral<uint8_t>());
      }
      FixChecksum(&packet);
      if (Enqueue(e, replica, packet).ok()) TakeAccepted(e, replica);
      break;
    }
  }
  return 0;
}
