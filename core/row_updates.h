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
inline void SparseCoreFtrl(float* w, float* acc, float* lin, const float* g, int dim, float lr,
                           float l1, float l2, float lr_power, float beta,
                           bool multiply_linear_by_lr) {
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
      lin_new = (lin[d] + gd) - dp * w[d] / lr;
      numer = l1 == 0 ? -lin_new : std::min(std::max(lin_new, -l1), l1) - lin_new;
      denom = (p_new + beta) / lr + 2.0f * l2;
    }
    w[d] = numer / denom;
    acc[d] = acc_new;
    lin[d] = lin_new;
  }
}

}  // namespace rows
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_ROW_UPDATES_H_
