// Fuzz target: the training step (engine/step.cc, engine/apply.cc and the
// optimizer formulas of core/optimizer_formulas.h) as Recv and Send drive
// it (kernels/recv_send_kernels.cc): an engine configured from a valid
// config built from the input with every optimizer and every scalar of its
// optimization parameters fuzzed (fuzz/targets/fuzz_config.h: hyper-parameters,
// clipping, weight decay, gradient accumulation, dynamic learning rates,
// simulated quantization, pipelining) and float32 or bfloat16 storage
// (TF_TPU_EMB_STORAGE), then one to three steps: per replica
// a well-formed batch (ids inside the vocabulary, weights finite or none,
// the three combiners), Recv's wait and lookup, and Send's gradients (mostly
// small, sometimes NaN, infinite or huge, as a model can produce: the TPU
// does not check them) with the dynamic learning rates (sometimes not
// finite).  The batches' form is what the input mappers guarantee
// (input_mappers.cc fuzzes those).
// fuzz-sources: engine/engine.cc engine/table.cc engine/step.cc engine/apply.cc engine/lookup.cc
// fuzz-needs: tensorflow
//
// Invariants: no crash and no sanitizer report whatever the values (the
// arithmetic may give NaN or infinities: the TPU's does too); Recv has the
// enqueued batch at once (nothing else runs); Send returns OK for
// well-shaped gradients; each step applies exactly once, when the last
// replica has sent (or, pipelined, by WaitForApply); a step aborted part-way
// (a replica's Send invalid: Engine::AbortStep) applies nothing, every
// table and slot bit-equal; and a table whose
// optimizer is lazy (engine/table.h UpdateSettings::non_lazy false) keeps
// every row no id of the step touched bit-equal.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "fuzz/targets/fuzz_batch.h"
#include "fuzz/targets/fuzz_config.h"
#include "fuzz/targets/fuzz_input.h"

namespace tf_tpu_emb {
namespace {

using fuzz::FuzzInput;
using fuzz::RandomBatch;

// A table's parameters as bytes (float32 or bfloat16 storage), and one
// row's size.
const char* Bytes(const Table& t) { return reinterpret_cast<const char*>(t.state[0]->data()); }
int64_t RowBytes(const Table& t) { return t.dimension * int64_t{t.state[0]->element_bytes()}; }

// Every table's parameters and slots, byte for byte.
std::vector<std::string> Snapshot(const Engine& e) {
  std::vector<std::string> out;
  for (int t = 0; t < e.num_tables(); ++t) {
    const Table& table = e.table(t);
    for (const auto& buffer : table.state) {
      out.emplace_back(reinterpret_cast<const char*>(buffer->data()),
                       table.vocabulary_size * RowBytes(table));
    }
  }
  return out;
}

}  // namespace
}  // namespace tf_tpu_emb

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("TF_CPP_MIN_LOG_LEVEL", "3", 0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tf_tpu_emb;
  FuzzInput in(data, size);
  fuzz::ConfigLimits limits;
  limits.every_optimizer = true;
  limits.fuzz_parameters = true;
  TPUEmbeddingConfiguration config = fuzz::BuildConfig(in, limits);
  config.set_mode(TPUEmbeddingConfiguration::TRAINING);
  // The tables' storage (engine/table.h ReadStorageFromEnvironment, read at
  // configure): float32, bfloat16 with stochastic rounding, per table, or
  // a malformed setting (refused).
  const std::string storage = in.Name({"fp32", "bf16", "t0=bf16", "bf16,t1=fp32", "t2=bf16"});
  setenv("TF_TPU_EMB_STORAGE", storage.c_str(), 1);
  EnginePtr engine;
  if (!Engine::Create(config.SerializeAsString(), &engine).ok()) return 0;
  Engine& e = *engine;
  const int replicas = e.num_replicas();
  const int steps = in.In(1, 3);
  for (int step = 0; step < steps; ++step) {
    std::vector<Batch> batches;
    for (int r = 0; r < replicas; ++r) {
      batches.push_back(RandomBatch(in, e));
      e.Enqueue(r, batches.back());
    }
    // Recv: the batch at once, then the lookup and the batch in flight.
    for (int r = 0; r < replicas; ++r) {
      absl::Status status;
      Batch got;
      const bool now = e.Recv(r, &status, &got, [](absl::Status, Batch) {
        FUZZ_CHECK(false, "a Recv waited: nothing else can feed it");
      });
      FUZZ_CHECK(now && status.ok(), "%s", status.ToString().c_str());
      std::vector<std::vector<float>> outputs(e.outputs().size());
      std::vector<float*> out;
      for (size_t o = 0; o < outputs.size(); ++o) {
        outputs[o].resize(e.outputs()[o].positions * e.table(e.outputs()[o].table).dimension);
        out.push_back(outputs[o].data());
      }
      e.Lookup(got, out, nullptr);
      e.SetInFlight(r, std::move(got));
    }
    if (e.table_without_learning_rate() >= 0) return 0;  // Send refuses (its kernel)
    // The tables before the update, and the rows the step touches.
    std::vector<std::vector<char>> before(e.num_tables());
    std::vector<std::vector<bool>> touched(e.num_tables());
    for (int t = 0; t < e.num_tables(); ++t) {
      const Table& table = e.table(t);
      before[t].assign(Bytes(table), Bytes(table) + table.vocabulary_size * RowBytes(table));
      touched[t].assign(table.vocabulary_size, false);
    }
    for (const Batch& b : batches) {
      for (size_t o = 0; o < b.outputs.size(); ++o) {
        for (int64_t id : b.outputs[o].ids) touched[e.outputs()[o].table][id] = true;
      }
    }
    const uint64_t applied = e.steps_applied();
    const std::vector<std::string> state_before = Snapshot(e);
    // Sometimes a replica's Send is invalid (its kernel then aborts the
    // step, kernels/recv_send_kernels.cc): the replicas before it have sent.
    const int abort_at = in.In(0, 5) == 0 ? in.In(0, replicas - 1) : -1;
    for (int r = 0; r < replicas; ++r) {
      if (r == abort_at) {
        e.AbortStep("fuzz: replica's Send was invalid");
        e.WaitForApply();
        // Nothing of the step applies: every table and slot as before.
        FUZZ_CHECK(e.steps_applied() == applied);
        FUZZ_CHECK(Snapshot(e) == state_before, "an aborted step changed a table or slot");
        return 0;
      }
      std::vector<::tensorflow::Tensor> grads;
      for (const OutputSpec& o : e.outputs()) {
        ::tensorflow::Tensor g(::tensorflow::DT_FLOAT, o.recv_shape);
        float* v = g.flat<float>().data();
        const bool wild = in.In(0, 7) == 0;
        for (int64_t k = 0; k < g.NumElements(); ++k) v[k] = wild ? in.Float() : in.FiniteIn(-1, 1);
        grads.push_back(std::move(g));
      }
      std::vector<float> rates(e.num_dynamic_inputs());
      for (float& rate : rates) rate = in.In(0, 7) == 0 ? in.Float() : in.FiniteIn(0, 0.5f);
      const absl::Status sent = e.Submit(r, std::move(grads), rates, nullptr);
      FUZZ_CHECK(sent.ok(), "%s", sent.ToString().c_str());
    }
    e.WaitForApply();
    FUZZ_CHECK(e.steps_applied() == applied + 1, "steps applied %lu after %lu",
               static_cast<unsigned long>(e.steps_applied()), static_cast<unsigned long>(applied));
    for (int t = 0; t < e.num_tables(); ++t) {
      const Table& table = e.table(t);
      if (table.update.non_lazy) continue;
      const int64_t row_bytes = RowBytes(table);
      for (int64_t row = 0; row < table.vocabulary_size; ++row) {
        if (touched[t][row]) continue;
        FUZZ_CHECK(std::memcmp(before[t].data() + row * row_bytes, Bytes(table) + row * row_bytes,
                               row_bytes) == 0,
                   "table %d row %ld changed without an id", t, static_cast<long>(row));
      }
    }
  }
  return 0;
}
