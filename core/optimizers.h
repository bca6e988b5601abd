// The optimizers: the types the generated table is made of.
//
// What each optimizer is -- its proto field, Load/Retrieve op names, slots and
// their initial values, named typed hyper-parameters, dynamic inputs and
// laziness -- is data in tf_tpu_emb/optimizer_specs.py, from which
// tools/gen_optimizers.py generates core/optimizer_hypers.gen.h (the
// hyper-parameter structs, free of TensorFlow), core/optimizer_params.gen.h
// (their proto readers), core/optimizer_table.gen.h (AllOptimizers()) and
// core/sparsecore_optimizers.gen.h (the SparseCore optimizers).  The one
// hand-written formula per optimizer is in core/optimizer_formulas.h.
// Configure-time validation, the engine's slot allocation and step, the
// Load/Retrieve ops and the LoadAll/RetrieveAll layout all read the table;
// none of them has an optimizer-specific branch.  Adding an optimizer: one
// spec entry, one formula, one numpy reference in
// tests/common/optimizer_reference.py; see ARCHITECTURE.md.
#ifndef TF_TPU_EMB_CORE_OPTIMIZERS_H_
#define TF_TPU_EMB_CORE_OPTIMIZERS_H_

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/optimizer_formulas.h"
#include "core/optimizer_params.gen.h"
#include "tensorflow/core/protobuf/tpu/optimization_parameters.pb.h"

namespace tf_tpu_emb {

using ParametersCase = OptimizationParameters::ParametersCase;

// One optimizer state tensor besides the embedding parameters themselves
// (its initial value comes from OptimizerSpec::slot_init).
struct SlotSpec {
  const char* name;  // as in TF's Load/Retrieve ops ("accumulators", ...)
};

struct OptimizerSpec {
  ParametersCase which;     // the OptimizationParameters oneof case
  const char* proto_field;  // oneof field name ("adagrad", "ftrl", ...)
  const char* op_infix;     // Load/RetrieveTPUEmbedding<op_infix>Parameters
  // TF's (bare) names of the per-table Load/Retrieve ops; ours carry our
  // prefix.  nullptr: the optimizer has no per-table ops.
  const char* load_op;
  const char* retrieve_op;
  // TF 2.21 registers the per-table Load/Retrieve ops for this optimizer.
  // Where it does not, our library adds them under its own prefix only.
  bool core_has_table_ops;
  // False: the engine refuses the optimizer at configure with Unimplemented.
  bool implemented;
  std::vector<SlotSpec> slots;
  // Reads the hyper-parameters into the optimizer's member of HyperParams.
  void (*read)(const OptimizationParameters& p, HyperParams* h);
  // Initial value of every slot, in order (init has slots.size() entries).
  void (*slot_init)(const OptimizationParameters& p, float* init);
  // Appends the tags of the dynamic inputs besides the learning rate.
  void (*dynamic_tags)(const OptimizationParameters& p, std::vector<int>* tags);
  // Stores this step's values of those dynamic inputs (indexed by tag) in h.
  void (*bind_dynamic)(const OptimizationParameters& p, const std::vector<float>& inputs,
                       HyperParams* h);
  // Non-lazy optimizers also update the rows a step did not touch (g = 0).
  bool (*non_lazy)(const OptimizationParameters& p);
  // Updates one row in place from its (accumulated, clipped) gradient.
  void (*update)(const RowArgs& a);
};

// An optimizer whose OptimizationParameters field first appears in a later
// TensorFlow than some this library builds against (spec `min_tf`).  On an
// older TF it is not in AllOptimizers(); a config that carries it arrives as
// an unknown field numbered `proto_number` and is refused at configure.
struct VersionedOptimizer {
  int proto_number;
  const char* proto_field;
  const char* op_infix;
  int min_tf_major;
  int min_tf_minor;
};

namespace opt {

// Shared table entries for optimizers without slots / dynamic inputs /
// laziness switch, and for the ones the engine refuses.
inline void NoSlots(const OptimizationParameters&, float*) {}
inline void NoDynamicTags(const OptimizationParameters&, std::vector<int>*) {}
inline void NoBindDynamic(const OptimizationParameters&, const std::vector<float>&, HyperParams*) {}
inline bool Lazy(const OptimizationParameters&) { return false; }
inline void Unimplemented(const RowArgs&) {}

}  // namespace opt
}  // namespace tf_tpu_emb

// AllOptimizers(): the table, generated from the spec.
#include "core/optimizer_table.gen.h"  // NOLINT(build/include_order)

namespace tf_tpu_emb {

// nullptr when the case is PARAMETERS_NOT_SET or unknown to this build.
inline const OptimizerSpec* FindOptimizer(ParametersCase which) {
  for (const OptimizerSpec& spec : AllOptimizers()) {
    if (spec.which == which) return &spec;
  }
  return nullptr;
}

// Maximum number of state variables (parameters + auxiliaries) that the
// LoadAll/RetrieveAll ops can carry per table.
constexpr int kMaxStateVariables = 8;

// TPU semantics: UNSPECIFIED and ENABLED both mean "accumulate".
inline bool UsesGradientAccumulation(const OptimizationParameters& p) {
  return p.gradient_accumulation_status() !=
         ::tensorflow::tpu::GradientAccumulationStatus::DISABLED;
}

// Initial value of the hidden gradient_accumulators state variable: the
// smallest positive denormal float (bit pattern 0x00000001), as on TPU.
inline float GradientAccumulatorInitialValue() {
  union {
    unsigned int bits;
    float value;
  } u;
  u.bits = 1u;
  return u.value;
}

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_OPTIMIZERS_H_
