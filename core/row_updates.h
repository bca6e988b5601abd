// The per-row update formulas of the optimizers that a SparseCore applies
// (docs/sparsecore_semantics.md §6 and "The JAX (jax-tpu-embedding) layout"),
// on plain arrays: one implementation for both front ends.  TF's op library
// reaches them through core/optimizers.h (whose functions take the generated
// hyper-parameter structs and call these); the JAX FFI library (jax_ffi/)
// includes this header alone.  TF-free and header-only: nothing here may
// include TensorFlow, protobuf or absl.
//
// Each function updates one row of `dim` float32 elements in place from its
// (already summed) gradient `g`, element by element, in the association the
// cited document gives.
#ifndef TF_TPU_EMB_CORE_ROW_UPDATES_H_
#define TF_TPU_EMB_CORE_ROW_UPDATES_H_

#include <algorithm>
#include <cmath>

namespace tf_tpu_emb {
namespace rows {

// w -= lr * g
inline void Sgd(float* w, const float* g, int dim, float lr) {
  for (int d = 0; d < dim; ++d) w[d] -= lr * g[d];
}

// acc += g*g; w -= lr * g / sqrt(acc)
inline void Adagrad(float* w, float* acc, const float* g, int dim, float lr) {
  for (int d = 0; d < dim; ++d) {
    acc[d] += g[d] * g[d];
    w[d] -= lr * g[d] / std::sqrt(acc[d]);
  }
}

// acc = beta2 == 1 ? acc + g*g : beta2*acc + (1-beta2)*g*g;
// s = pow(acc + epsilon, -1/exponent) * g; m = momentum*m + s;
// w -= lr * (use_nesterov ? momentum*m + s : m)
inline void AdagradMomentum(float* w, float* acc, float* m, const float* g, int dim, float lr,
                            float momentum, bool use_nesterov, float exponent, float beta2,
                            float epsilon) {
  for (int d = 0; d < dim; ++d) {
    const float gd = g[d];
    acc[d] = beta2 == 1.0f ? acc[d] + gd * gd : beta2 * acc[d] + (1 - beta2) * gd * gd;
    const float scale = std::pow(acc[d] + epsilon, -1.0f / exponent);
    m[d] = momentum * m[d] + scale * gd;
    w[d] -= lr * (use_nesterov ? momentum * m[d] + scale * gd : m[d]);
  }
}

// m = beta1*m + (1-beta1)*g; v = beta2*v + (1-beta2)*g*g;
// w -= lr * m / (use_sum_inside_sqrt ? sqrt(v + eps*eps) : sqrt(v) + eps)
inline void Adam(float* w, float* m, float* v, const float* g, int dim, float lr, float beta1,
                 float beta2, float epsilon, bool use_sum_inside_sqrt) {
  for (int d = 0; d < dim; ++d) {
    const float gd = g[d];
    m[d] = beta1 * m[d] + (1 - beta1) * gd;
    v[d] = beta2 * v[d] + (1 - beta2) * gd * gd;
    const float denom = use_sum_inside_sqrt ? std::sqrt(v[d] + epsilon * epsilon)
                                            : std::sqrt(v[d]) + epsilon;
    w[d] -= lr * m[d] / denom;
  }
}

// The SparseCore's FTRL (docs/sparsecore_semantics.md §6): generic pow,
// (linear + lr*g) - dp*w, (p + 2*lr*l2) + beta, and -linear' where l1 is 0.
// Without multiply_linear_by_lr TF's builder takes (linear + g) - dp*w/lr;
// jax-tpu-embedding's (dp_over_lr_first) (linear + g) - (dp/lr)*w.
inline void SparseCoreFtrl(float* w, float* acc, float* lin, const float* g, int dim, float lr,
                           float l1, float l2, float lr_power, float beta,
                           bool multiply_linear_by_lr, bool dp_over_lr_first = false) {
  for (int d = 0; d < dim; ++d) {
    const float gd = g[d];
    const float acc_new = acc[d] + gd * gd;
    const float p_old = std::pow(acc[d], -lr_power);
    const float p_new = std::pow(acc_new, -lr_power);
    const float dp = p_new - p_old;
    float lin_new, numer, denom;
    if (multiply_linear_by_lr) {
      lin_new = (lin[d] + lr * gd) - dp * w[d];
      const float bound = lr * l1;
      numer = l1 == 0 ? -lin_new : std::min(std::max(lin_new, -bound), bound) - lin_new;
      denom = (p_new + 2.0f * lr * l2) + beta;
    } else {
      lin_new = dp_over_lr_first ? (lin[d] + gd) - (dp / lr) * w[d] : (lin[d] + gd) - dp * w[d] / lr;
      numer = l1 == 0 ? -lin_new : std::min(std::max(lin_new, -l1), l1) - lin_new;
      denom = (p_new + beta) / lr + 2.0f * l2;
    }
    w[d] = numer / denom;
    acc[d] = acc_new;
    lin[d] = lin_new;
  }
}

// jax-tpu-embedding's Adam (its optimizer computation): the moments in the
// delta form m += (1-beta1)*(g - m), v += (1-beta2)*(g*g - v), and
// w -= alpha_t * m / (sqrt(v) + epsilon_hat), where the caller's alpha_t and
// epsilon_hat carry the bias correction (the package's hyper-parameters).
inline void AdamDeltaForm(float* w, float* m, float* v, const float* g, int dim, float alpha_t,
                          float beta1, float beta2, float epsilon_hat) {
  for (int d = 0; d < dim; ++d) {
    const float gd = g[d];
    m[d] = m[d] + (1.0f - beta1) * (gd - m[d]);
    v[d] = v[d] + (1.0f - beta2) * (gd * gd - v[d]);
    w[d] -= alpha_t * m[d] / (std::sqrt(v[d]) + epsilon_hat);
  }
}

// LaProp (jax-tpu-embedding's): nu = decay*nu + (1-decay)*(g*g + eps);
// mu = b1*mu + pow(1 - pow(b1, 2), 0.5) * g / sqrt(nu); w -= lr * mu.
inline void LaProp(float* w, float* mu, float* nu, const float* g, int dim, float lr, float b1,
                   float decay, float eps) {
  const float scale = std::pow(1.0f - std::pow(b1, 2.0f), 0.5f);
  for (int d = 0; d < dim; ++d) {
    const float gd = g[d];
    nu[d] = nu[d] * decay + (1.0f - decay) * (gd * gd + eps);
    mu[d] = b1 * mu[d] + scale * (gd / std::sqrt(nu[d]));
    w[d] -= lr * mu[d];
  }
}

// Frequency-aware Adagrad (jax-tpu-embedding's F2A): local_step += 1;
// f = min(pow(max(global_step, 1) / local_step, rho), max_lr_multiplier);
// acc += g*g; w -= lr * (g*f / sqrt(acc) + (l1*sign(w) + l2*w)).
inline void F2A(float* w, float* acc, float* local_step, const float* g, int dim, float lr,
                float rho, float l1, float l2, float max_lr_multiplier, float global_step) {
  for (int d = 0; d < dim; ++d) {
    const float gd = g[d];
    local_step[d] += 1.0f;
    const float f = std::min(std::pow(std::max(global_step, 1.0f) / local_step[d], rho),
                             max_lr_multiplier);
    acc[d] += gd * gd;
    const float sign = static_cast<float>((w[d] > 0) - (w[d] < 0));
    w[d] -= lr * ((gd * f) / std::sqrt(acc[d]) + (l1 * sign + l2 * w[d]));
  }
}

}  // namespace rows
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_ROW_UPDATES_H_
