// Enqueue inputs -> the engine's Batch: one input mapper per enqueue format
// (docs/tpu_embedding_semantics.md §4.1).  A mapper validates every input
// against the configured engine (counts, shapes, sample indices, row splits,
// ids inside the vocabulary, finite weights) and only then builds the batch
// (per output, CSR over its bags in input order); on an error nothing is
// built and the engine is untouched.  The kernels (kernels/enqueue_kernels.cc)
// read the op's attributes and inputs and hand them here.  This header is
// the interface; the mappers are in engine/positional_mappers.cc,
// engine/feature_batch_mapper.cc and (the hosts') engine/routed_mapper.cc,
// over engine/mapper_base.h.
#ifndef TF_TPU_EMB_ENGINE_INPUT_MAPPERS_H_
#define TF_TPU_EMB_ENGINE_INPUT_MAPPERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/bag.h"
#include "engine/batch.h"
#include "tensorflow/core/framework/tensor.h"

namespace tsl {
namespace thread {
class ThreadPool;
}  // namespace thread
}  // namespace tsl

namespace tf_tpu_emb {

class Engine;

// The per-input lists of one enqueue op (all of the same length N; `splits`
// is empty for IntegerBatch, whose only list is `ids`).
struct EnqueueInputs {
  std::vector<const ::tensorflow::Tensor*> splits;  // indices / row splits
  std::vector<const ::tensorflow::Tensor*> ids;
  std::vector<const ::tensorflow::Tensor*> weights;
};

// Parses an enqueue op's `combiners` attribute ("sum", "mean", "sqrtn");
// InvalidArgument naming `op` for anything else.
absl::Status ParseCombiners(const std::string& op, const std::vector<std::string>& names,
                            std::vector<Combiner>* combiners);

// The attributes of SparseTensorBatch / RaggedTensorBatch.
struct FeatureAttrs {
  std::vector<int32_t> table_ids, max_sequence_lengths, num_features;
};

class InputMapper {
 public:
  virtual ~InputMapper() = default;
  // Validates `in` and fills batch->outputs (batch->training is the caller's).
  // `pool` (may be nullptr) runs the per-input and per-output work.
  virtual absl::Status Map(const Engine& e, const EnqueueInputs& in,
                           ::tsl::thread::ThreadPool* pool, Batch* batch) const = 0;

  // EnqueueTPUEmbeddingIntegerBatch: one id per output position.
  static std::unique_ptr<InputMapper> IntegerBatch(std::string op);
  // EnqueueTPUEmbeddingSparseBatch: sample_indices are bag positions.
  static std::unique_ptr<InputMapper> SparseBatch(std::string op, std::vector<Combiner> combiners);
  // (Dynamic)EnqueueTPUEmbeddingArbitraryTensorBatch: COO indices, row splits
  // or dense ids onto the feature's input_shape.
  static std::unique_ptr<InputMapper> ArbitraryTensorBatch(std::string op,
                                                           std::vector<Combiner> combiners);
  // EnqueueTPUEmbeddingSparseTensorBatch (ragged = false) and
  // (Dynamic)EnqueueTPUEmbeddingRaggedTensorBatch (ragged = true):
  // feature-oriented, table_ids[i] is the table of input i; in a table-mode
  // config the features of a table fill its num_features rows per sample.
  static std::unique_ptr<InputMapper> FeatureBatch(std::string op, std::vector<Combiner> combiners,
                                                   FeatureAttrs attrs, bool ragged);
};

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_INPUT_MAPPERS_H_
