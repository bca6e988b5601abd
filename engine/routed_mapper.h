// The hosts' side of the sharded data path (engine/routing.h): the input
// mapper of EnqueueTPUEmbeddingRoutedBatch (its one input is the packed
// batch a worker's router made); validates the whole batch against this
// host's engine (host id, outputs, sizes, local rows, finite weights) before
// building anything.  Sets batch->training and batch->sequence.
// Implementation: engine/routed_mapper.cc.
#ifndef TF_TPU_EMB_ENGINE_ROUTED_MAPPER_H_
#define TF_TPU_EMB_ENGINE_ROUTED_MAPPER_H_

#include <memory>
#include <string>

#include "engine/input_mappers.h"

namespace tf_tpu_emb {

std::unique_ptr<InputMapper> RoutedBatchMapper(std::string op);

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_ROUTED_MAPPER_H_
