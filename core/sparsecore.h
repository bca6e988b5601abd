// The SparseCore arithmetic of TF's TPUEmbeddingV2 op family, shared by the
// shape functions (ops/sparsecore_ops.cc) and the CPU kernels
// (kernels/sparsecore_*_kernels.cc): the XLA padding of the CSR buffers, the
// pad value, the combiners' gain rescaling and the minibatch split encoding.
// docs/sparsecore_semantics.md says where each rule comes from in TF.
// Header-only, TF-free (core/ includes nothing of ours).
#ifndef TF_TPU_EMB_CORE_SPARSECORE_H_
#define TF_TPU_EMB_CORE_SPARSECORE_H_

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace tf_tpu_emb {
namespace sparsecore {

// The XLA pad size TF's shape functions assume (they cannot ask the TPU
// topology at graph construction; the kernels on a TPU host ask it and get
// 8 on every current chip).  Semantics §2.
inline constexpr int64_t kXlaPadSize = 8;
// What fills the padding of the id buffers (and, converted, of the gains).
inline constexpr int32_t kXlaPadValue = std::numeric_limits<int32_t>::max();
// The minibatch split levels (TF's flag
// tf_xla_sparse_core_minibatch_max_division_level, default 6): 64 divisions
// of the id space per physical replica.  Semantics §4.
inline constexpr int kMaxDivisionLevel = 6;
inline constexpr int kMaxDivisions = 1 << kMaxDivisionLevel;

inline int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct CsrBufferSizes {
  int64_t row_pointers;  // max_minibatches_per_sc * num_sc * RoundUp(num_replica * num_sc, 8)
  int64_t ids;           // max_ids_per_chip
};

inline CsrBufferSizes CsrBufferSizesFor(int64_t num_replica, int64_t num_sc,
                                        int64_t max_minibatches_per_sc,
                                        int64_t max_ids_per_chip) {
  return {max_minibatches_per_sc * num_sc * RoundUp(num_replica * num_sc, kXlaPadSize),
          max_ids_per_chip};
}

// The combiners of the COO conversion (semantics §1): each id's weight
// contributes Contribution(w) to its sample's scale, the scale is
// Transform(sum), and every gain of the sample is multiplied by it.
enum class Combiner { kSum, kMean, kSqrtn };

inline bool ParseCombiner(const std::string& s, Combiner* out) {
  if (s == "sum") *out = Combiner::kSum;
  else if (s == "mean") *out = Combiner::kMean;
  else if (s == "sqrtn") *out = Combiner::kSqrtn;
  else return false;
  return true;
}

inline float CombinerContribution(Combiner c, float w) {
  switch (c) {
    case Combiner::kSum: return 1.0f;
    case Combiner::kMean: return w;
    case Combiner::kSqrtn: return w * w;
  }
  return 1.0f;
}

// 1/x and 1/sqrt(x) rounded once to float (TF computes them in double and
// narrows; for one division or square root the results agree), 0 for 0.
inline float CombinerTransform(Combiner c, float sum) {
  switch (c) {
    case Combiner::kSum: return 1.0f;
    case Combiner::kMean: return sum == 0.0f ? 0.0f : static_cast<float>(1.0 / sum);
    case Combiner::kSqrtn:
      return sum == 0.0f ? 0.0f : static_cast<float>(1.0 / std::sqrt(sum));
  }
  return 1.0f;
}

}  // namespace sparsecore
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_SPARSECORE_H_
