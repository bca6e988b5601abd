// The embedding bag: out = combiner(sum_k w_k * E[id_k]).  Shared by the
// engine's Recv, its backward pass and the standalone EmbeddingBag op
// (TPUEmbeddingV0), so the three agree on the combiner arithmetic.
#ifndef TF_TPU_EMB_CORE_BAG_H_
#define TF_TPU_EMB_CORE_BAG_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/bf16.h"
#include "core/cpu_dispatch.h"

namespace tf_tpu_emb {

enum class Combiner : uint8_t { kSum, kMean, kSqrtn };

// The combiner's normaliser 1/N from the bag's sum of weights and sum of
// squared weights: 1 (sum), 1/sum w (mean), 1/sqrt(sum w^2) (sqrtn); 0 when
// the denominator is 0 (TF's div_no_nan; the op docs call such bags invalid).
inline float CombinerScale(Combiner c, float sum_w, float sum_w2) {
  if (c == Combiner::kMean) return sum_w != 0 ? 1.0f / sum_w : 0.0f;
  if (c == Combiner::kSqrtn) return sum_w2 != 0 ? 1.0f / std::sqrt(sum_w2) : 0.0f;
  return 1.0f;
}

// The same for the weights w[0..n) (nullptr: every weight is 1).
inline float BagScale(Combiner c, const float* w, int64_t n) {
  float sum_w = 0, sum_w2 = 0;
  for (int64_t k = 0; k < n; ++k) {
    const float wk = w ? w[k] : 1.0f;
    sum_w += wk;
    sum_w2 += wk * wk;
  }
  return CombinerScale(c, sum_w, sum_w2);
}

// out[0..dim) = combiner(sum_k w_k * transform(base[ids[k] * dim + d])) for
// one bag of n ids; rows (float or Bf16 elements, widened exactly).  Before
// row k is read, ahead(k) runs: the caller's prefetching (a row's memory
// latency, not its arithmetic, is what a lookup waits for).
template <bool kWeighted, typename T, typename Id, typename Transform, typename Ahead>
TF_TPU_EMB_INLINE_INTO_CLONES void ReduceBagWith(const T* base, int dim, const Id* ids,
                                                 const float* w, int64_t n, Combiner combiner,
                                                 float* out, Transform transform, Ahead ahead) {
  std::memset(out, 0, sizeof(float) * dim);
  float sum_w = 0, sum_w2 = 0;
  for (int64_t k = 0; k < n; ++k) {
    ahead(k);
    const T* row = base + int64_t{ids[k]} * dim;
    const float wk = kWeighted ? w[k] : 1.0f;
    sum_w += wk;
    sum_w2 += wk * wk;
    for (int d = 0; d < dim; ++d) out[d] += wk * transform(ToFloat(row[d]));
  }
  const float scale = CombinerScale(combiner, sum_w, sum_w2);
  if (scale != 1.0f) {
    for (int d = 0; d < dim; ++d) out[d] *= scale;
  }
}

// Prefetches the cache lines of one row of `bytes` bytes.  Always inlined:
// GCC deletes calls to a function whose only effect is prefetching (see
// PrefetchStateRows in engine/apply.cc).
TF_TPU_EMB_INLINE_INTO_CLONES void PrefetchRow(const void* row, int bytes) {
  const char* p = static_cast<const char*>(row);
  for (int b = 0; b < bytes; b += 64) __builtin_prefetch(p + b);
}

// ReduceBagWith for a bag on its own: rows are prefetched 4 ids ahead within
// the bag.
template <bool kWeighted, typename T, typename Id, typename Transform>
TF_TPU_EMB_INLINE_INTO_CLONES void ReduceBag(const T* base, int dim, const Id* ids, const float* w,
                                             int64_t n, Combiner combiner, float* out,
                                             Transform transform) {
  const int bytes = dim * static_cast<int>(sizeof(T));
  ReduceBagWith<kWeighted>(base, dim, ids, w, n, combiner, out, transform, [&](int64_t k) {
    if (k + 4 < n) PrefetchRow(base + int64_t{ids[k + 4]} * dim, bytes);
  });
}

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_BAG_H_
