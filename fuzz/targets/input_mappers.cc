// Fuzz target: the V1 input mappers (engine/input_mappers.h) as the enqueue
// kernels (kernels/enqueue_kernels.cc) call them -- IntegerBatch,
// SparseBatch, ArbitraryTensorBatch, SparseTensorBatch and
// RaggedTensorBatch, in feature-descriptor and table mode -- with the
// combiners attr (ParseCombiners), the feature attrs, ids, splits / indices
// and weights decoded from the input, against an engine configured from a
// valid config built from the same input (fuzz/targets/fuzz_config.h).
// fuzz-sources: engine/engine.cc engine/table.cc engine/step.cc engine/apply.cc engine/lookup.cc
// fuzz-sources: engine/mapper_base.cc engine/positional_mappers.cc engine/feature_batch_mapper.cc
// fuzz-needs: tensorflow
//
// Invariants: Map returns OK or InvalidArgument (no crash, no sanitizer
// report); an error leaves the engine's queues as they were (nothing is
// enqueued); an accepted batch is well formed (per output: offsets over its
// positions from 0 to the id count, ids inside the table's vocabulary,
// finite weights, one or no weight per id, a combiner) and the kernel's
// next steps -- Enqueue, then the lookup Recv runs on it -- complete.
#include "engine/input_mappers.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "fuzz/targets/fuzz_config.h"
#include "fuzz/targets/fuzz_input.h"

namespace tf_tpu_emb {
namespace {

using fuzz::FuzzInput;
using ::tensorflow::DataType;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// An int32/int64 tensor (the op's dtypes) of `shape`, values from `value(k)`.
template <typename Fn>
Tensor IntTensor(FuzzInput& in, const std::vector<int64_t>& shape, Fn value) {
  const DataType dtype = in.ConsumeBool() ? ::tensorflow::DT_INT64 : ::tensorflow::DT_INT32;
  Tensor t(dtype, TensorShape(shape));
  const int64_t n = t.NumElements();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t v = value(k);
    if (dtype == ::tensorflow::DT_INT64) t.flat<int64_t>()(k) = v;
    else t.flat<int32_t>()(k) = static_cast<int32_t>(v);
  }
  return t;
}

// A shape: mostly rank 1 of `n` elements, sometimes rank 0, 2 or 3.
std::vector<int64_t> Shape(FuzzInput& in, int64_t n) {
  switch (in.In(0, 7)) {
    case 0: return {};
    case 1: return {n, in.In<int64_t>(0, 3)};
    case 2: return {in.In<int64_t>(0, 3), n};
    case 3: return {1, n, 1};
    default: return {n};
  }
}

struct Inputs {
  std::vector<Tensor> splits, ids, weights;
};

// One input's tensors: ids mostly inside `vocab`, splits as row splits,
// COO indices or raw values, weights empty or one per id.
void OneInput(FuzzInput& in, int64_t vocab, int64_t rows, Inputs* out) {
  const int64_t n = in.Mostly<int64_t>(0, 12) & 0xff;
  const std::vector<int64_t> id_shape = Shape(in, n);
  out->ids.push_back(
      IntTensor(in, id_shape, [&](int64_t) { return in.Mostly<int64_t>(0, vocab - 1); }));
  const int64_t count = out->ids.back().NumElements();
  switch (in.In(0, 3)) {
    case 0: {  // row splits over `rows` rows
      const int64_t r = in.Mostly<int64_t>(0, rows) & 0xff;
      std::vector<int64_t> splits(r + 1, 0);
      for (int64_t k = 1; k <= r; ++k) splits[k] = splits[k - 1] + in.In<int64_t>(0, 3);
      if (r > 0 && in.ConsumeBool()) splits[r] = count;
      out->splits.push_back(IntTensor(in, {r + 1}, [&](int64_t k) { return splits[k]; }));
      break;
    }
    case 1: {  // COO indices [count, rank]: (row, position) pairs, mostly sorted
      const int64_t rank = in.In<int64_t>(1, 3);
      int64_t row = 0;
      out->splits.push_back(IntTensor(in, {count, rank}, [&](int64_t k) {
        if (k % rank == 0 && in.In(0, 3) == 0) row += 1;
        return k % rank == 0 ? row : in.Mostly<int64_t>(0, 4);
      }));
      break;
    }
    case 2: {  // sample indices, one per id
      out->splits.push_back(
          IntTensor(in, {count}, [&](int64_t) { return in.Mostly<int64_t>(0, rows - 1); }));
      break;
    }
    default: {  // anything
      const int64_t m = in.In<int64_t>(0, 8);
      out->splits.push_back(
          IntTensor(in, Shape(in, m), [&](int64_t) { return in.Mostly<int64_t>(0, rows); }));
      break;
    }
  }
  const bool weighted = in.ConsumeBool();
  const bool f64 = in.ConsumeBool();
  const int64_t w = weighted ? (in.In(0, 7) == 0 ? in.In<int64_t>(0, 8) : count) : 0;
  Tensor weights(f64 ? ::tensorflow::DT_DOUBLE : ::tensorflow::DT_FLOAT, TensorShape({w}));
  for (int64_t k = 0; k < w; ++k) {
    const float v = in.In(0, 7) == 0 ? in.Float() : in.FiniteIn(-2, 2);
    if (f64) weights.flat<double>()(k) = v;
    else weights.flat<float>()(k) = v;
  }
  out->weights.push_back(std::move(weights));
}

void CheckBatch(const Engine& e, const Batch& batch) {
  FUZZ_CHECK(batch.outputs.size() == e.outputs().size());
  for (size_t o = 0; o < batch.outputs.size(); ++o) {
    const OutputBatch& ob = batch.outputs[o];
    const int64_t vocab = e.table(e.outputs()[o].table).vocabulary_size;
    FUZZ_CHECK(static_cast<int64_t>(ob.offsets.size()) == e.outputs()[o].positions + 1);
    FUZZ_CHECK(ob.offsets.front() == 0);
    FUZZ_CHECK(ob.offsets.back() == static_cast<int64_t>(ob.ids.size()));
    for (size_t p = 1; p < ob.offsets.size(); ++p) FUZZ_CHECK(ob.offsets[p - 1] <= ob.offsets[p]);
    for (int64_t id : ob.ids) FUZZ_CHECK(id >= 0 && id < vocab, "id %ld of %ld", id, vocab);
    FUZZ_CHECK(ob.weights.empty() || ob.weights.size() == ob.ids.size());
    for (float w : ob.weights) FUZZ_CHECK(std::isfinite(w));
    FUZZ_CHECK(!ob.slot_combiners.empty());
  }
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
  const TPUEmbeddingConfiguration config = fuzz::BuildConfig(in, fuzz::ConfigLimits{});
  EnginePtr engine;
  if (!Engine::Create(config.SerializeAsString(), &engine).ok()) return 0;
  const Engine& e = *engine;

  // The op and its attributes.
  const int format = in.In(0, 4);
  static const char* const kOps[] = {"EnqueueTPUEmbeddingIntegerBatch",
                                     "EnqueueTPUEmbeddingSparseBatch",
                                     "EnqueueTPUEmbeddingArbitraryTensorBatch",
                                     "EnqueueTPUEmbeddingSparseTensorBatch",
                                     "EnqueueTPUEmbeddingRaggedTensorBatch"};
  const std::string op = kOps[format];
  std::vector<std::string> names(in.In(0, e.num_tables() + 1));
  for (auto& name : names) name = in.Name({"sum", "mean", "sqrtn"});
  std::vector<Combiner> combiners;
  const absl::Status parsed = ParseCombiners(op, names, &combiners);
  if (!parsed.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(parsed));
    return 0;
  }
  const int num_inputs = in.In<int>(0, static_cast<int>(e.outputs().size()) + 1);
  FeatureAttrs attrs;
  for (int i = 0; i < num_inputs; ++i) {
    attrs.table_ids.push_back(in.Mostly(0, e.num_tables() - 1));
  }
  if (in.ConsumeBool()) {
    for (int i = 0; i < num_inputs; ++i) attrs.max_sequence_lengths.push_back(in.Mostly(0, 4));
  }
  if (in.ConsumeBool()) {
    for (int i = 0; i < num_inputs; ++i) attrs.num_features.push_back(in.Mostly(0, 3));
  }
  std::unique_ptr<InputMapper> mapper;
  switch (format) {
    case 0: mapper = InputMapper::IntegerBatch(op); break;
    case 1: mapper = InputMapper::SparseBatch(op, combiners); break;
    case 2: mapper = InputMapper::ArbitraryTensorBatch(op, combiners); break;
    default: mapper = InputMapper::FeatureBatch(op, combiners, attrs, format == 4); break;
  }

  // The inputs: N of each list (the op's N attr makes the lists equal).
  Inputs inputs;
  for (int i = 0; i < num_inputs; ++i) {
    const int o = i < static_cast<int>(e.outputs().size()) ? i : 0;
    const int table = format >= 3 && i < static_cast<int>(attrs.table_ids.size()) &&
                              attrs.table_ids[i] >= 0 && attrs.table_ids[i] < e.num_tables()
                          ? attrs.table_ids[i]
                          : e.outputs()[o].table;
    OneInput(in, e.table(table).vocabulary_size, e.outputs()[o].positions, &inputs);
  }
  EnqueueInputs lists;
  for (int i = 0; i < num_inputs; ++i) {
    if (format != 0) lists.splits.push_back(&inputs.splits[i]);
    lists.ids.push_back(&inputs.ids[i]);
    if (format != 0) lists.weights.push_back(&inputs.weights[i]);
  }

  const int replica = in.In(0, e.num_replicas() - 1);
  Batch batch;
  const absl::Status status = mapper->Map(e, lists, nullptr, &batch);
  for (int r = 0; r < e.num_replicas(); ++r) FUZZ_CHECK(!engine->HasPendingBatch(r));
  if (!status.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(status), "%s", status.ToString().c_str());
    return 0;
  }
  CheckBatch(e, batch);
  // What the kernels do next: Enqueue; Recv's lookup over the batch.
  std::vector<std::vector<float>> outputs(e.outputs().size());
  std::vector<float*> out;
  for (size_t o = 0; o < outputs.size(); ++o) {
    outputs[o].resize(e.outputs()[o].positions * e.table(e.outputs()[o].table).dimension);
    out.push_back(outputs[o].data());
  }
  engine->Lookup(batch, out, nullptr);
  engine->Enqueue(replica, std::move(batch));
  FUZZ_CHECK(engine->HasPendingBatch(replica));
  return 0;
}
