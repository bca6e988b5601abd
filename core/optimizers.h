// The optimizers: the types the generated table is made of, and one
// hand-written row-update formula per optimizer.
//
// What each optimizer is -- its proto field, Load/Retrieve op names, slots and
// their initial values, named typed hyper-parameters, dynamic inputs and
// laziness -- is data in tf_tpu_emb/optimizer_specs.py, from which
// tools/gen_optimizers.py generates core/optimizer_params.gen.h (the
// hyper-parameter structs and their proto readers) and
// core/optimizer_table.gen.h (AllOptimizers()).  Configure-time
// validation, the engine's slot allocation and step, the Load/Retrieve ops
// and the LoadAll/RetrieveAll layout all read that table; none of them has an
// optimizer-specific branch.  Adding an optimizer: one spec entry, one formula
// below (`void <Name>(const RowArgs&, const <Name>Hyper&)`), one numpy
// reference in tests/common/optimizer_reference.py; see ARCHITECTURE.md.
#ifndef TF_TPU_EMB_CORE_OPTIMIZERS_H_
#define TF_TPU_EMB_CORE_OPTIMIZERS_H_

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/optimizer_params.gen.h"
#include "core/row_updates.h"
#include "tensorflow/core/protobuf/tpu/optimization_parameters.pb.h"

namespace tf_tpu_emb {

using ParametersCase = OptimizationParameters::ParametersCase;

// One optimizer state tensor besides the embedding parameters themselves
// (its initial value comes from OptimizerSpec::slot_init).
struct SlotSpec {
  const char* name;  // as in TF's Load/Retrieve ops ("accumulators", ...)
};

// Everything one row update sees.  Vectors have `dim` elements; slots are in
// the SlotSpec order; `hp` holds the table's hyper-parameters and the values
// of its dynamic inputs in this step.
struct RowArgs {
  float* w;
  float* s[kMaxSlots];
  const float* g;
  int dim;
  float lr;
  const HyperParams* hp;
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
inline void NoBindDynamic(const OptimizationParameters&, const std::vector<float>&,
                          HyperParams*) {}
inline bool Lazy(const OptimizationParameters&) { return false; }
inline void Unimplemented(const RowArgs&) {}

inline float Sign(float x) { return (x > 0) - (x < 0); }
// x^(-lr_power), exact sqrt for the default -0.5 as TF's kernels do.
inline float PowNeg(float x, float lr_power) {
  return lr_power == -0.5f ? std::sqrt(x) : std::pow(x, -lr_power);
}

// The formulas: optimization_parameters.proto / TF's training_ops
// (docs/tpu_embedding_semantics.md, section 5).
// Sgd, Adagrad, AdagradMomentum, Adam and the SparseCore's FTRL are shared
// with the JAX FFI library: their arithmetic is in core/row_updates.h.
inline void StochasticGradientDescent(const RowArgs& a, const StochasticGradientDescentHyper&) {
  rows::Sgd(a.w, a.g, a.dim, a.lr);
}

inline void Adagrad(const RowArgs& a, const AdagradHyper&) {
  rows::Adagrad(a.w, a.s[0], a.g, a.dim, a.lr);
}

inline void AdagradMomentum(const RowArgs& a, const AdagradMomentumHyper& h) {
  const float exponent = h.exponent != 0 ? h.exponent : 2.0f;
  rows::AdagradMomentum(a.w, a.s[0], a.s[1], a.g, a.dim, a.lr, h.momentum, h.use_nesterov,
                        exponent, h.beta2, h.epsilon);
}

// Reconstruction (TF publishes only the parameters' meaning,
// docs/tpu_embedding_semantics.md §5.4).
inline void BoundedAdagrad(const RowArgs& a, const BoundedAdagradHyper& h) {
  float* acc = a.s[0];
  for (int d = 0; d < a.dim; ++d) {
    float updated = acc[d] + a.g[d] * a.g[d];
    if (h.max_accumulator > 0) updated = std::min(updated, h.max_accumulator);
    const float effective = h.update_accumulator_first ? updated : acc[d];
    float delta = a.lr * a.g[d] / std::sqrt(effective);
    if (h.max_var_update > 0) {
      delta = std::min(std::max(delta, -h.max_var_update), h.max_var_update);
    }
    a.w[d] -= delta;
    acc[d] = updated;
  }
}

inline void Adam(const RowArgs& a, const AdamHyper& h) {
  rows::Adam(a.w, a.s[0], a.s[1], a.g, a.dim, a.lr, h.beta1, h.beta2, h.epsilon,
             h.use_sum_inside_sqrt);
}

inline void Ftrl(const RowArgs& a, const FtrlHyper& h) {
  const float l1 = h.l1, l2 = h.l2, lr = a.lr;
  float *n = a.s[0], *z = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    const float n_new = n[d] + g * g;
    const float p_new = PowNeg(n_new, h.lr_power);
    const float sigma = p_new - PowNeg(n[d], h.lr_power);
    if (h.multiply_linear_by_lr) {
      z[d] += lr * g - sigma * a.w[d];
      const float l1_lr = l1 * lr;
      const float clipped = std::min(std::max(z[d], -l1_lr), l1_lr);
      a.w[d] = (clipped - z[d]) / (p_new + h.beta + 2 * lr * l2);
    } else {
      z[d] += g - sigma / lr * a.w[d];
      const float clipped = std::min(std::max(z[d], -l1), l1);
      a.w[d] = (clipped - z[d]) / ((p_new + h.beta) / lr + 2 * l2);
    }
    n[d] = n_new;
  }
}

// The SparseCore's FTRL (TPUEmbeddingV2's gradient ops and XlaSparseCoreFtrl;
// docs/sparsecore_semantics.md §6): the same update as Ftrl above, but TF's
// SparseCore builder associates it differently -- (linear + lr*g) - dp*w,
// (p + 2*lr*l2) + beta -- takes a generic pow for every lr_power, and writes
// -linear' (not 0 - linear') where l1 is 0.  Not in the optimizer table (no
// proto field of its own): the SparseCore kernels call it directly.
inline void SparseCoreFtrl(const RowArgs& a, const FtrlHyper& h) {
  rows::SparseCoreFtrl(a.w, a.s[0], a.s[1], a.g, a.dim, a.lr, h.l1, h.l2, h.lr_power, h.beta,
                       h.multiply_linear_by_lr);
}

inline void Momentum(const RowArgs& a, const MomentumHyper& h) {
  float* m = a.s[0];
  for (int d = 0; d < a.dim; ++d) {
    m[d] = h.momentum * m[d] + a.g[d];
    a.w[d] -= a.lr * (h.use_nesterov ? a.g[d] + h.momentum * m[d] : m[d]);
  }
}

inline void RmsProp(const RowArgs& a, const RmsPropHyper& h) {
  float *ms = a.s[0], *mom = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    ms[d] += (g * g - ms[d]) * (1 - h.rho);
    mom[d] = h.momentum * mom[d] + a.lr * g / std::sqrt(ms[d] + h.epsilon);
    a.w[d] -= mom[d];
  }
}

inline void CenteredRmsProp(const RowArgs& a, const CenteredRmsPropHyper& h) {
  float *ms = a.s[0], *mom = a.s[1], *mg = a.s[2];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    ms[d] += (g * g - ms[d]) * (1 - h.rho);
    mg[d] += (g - mg[d]) * (1 - h.rho);
    mom[d] = h.momentum * mom[d] + a.lr * g / std::sqrt(ms[d] - mg[d] * mg[d] + h.epsilon);
    a.w[d] -= mom[d];
  }
}

inline void ProximalAdagrad(const RowArgs& a, const ProximalAdagradHyper& h) {
  float* acc = a.s[0];
  for (int d = 0; d < a.dim; ++d) {
    acc[d] += a.g[d] * a.g[d];
    const float eta = a.lr / std::sqrt(acc[d]);
    const float v = a.w[d] - eta * a.g[d];
    a.w[d] = h.l1 > 0 ? Sign(v) * std::max(std::abs(v) - eta * h.l1, 0.0f) / (1 + eta * h.l2)
                      : v / (1 + eta * h.l2);
  }
}

inline void Adadelta(const RowArgs& a, const AdadeltaHyper& h) {
  float *acc = a.s[0], *upd = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    acc[d] = h.rho * acc[d] + (1 - h.rho) * g * g;
    const float delta = std::sqrt(upd[d] + h.epsilon) / std::sqrt(acc[d] + h.epsilon) * g;
    a.w[d] -= a.lr * delta;
    upd[d] = h.rho * upd[d] + (1 - h.rho) * delta * delta;
  }
}

// Reconstruction (docs/tpu_embedding_semantics.md §5.13): FTRL whose
// accumulator is Yogi's second moment.
inline void OnlineYogi(const RowArgs& a, const OnlineYogiHyper& h) {
  float *v = a.s[0], *z = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g2 = a.g[d] * a.g[d];
    const float v_new = v[d] - (1 - h.beta2) * Sign(v[d] - g2) * g2;
    const float sigma = (std::sqrt(v_new) - std::sqrt(v[d])) / a.lr;
    z[d] += a.g[d] - sigma * a.w[d];
    const float clipped = std::min(std::max(z[d], -h.l1), h.l1);
    a.w[d] = (clipped - z[d]) / (std::sqrt(v_new) / a.lr + 2 * h.l2);
    v[d] = v_new;
  }
}

// Reconstruction (docs/tpu_embedding_semantics.md §5.14): Yogi with proximal L1/L2.
inline void ProximalYogi(const RowArgs& a, const ProximalYogiHyper& h) {
  float *v = a.s[0], *m = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d], g2 = g * g;
    m[d] = h.beta1 * m[d] + (1 - h.beta1) * g;
    v[d] -= (1 - h.beta2) * Sign(v[d] - g2) * g2;
    const float eta = a.lr / (std::sqrt(v[d]) + h.epsilon);
    const float u = a.w[d] - eta * m[d];
    a.w[d] = Sign(u) * std::max(std::abs(u) - eta * h.l1, 0.0f) / (1 + eta * h.l2);
  }
}

// The "learning rate" carries the global step
// (docs/tpu_embedding_semantics.md §5.15); the gradient is
// ignored.  Parameters hold the estimated delta D.
inline void FrequencyEstimator(const RowArgs& a, const FrequencyEstimatorHyper& h) {
  float* last = a.s[0];
  for (int d = 0; d < a.dim; ++d) {
    const float delta = a.lr - last[d];
    const float clipped = std::min(delta, h.max_delta);
    const bool outlier = delta >= h.outlier_threshold * a.w[d];
    a.w[d] = outlier ? clipped : a.w[d] * (1 - h.tau) + clipped * h.tau;
    last[d] = a.lr;
  }
}

inline void Lion(const RowArgs& a, const LionHyper& h) {
  float* m = a.s[0];
  for (int d = 0; d < a.dim; ++d) {
    const float c = h.beta1 * m[d] + (1 - h.beta1) * a.g[d];
    a.w[d] -= a.lr * Sign(c);
    m[d] = h.beta2 * m[d] + (1 - h.beta2) * a.g[d];
  }
}

// Reconstruction (the proto's text is inconsistent,
// docs/tpu_embedding_semantics.md §5.18): the id's
// frequency estimate is counter / step; rarer ids get a larger step,
// lr_scale = min((step / counter)^probability_exponent, max_lr_multiplier).
inline void FrequencyAwareAdagrad(const RowArgs& a, const FrequencyAwareAdagradHyper& h) {
  float *acc = a.s[0], *counter = a.s[1];
  const float step = std::max(h.step_counter, 1.0f);
  for (int d = 0; d < a.dim; ++d) {
    counter[d] += 1;
    acc[d] = std::max(h.accumulator_decay * acc[d] + a.g[d] * a.g[d],
                      h.initial_accumulator_value);
    float scale = std::pow(step / counter[d], h.probability_exponent);
    if (h.max_lr_multiplier > 0) scale = std::min(scale, h.max_lr_multiplier);
    float update = a.g[d] * scale / std::sqrt(acc[d]);
    if (h.l1_regularization_strength > 0) update += h.l1_regularization_strength * Sign(a.w[d]);
    if (h.l2_regularization_strength > 0) update += h.l2_regularization_strength * a.w[d];
    a.w[d] -= a.lr * update;
  }
}

inline void Assign(const RowArgs& a, const AssignHyper&) {
  for (int d = 0; d < a.dim; ++d) a.w[d] = a.g[d];
}

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
  union { unsigned int bits; float value; } u;
  u.bits = 1u;
  return u.value;
}

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_OPTIMIZERS_H_
