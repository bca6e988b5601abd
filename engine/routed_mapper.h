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

#include "absl/status/status.h"
#include "engine/engine.h"
#include "engine/input_mappers.h"

namespace tf_tpu_emb {

std::unique_ptr<InputMapper> RoutedBatchMapper(std::string op);

// EnqueueTPUEmbeddingRoutedBatch's work (its kernel and the fuzz target
// fuzz/targets/host_packets.cc call it): `packet` mapped by `mapper` (a
// RoutedBatchMapper) and queued on `replica` unless the host's replica took
// that sequence already (Engine::EnqueueRouted).  A refused packet changes
// nothing.
absl::Status EnqueueRoutedBatch(const InputMapper& mapper, const std::string& op, Engine* engine,
                                int replica, const ::tensorflow::Tensor& packet,
                                ::tsl::thread::ThreadPool* pool);

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_ROUTED_MAPPER_H_
