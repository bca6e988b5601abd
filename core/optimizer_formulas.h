// The row-update formulas: one hand-written function per optimizer,
// `void <Name>(const RowArgs&, const <Name>Hyper&)`, over the hyper-parameter
// structs generated from tf_tpu_emb/optimizer_specs.py
// (core/optimizer_hypers.gen.h).  Free of TensorFlow: the engine and the
// TensorFlow kernels (through core/optimizers.h and
// core/sparsecore_optimizers.gen.h) and the JAX FFI handlers run these same
// functions.  The formulas: optimization_parameters.proto / TF's
// training_ops (docs/tpu_embedding_semantics.md, section 5) and the
// SparseCore's (docs/sparsecore_semantics.md §6).
#ifndef TF_TPU_EMB_CORE_OPTIMIZER_FORMULAS_H_
#define TF_TPU_EMB_CORE_OPTIMIZER_FORMULAS_H_

#include <algorithm>
#include <cmath>

#include "core/optimizer_hypers.gen.h"

namespace tf_tpu_emb {

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

namespace opt {

inline float Sign(float x) { return (x > 0) - (x < 0); }
// x^(-lr_power), exact sqrt for the default -0.5 as TF's kernels do.
inline float PowNeg(float x, float lr_power) {
  return lr_power == -0.5f ? std::sqrt(x) : std::pow(x, -lr_power);
}

// The formulas: optimization_parameters.proto / TF's training_ops
// (docs/tpu_embedding_semantics.md, section 5).
inline void StochasticGradientDescent(const RowArgs& a, const StochasticGradientDescentHyper&) {
  for (int d = 0; d < a.dim; ++d) a.w[d] -= a.lr * a.g[d];
}

inline void Adagrad(const RowArgs& a, const AdagradHyper&) {
  float* acc = a.s[0];
  for (int d = 0; d < a.dim; ++d) {
    acc[d] += a.g[d] * a.g[d];
    a.w[d] -= a.lr * a.g[d] / std::sqrt(acc[d]);
  }
}

inline void AdagradMomentum(const RowArgs& a, const AdagradMomentumHyper& h) {
  const float exponent = h.exponent != 0 ? h.exponent : 2.0f;
  float *acc = a.s[0], *m = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    acc[d] = h.beta2 == 1.0f ? acc[d] + g * g : h.beta2 * acc[d] + (1 - h.beta2) * g * g;
    const float scale = std::pow(acc[d] + h.epsilon, -1.0f / exponent);
    m[d] = h.momentum * m[d] + scale * g;
    a.w[d] -= a.lr * (h.use_nesterov ? h.momentum * m[d] + scale * g : m[d]);
  }
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
  float *m = a.s[0], *v = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    m[d] = h.beta1 * m[d] + (1 - h.beta1) * g;
    v[d] = h.beta2 * v[d] + (1 - h.beta2) * g * g;
    const float denom = h.use_sum_inside_sqrt ? std::sqrt(v[d] + h.epsilon * h.epsilon)
                                              : std::sqrt(v[d]) + h.epsilon;
    a.w[d] -= a.lr * m[d] / denom;
  }
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
// kDpOverLrFirst: jax-tpu-embedding's association without
// multiply_linear_by_lr, (linear + g) - (dp/lr)*w (JaxFtrl below).
template <bool kDpOverLrFirst>
inline void SparseCoreFtrlForm(const RowArgs& a, const FtrlHyper& h) {
  const float l1 = h.l1, l2 = h.l2, lr = a.lr;
  float *acc = a.s[0], *lin = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    const float acc_new = acc[d] + g * g;
    const float p_old = std::pow(acc[d], -h.lr_power);
    const float p_new = std::pow(acc_new, -h.lr_power);
    const float dp = p_new - p_old;
    float lin_new, numer, denom;
    if (h.multiply_linear_by_lr) {
      lin_new = (lin[d] + lr * g) - dp * a.w[d];
      const float bound = lr * l1;
      numer = l1 == 0 ? -lin_new : std::min(std::max(lin_new, -bound), bound) - lin_new;
      denom = (p_new + 2.0f * lr * l2) + h.beta;
    } else {
      lin_new =
          kDpOverLrFirst ? (lin[d] + g) - (dp / lr) * a.w[d] : (lin[d] + g) - dp * a.w[d] / lr;
      numer = l1 == 0 ? -lin_new : std::min(std::max(lin_new, -l1), l1) - lin_new;
      denom = (p_new + h.beta) / lr + 2.0f * l2;
    }
    a.w[d] = numer / denom;
    acc[d] = acc_new;
    lin[d] = lin_new;
  }
}

inline void SparseCoreFtrl(const RowArgs& a, const FtrlHyper& h) {
  SparseCoreFtrlForm<false>(a, h);
}

// ---- The JAX front end's (jax-tpu-embedding's optimizer computations;
// docs/sparsecore_semantics.md §11), where its arithmetic differs from TF's.

// FTRL: the SparseCore's, but (dp / lr) * w first without multiply_linear_by_lr.
inline void JaxFtrl(const RowArgs& a, const FtrlHyper& h) { SparseCoreFtrlForm<true>(a, h); }

// Adam: the moments in delta form, m += (1-beta1)*(g - m), v += (1-beta2)*(g*g - v),
// and w -= lr * m / (sqrt(v) + epsilon), where the learning rate is the
// package's alpha_t and epsilon its epsilon_hat (they carry the bias correction).
inline void JaxAdam(const RowArgs& a, const AdamHyper& h) {
  float *m = a.s[0], *v = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    m[d] = m[d] + (1.0f - h.beta1) * (g - m[d]);
    v[d] = v[d] + (1.0f - h.beta2) * (g * g - v[d]);
    a.w[d] -= a.lr * m[d] / (std::sqrt(v[d]) + h.epsilon);
  }
}

// LaProp: nu = decay*nu + (1-decay)*(g*g + eps);
// mu = b1*mu + sqrt(1 - b1^2) * g / sqrt(nu); w -= lr * mu.
inline void LaProp(const RowArgs& a, const LaPropHyper& h) {
  float *mu = a.s[0], *nu = a.s[1];
  const float scale = std::pow(1.0f - std::pow(h.b1, 2.0f), 0.5f);
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    nu[d] = nu[d] * h.decay_rate + (1.0f - h.decay_rate) * (g * g + h.eps);
    mu[d] = h.b1 * mu[d] + scale * (g / std::sqrt(nu[d]));
    a.w[d] -= a.lr * mu[d];
  }
}

// Frequency-aware Adagrad (the package's F2A): local_step += 1;
// f = min(pow(max(global_step, 1) / local_step, rho), max_lr_multiplier);
// acc += g*g; w -= lr * (g*f / sqrt(acc) + (l1*sign(w) + l2*w)).
inline void F2a(const RowArgs& a, const F2aHyper& h) {
  float *acc = a.s[0], *local_step = a.s[1];
  for (int d = 0; d < a.dim; ++d) {
    const float g = a.g[d];
    local_step[d] += 1.0f;
    const float f = std::min(std::pow(std::max(h.global_step, 1.0f) / local_step[d], h.rho),
                             h.max_lr_multiplier);
    acc[d] += g * g;
    a.w[d] -= a.lr * ((g * f) / std::sqrt(acc[d]) + (h.l1 * Sign(a.w[d]) + h.l2 * a.w[d]));
  }
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
    acc[d] = std::max(h.accumulator_decay * acc[d] + a.g[d] * a.g[d], h.initial_accumulator_value);
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

#endif  // TF_TPU_EMB_CORE_OPTIMIZER_FORMULAS_H_
