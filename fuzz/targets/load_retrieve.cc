// Fuzz target: table Load and Retrieve as the kernels run them
// (kernels/load_retrieve_kernels.cc: Engine::ResolveShard maps the op's
// num_shards / shard_id onto the engine's rows, then engine/table.cc's
// CopyShard moves every state variable -- parameters and each optimizer
// slot -- in or out), for every optimizer of the optimizer table, any table
// shape, DIV and MOD sharding, float32 and bfloat16 storage, an engine
// holding whole tables or one host's shard (ConfigureTPUEmbeddingHostShard).
// fuzz-sources: engine/engine.cc engine/table.cc engine/step.cc engine/apply.cc engine/lookup.cc
// fuzz-needs: tensorflow
//
// The op's tensors have the shape the kernel checks before it copies
// ([rows of the shard, dimension]); their values come from the input.
// Invariants: a refused Load or Retrieve is an InvalidArgument naming the
// table and leaves every table and slot bit-equal; a Load then a Retrieve
// of the same shard gives back what was loaded (bfloat16 storage: rounded
// to nearest even); and over a whole-table engine the shards of any count
// partition the table -- loading every shard with values that name
// (shard, row) and retrieving the table whole finds each exactly once.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/bf16.h"
#include "engine/engine.h"
#include "engine/table.h"
#include "fuzz/targets/fuzz_config.h"
#include "fuzz/targets/fuzz_input.h"

namespace tf_tpu_emb {
namespace {

using fuzz::FuzzInput;

// Every state buffer's bytes, for the bit-equality checks.
std::vector<std::string> Snapshot(const Engine& e) {
  std::vector<std::string> out;
  for (int t = 0; t < e.num_tables(); ++t) {
    const Table& table = e.table(t);
    const size_t n = table.vocabulary_size * table.dimension;
    for (const auto& buf : table.state) {
      const size_t bytes = n * buf->element_bytes();
      out.emplace_back(reinterpret_cast<const char*>(buf->data()), bytes);
    }
  }
  return out;
}

// What a float becomes in `table`'s storage.
float Stored(const Table& table, float v) { return table.bf16 ? ToFloat(RoundNearestEven(v)) : v; }

bool SameValue(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

// Load (to_state) or Retrieve of state variables of table t, as the kernel
// does: resolve the shard; on success copy every state variable.
absl::Status Transfer(Engine& e, int t, int num_shards, int shard_id, bool load,
                      std::vector<std::vector<float>>* tensors) {
  const char* op = load ? "LoadTPUEmbeddingParameters" : "RetrieveTPUEmbeddingParameters";
  Engine::LocalShard shard;
  TF_RETURN_IF_ERROR(e.ResolveShard(op, t, num_shards, shard_id, &shard));
  Table& table = e.table(t);
  FUZZ_CHECK(shard.rows >= 0 && shard.rows <= table.vocabulary_size);
  tensors->resize(table.state.size());
  e.WaitForApply();
  for (size_t i = 0; i < table.state.size(); ++i) {
    std::vector<float>& data = (*tensors)[i];
    if (load) FUZZ_CHECK(data.size() == static_cast<size_t>(shard.rows * table.dimension));
    else data.assign(shard.rows * table.dimension, -1.0f);
    CopyShard(table, e.sharding(), shard.local_shards, shard.local_shard_id, shard.rows,
              table.state[i].get(), data.data(), load);
  }
  return absl::OkStatus();
}

// The rows of shard `shard_id` of `num_shards` of table t (0 when refused).
int64_t ShardRows(Engine& e, int t, int num_shards, int shard_id) {
  Engine::LocalShard shard;
  if (!e.ResolveShard("fuzz", t, num_shards, shard_id, &shard).ok()) return -1;
  return shard.rows;
}

void PartitionCheck(Engine& e, int t, int num_shards) {
  const Table& table = e.table(t);
  // Markers need exact storage and whole tables; a refused count partitions nothing.
  if (table.bf16 || e.num_hosts() != 1 || num_shards < 1) return;
  const int dim = table.dimension;
  // Every shard loaded with markers 1 + shard * vocab + row (exact floats).
  for (int s = 0; s < num_shards; ++s) {
    const int64_t rows = ShardRows(e, t, num_shards, s);
    if (rows < 0) return;  // some shard is refused (empty): no partition to check
  }
  for (int s = 0; s < num_shards; ++s) {
    const int64_t rows = ShardRows(e, t, num_shards, s);
    std::vector<std::vector<float>> tensors(table.state.size());
    for (auto& data : tensors) {
      data.resize(rows * dim);
      for (int64_t r = 0; r < rows; ++r) {
        for (int d = 0; d < dim; ++d) data[r * dim + d] = 1 + s * table.vocabulary_size + r;
      }
    }
    FUZZ_CHECK(Transfer(e, t, num_shards, s, true, &tensors).ok());
  }
  std::vector<std::vector<float>> whole;
  FUZZ_CHECK(Transfer(e, t, 1, 0, false, &whole).ok());
  for (const auto& data : whole) {
    std::map<int64_t, int> seen;
    for (int64_t row = 0; row < table.vocabulary_size; ++row) {
      const float v = data[row * dim];
      for (int d = 1; d < dim; ++d) FUZZ_CHECK(data[row * dim + d] == v, "row %ld", row);
      const int64_t marker = static_cast<int64_t>(v) - 1;
      FUZZ_CHECK(v >= 1 && ++seen[marker] == 1, "table row %ld holds %g twice or unset", row, v);
      const int64_t s = marker / table.vocabulary_size, r = marker % table.vocabulary_size;
      FUZZ_CHECK(s < num_shards && r < ShardRows(e, t, num_shards, static_cast<int>(s)));
    }
  }
}

}  // namespace
}  // namespace tf_tpu_emb

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", "268435456", 1);
  setenv("TF_CPP_MIN_LOG_LEVEL", "3", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tf_tpu_emb;
  FuzzInput in(data, size);
  fuzz::ConfigLimits limits;
  limits.every_optimizer = true;
  const TPUEmbeddingConfiguration config = fuzz::BuildConfig(in, limits);
  switch (in.In(0, 3)) {
    case 0: setenv("TF_TPU_EMB_STORAGE", "bf16", 1); break;
    case 1: setenv("TF_TPU_EMB_STORAGE", "t0=bf16", 1); break;
    default: unsetenv("TF_TPU_EMB_STORAGE"); break;
  }
  const int host_id = in.ConsumeBool() ? in.In(0, config.num_hosts() - 1) : -1;
  EnginePtr engine;
  if (!Engine::Create(config.SerializeAsString(), &engine, host_id).ok()) return 0;
  Engine& e = *engine;

  const int ops = in.In(1, 6);
  for (int k = 0; k < ops && in.remaining_bytes() > 0; ++k) {
    const int t = in.In(0, e.num_tables() - 1);
    const Table& table = e.table(t);
    const int num_shards = in.Mostly(1, 5);
    const int shard_id = in.Mostly(0, 4);
    switch (in.In(0, 2)) {
      case 0: {  // Load values from the input, then Retrieve them back
        const int64_t rows = ShardRows(e, t, num_shards, shard_id);
        const std::vector<std::string> before = Snapshot(e);
        std::vector<std::vector<float>> tensors(table.state.size());
        for (auto& values : tensors) {
          values.resize(std::max<int64_t>(rows, 0) * table.dimension);
          for (float& v : values) v = in.In(0, 3) == 0 ? in.Float() : in.FiniteIn(-8, 8);
        }
        const absl::Status loaded = Transfer(e, t, num_shards, shard_id, true, &tensors);
        if (!loaded.ok()) {
          FUZZ_CHECK(absl::IsInvalidArgument(loaded), "%s", loaded.ToString().c_str());
          FUZZ_CHECK(loaded.message().find("'" + table.name + "'") != std::string::npos, "%s",
                     loaded.ToString().c_str());
          FUZZ_CHECK(Snapshot(e) == before, "a refused load changed a table");
          break;
        }
        std::vector<std::vector<float>> back;
        FUZZ_CHECK(Transfer(e, t, num_shards, shard_id, false, &back).ok());
        FUZZ_CHECK(back.size() == tensors.size());
        for (size_t i = 0; i < back.size(); ++i) {
          FUZZ_CHECK(back[i].size() == tensors[i].size());
          for (size_t j = 0; j < back[i].size(); ++j) {
            FUZZ_CHECK(SameValue(back[i][j], Stored(table, tensors[i][j])),
                       "state %zu element %zu: loaded %g, retrieved %g", i, j, tensors[i][j],
                       back[i][j]);
          }
        }
        break;
      }
      case 1: {  // Retrieve only
        const std::vector<std::string> before = Snapshot(e);
        std::vector<std::vector<float>> out;
        const absl::Status got = Transfer(e, t, num_shards, shard_id, false, &out);
        FUZZ_CHECK(got.ok() || absl::IsInvalidArgument(got));
        FUZZ_CHECK(Snapshot(e) == before, "a retrieve changed a table");
        break;
      }
      default: PartitionCheck(e, t, num_shards); break;
    }
  }
  return 0;
}
