// What the op-definition files of ops/ share: the namespace every op of this
// library is registered under (TF already registers the bare names, and a
// plugin's REGISTER_OP for one of those is silently ignored), the `engine`
// attr, and the shape functions the hosts' ops (ops/host_ops.cc) reuse from
// TF's family (defined in ops/tpu_embedding_ops.cc).
#ifndef TF_TPU_EMB_OPS_OP_DEFS_H_
#define TF_TPU_EMB_OPS_OP_DEFS_H_

#include "absl/status/status.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

// The namespace of every op of this library.
#define TTE_PREFIX "TfTpuEmb>"
#define TTE_OP(name) REGISTER_OP(TTE_PREFIX name)

namespace tf_tpu_emb {

// Every op that addresses an engine takes it by name, as its last attr
// (generated wrappers take attrs positionally: TF's come first, unchanged).
// "" is the process's default engine, the one TF's core-named ops address.
inline constexpr char kEngineAttr[] = "engine: string = ''";

// RecvTPUEmbeddingActivations': its outputs' shapes from its `config` attr.
absl::Status RecvShapeFn(::tensorflow::shape_inference::InferenceContext* c);
// The enqueue ops': `combiners` is empty or has one entry per input (`N`).
absl::Status CombinersLengthShapeFn(::tensorflow::shape_inference::InferenceContext* c);
// Two scalar outputs.
absl::Status TwoScalarsShapeFn(::tensorflow::shape_inference::InferenceContext* c);

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_OPS_OP_DEFS_H_
