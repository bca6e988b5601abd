// Fuzz target: the serialized TPUEmbeddingConfiguration, as the configure
// kernels (kernels/system_kernels.cc) and the shape functions
// (ops/tpu_embedding_ops.cc) receive it, through Engine::Create (parse,
// complete, validate, reserve the memory budget, allocate) and the shape
// functions' ComputeOutputShapes / TableShardShapes.
// fuzz-sources: engine/engine.cc engine/table.cc engine/step.cc engine/apply.cc engine/lookup.cc
// fuzz-needs: tensorflow
//
// Input: byte 0 chooses how the engine is configured (bits 0-1: one host
// holding every table, host k of the config's num_hosts, the worker's
// routing-only view; bits 2-3: TF_TPU_EMB_STORAGE unset, "bf16", the first
// table's name "=bf16", an invalid setting), byte 1 the Load/Retrieve
// shard count and id; the rest is the config's bytes (fuzz/seeds.py writes
// seeds from real configs).
//
// Invariants: Create returns OK or an error status (no crash, no sanitizer
// report); the memory budget reserved (Engine::LiveStateBytes) is back to
// what it was once the engine is released, whether its configure failed or
// not; a configured engine has the state buffers and outputs its config
// says, and the shape functions accept a config the engine accepted.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/config.h"
#include "engine/engine.h"
#include "fuzz/targets/fuzz_input.h"

namespace tf_tpu_emb {
namespace {

// Every state buffer is vocabulary x dimension: the budget bounds what one
// input may allocate (a larger config is refused with ResourceExhausted).
constexpr const char* kMemoryLimit = "268435456";

void CheckEngine(const Engine& e, const TPUEmbeddingConfiguration& user) {
  const TPUEmbeddingConfiguration& c = e.config();
  FUZZ_CHECK(e.num_tables() == c.table_descriptor_size());
  FUZZ_CHECK(e.outputs().size() == static_cast<size_t>(c.feature_descriptor_size()));
  FUZZ_CHECK(e.num_replicas() >= 1);
  for (int t = 0; t < e.num_tables(); ++t) {
    const Table& table = e.table(t);
    FUZZ_CHECK(table.optimizer != nullptr);
    FUZZ_CHECK(table.dimension > 0 && table.vocabulary_size >= 0);
    if (e.host_id() >= 0 && e.num_hosts() >= 1 && !table.state.empty()) {
      FUZZ_CHECK(table.state.size() == 1 + table.optimizer->slots.size());
      FUZZ_CHECK(table.state_names.size() >= table.state.size());
    }
  }
  for (const OutputSpec& out : e.outputs()) {
    FUZZ_CHECK(out.table >= 0 && out.table < e.num_tables());
    FUZZ_CHECK(out.positions >= 0);
    FUZZ_CHECK(out.recv_shape.num_elements() == out.positions * e.table(out.table).dimension);
  }
  // What configure accepted, the shape functions accept (graph construction
  // sees the same bytes).
  std::vector<TensorShapeProto> shapes;
  const absl::Status shaped = ComputeOutputShapes(user, &shapes);
  FUZZ_CHECK(shaped.ok(), "%s", std::string(shaped.message()).c_str());
}

}  // namespace
}  // namespace tf_tpu_emb

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", tf_tpu_emb::kMemoryLimit, 1);
  setenv("TF_CPP_MIN_LOG_LEVEL", "3", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tf_tpu_emb;
  if (size < 2) return 0;
  const uint8_t mode = data[0], shards = data[1];
  const std::string bytes(reinterpret_cast<const char*>(data + 2), size - 2);

  TPUEmbeddingConfiguration user;
  const bool parsed = ParseConfig(bytes, &user).ok();
  switch ((mode >> 2) & 3) {
    case 0: unsetenv("TF_TPU_EMB_STORAGE"); break;
    case 1: setenv("TF_TPU_EMB_STORAGE", "bf16", 1); break;
    case 2: {
      const std::string name =
          parsed && user.table_descriptor_size() > 0 ? user.table_descriptor(0).name() : "t";
      setenv("TF_TPU_EMB_STORAGE", (name + "=bf16").c_str(), 1);
      break;
    }
    default: setenv("TF_TPU_EMB_STORAGE", "fp32,=bf16", 1); break;
  }
  int host_id = -1;
  if ((mode & 3) == 1)
    host_id = parsed && user.num_hosts() > 0 ? (mode >> 4) % user.num_hosts() : 0;
  if ((mode & 3) == 2) host_id = Engine::kRoutingOnly;
  if ((mode & 3) == 3) host_id = (mode >> 4);  // maybe not a host of the config

  const int64_t before = Engine::LiveStateBytes();
  {
    EnginePtr engine;
    const absl::Status status = Engine::Create(bytes, &engine, host_id);
    FUZZ_CHECK(status.ok() == (engine != nullptr));
    if (status.ok()) {
      FUZZ_CHECK(parsed);
      CheckEngine(*engine, user);
      // Load/Retrieve's shard of every table: an error or rows in range.
      const int num_shards = 1 + (shards & 15), shard_id = shards >> 4;
      for (int t = 0; t < engine->num_tables(); ++t) {
        Engine::LocalShard shard;
        if (engine->ResolveShard("fuzz", t, num_shards, shard_id, &shard).ok()) {
          FUZZ_CHECK(shard.rows >= 0 && shard.rows <= engine->table(t).vocabulary_size);
          FUZZ_CHECK(shard.local_shard_id >= 0 && shard.local_shard_id < shard.local_shards);
        }
      }
    } else {
      FUZZ_CHECK(Engine::LiveStateBytes() == before, "a failed configure kept its reservation");
    }
  }
  FUZZ_CHECK(Engine::LiveStateBytes() == before, "a released engine kept its reservation");

  // The shape functions on the user's bytes, whatever configure said.
  if (parsed) {
    std::vector<TensorShapeProto> shapes;
    (void)ComputeOutputShapes(user, &shapes);
    std::vector<TensorShapeProto> table_shapes;
    (void)TableShardShapes(user, shards >> 4, 1 + (shards & 15), &table_shapes);
  }
  return 0;
}
