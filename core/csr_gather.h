// The SparseCore lookup's gather, for both front ends (the TF kernels,
// kernels/sparsecore/matmul_kernels.cc, and the JAX FFI handlers,
// jax_ffi/sparsecore_ffi.cc; docs/sparsecore_semantics.md §5 and §11.3):
// the activations of samples [first, last) zeroed, then each id of such a
// sample adds gain * its table row, ids in buffer order, so the result does
// not depend on how the samples are split over threads.
//
// The table rows are random reads, and so are the activation rows (a
// segment's ids are sorted by row, not by sample): both are prefetched a
// few ids ahead, for the ids of this part's samples only (the other parts'
// rows would be read for nothing).
//
// The front end's id type comes with a traits object `t`:
//   const float* t.Row(const Id&) const   the id's table row;
//   static int64_t T::Sample(const Id&)   its activation row;
//   static float T::Gain(const Id&).
#ifndef TF_TPU_EMB_CORE_CSR_GATHER_H_
#define TF_TPU_EMB_CORE_CSR_GATHER_H_

#include <algorithm>
#include <cstdint>

#include "core/cpu_dispatch.h"

namespace tf_tpu_emb {
namespace csr_gather {

// Inlined into the caller, which carries the CPU dispatch of
// core/cpu_dispatch.h.
template <typename T, typename Id>
TF_TPU_EMB_INLINE_INTO_CLONES void GatherPart(const T& t, const Id* ids, int64_t n, int64_t width,
                                              float* act, int64_t first, int64_t last) {
  std::fill(act + first * width, act + last * width, 0.0f);
  constexpr int64_t kAhead = 32;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      const Id& next = ids[i + kAhead];
      const int64_t s = T::Sample(next);
      if (s >= first && s < last) {
        const float* row = t.Row(next);
        const float* out = act + s * width;
        for (int64_t b = 0; b < width; b += 16) {
          __builtin_prefetch(row + b);
          __builtin_prefetch(out + b, 1);
        }
      }
    }
    const Id& id = ids[i];
    const int64_t s = T::Sample(id);
    if (s < first || s >= last) continue;
    float* dst = act + s * width;
    const float* row = t.Row(id);
    const float gain = T::Gain(id);
    for (int64_t d = 0; d < width; ++d) dst[d] += gain * row[d];
  }
}

}  // namespace csr_gather
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_CSR_GATHER_H_
