// The engine's batch form: what an enqueue op's input mapper produces
// (engine/input_mappers.h), the queues hold, the forward lookup reads and the
// backward step applies gradients to.
#ifndef TF_TPU_EMB_ENGINE_BATCH_H_
#define TF_TPU_EMB_ENGINE_BATCH_H_

#include <cstdint>
#include <vector>

#include "core/bag.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tf_tpu_emb {

// One output (feature descriptor of the completed config) of the engine.
struct OutputSpec {
  int table = 0;
  std::vector<int64_t> shape;            // input_shape; the Recv output adds [dim]
  int64_t positions = 0;                 // product of shape: bags in the output
  ::tensorflow::TensorShape recv_shape;  // shape + [dim]: Recv's output, Send's gradient
};

// The ids of one output of one enqueued batch, as CSR over the output's
// positions (bags): bag p holds ids[offsets[p] .. offsets[p+1]).
struct OutputBatch {
  std::vector<int64_t> offsets;
  std::vector<int64_t> ids;
  std::vector<float> weights;  // empty: every weight is 1
  // Combiner of bag p is slot_combiners[p % slot_combiners.size()]: in table
  // mode several features with their own combiners interleave in a table.
  std::vector<Combiner> slot_combiners;
  // Empty, or (a host's part of a routed batch, engine/routing.h) the
  // combiner scale of each bag over the whole bag, which the backward step
  // uses instead of the scale of the bag's ids here.
  std::vector<float> bag_scales;
};

// Per output, its bags: every output position (offsets has positions + 1
// entries), or for a host's part of a routed batch the bags it holds ids of.
struct Batch {
  std::vector<OutputBatch> outputs;  // one per OutputSpec
  bool training = true;
  int64_t sequence = 0;  // a routed batch's number (engine/routing.h), else 0
};

// One replica's share of a training step: the batch its Recv produced and
// the gradients its Send handed in: grads[o] holds one row of dim floats per
// bag of output o, in tensors the part keeps alive.
struct StepPart {
  Batch batch;
  std::vector<::tensorflow::Tensor> gradients;
  std::vector<const float*> grads;
};

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_BATCH_H_
