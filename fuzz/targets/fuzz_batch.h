// A well-formed batch for an engine, built from a fuzz input: the form the
// input mappers guarantee (input_mappers.cc fuzzes the mappers themselves),
// shared by the targets that drive what comes after an enqueue
// (training_step.cc, routed_step.cc).  Needs TensorFlow (engine/batch.h).
#ifndef TF_TPU_EMB_FUZZ_TARGETS_FUZZ_BATCH_H_
#define TF_TPU_EMB_FUZZ_TARGETS_FUZZ_BATCH_H_

#include <cstdint>
#include <utility>

#include "engine/engine.h"
#include "fuzz/targets/fuzz_input.h"

namespace tf_tpu_emb {
namespace fuzz {

// Every output of `e`: CSR over its positions (bags, 0-3 ids each), ids
// inside the table's vocabulary, weights none or one finite value per id,
// one to three combiners interleaved over the bags.
inline Batch RandomBatch(FuzzInput& in, const Engine& e) {
  Batch b;
  for (const OutputSpec& o : e.outputs()) {
    OutputBatch ob;
    const int64_t vocab = e.table(o.table).vocabulary_size;
    ob.offsets.push_back(0);
    for (int64_t p = 0; p < o.positions; ++p) {
      const int64_t n = in.In<int64_t>(0, 3);
      for (int64_t k = 0; k < n; ++k) ob.ids.push_back(in.In<int64_t>(0, vocab - 1));
      ob.offsets.push_back(static_cast<int64_t>(ob.ids.size()));
    }
    if (in.ConsumeBool()) {
      for (size_t k = 0; k < ob.ids.size(); ++k) ob.weights.push_back(in.FiniteIn(-2, 2));
    }
    const int kinds = in.In(1, 3);
    for (int k = 0; k < kinds; ++k) ob.slot_combiners.push_back(static_cast<Combiner>(in.In(0, 2)));
    b.outputs.push_back(std::move(ob));
  }
  return b;
}

}  // namespace fuzz
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_FUZZ_TARGETS_FUZZ_BATCH_H_
