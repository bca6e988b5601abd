// The SparseCore arithmetic of TF's TPUEmbeddingV2 op family, shared by the
// shape functions (ops/sparsecore_ops.cc) and the CPU kernels
// (kernels/sparsecore/*_kernels.cc): the XLA padding of the CSR buffers, the
// pad value, the combiners' gain rescaling and the minibatch split encoding.
// docs/sparsecore_semantics.md says where each rule comes from in TF.
// Header-only, TF-free (core/ includes nothing of ours).
#ifndef TF_TPU_EMB_CORE_SPARSECORE_H_
#define TF_TPU_EMB_CORE_SPARSECORE_H_

#include <atomic>
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

// The checks every reader of the CSR buffers makes (the TF kernels'
// kernels/sparsecore/chips.h and custom_combiner_kernels.cc, the JAX FFI
// handlers; docs/sparsecore_semantics.md §5): each returns "" or the error.
// Segment k is [begin, end): begin is row_pointers[k - 1] rounded up to the
// XLA pad size (0 for k = 0), end is row_pointers[k], within the n ids.
inline std::string CheckCsrSegment(int64_t k, int64_t begin, int64_t end, int64_t n) {
  if (end >= begin && end <= n) return "";
  return "row_pointers[" + std::to_string(k) + "] = " + std::to_string(end) + " must lie in [" +
         std::to_string(begin) + ", " + std::to_string(n) +
         "] (the segment's start, the ids' length)";
}

// Id i's sample (below `batch`, the samples per SparseCore) and token
// (below `shard_rows`, the rows of a SparseCore's table shard).
inline std::string CheckCsrId(int64_t i, int64_t sample, int64_t batch, int64_t token,
                              int64_t shard_rows) {
  if (sample < 0 || sample >= batch) {
    return "sorted_sample_ids[" + std::to_string(i) + "] = " + std::to_string(sample) +
           " is outside [0, " + std::to_string(batch) + ") (samples per sparse core)";
  }
  if (token < 0 || token >= shard_rows) {
    return "sorted_token_ids[" + std::to_string(i) + "] = " + std::to_string(token) +
           " is outside [0, " + std::to_string(shard_rows) +
           ") (rows of a sparse core's table shard)";
  }
  return "";
}

// a * b for a, b >= 0, or INT64_MAX where that does not fit: the sizes the
// SparseCore ops derive from their int attrs (each up to 2^31 - 1, three of
// them overflow int64); the kernels refuse any size beyond int32.
inline int64_t SaturatingMul(int64_t a, int64_t b) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (a == 0 || b == 0) return 0;
  return a > kMax / b ? kMax : a * b;
}

struct CsrBufferSizes {
  int64_t row_pointers;  // max_minibatches_per_sc * num_sc * RoundUp(num_replica * num_sc, 8)
  int64_t ids;           // max_ids_per_chip
};

// Saturated at INT64_MAX (SaturatingMul).
inline CsrBufferSizes CsrBufferSizesFor(int64_t num_replica, int64_t num_sc,
                                        int64_t max_minibatches_per_sc, int64_t max_ids_per_chip) {
  const int64_t p = SaturatingMul(num_replica, num_sc);
  const int64_t group = p > std::numeric_limits<int64_t>::max() - kXlaPadSize
                            ? std::numeric_limits<int64_t>::max()
                            : RoundUp(p, kXlaPadSize);
  return {SaturatingMul(SaturatingMul(max_minibatches_per_sc, num_sc), group), max_ids_per_chip};
}

// max_ids_per_chip: max_ids_per_chip_per_sample * sample_count (times
// num_sc_per_chip where the sample count is per SparseCore), saturated.
inline int64_t MaxIdsPerChip(int64_t per_sample, int64_t sample_count, int64_t num_sc) {
  return SaturatingMul(SaturatingMul(per_sample, sample_count), num_sc);
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
    case Combiner::kSqrtn: return sum == 0.0f ? 0.0f : static_cast<float>(1.0 / std::sqrt(sum));
  }
  return 1.0f;
}

// ------------------------------------------------------------- several chips
// The stand-in SparseCore TPU system (tf_tpu_emb/tpu/system.py with
// embedding="v2"; docs/sparsecore_semantics.md "Multi-chip"): `replicas`
// chips, replica k on /device:CPU:k, `sparsecores_per_chip` SparseCores each.
// The lookup and gradient kernels read it (a TPU's kernels read the TPU
// topology); `generation` changes with every Set, so a new system (or
// initialize_tpu_system) starts the kernels' per-call meeting counts afresh.
// replicas == 0: no stand-in system -- the one-chip CPU model of §5-§6.
struct ChipSystem {
  int64_t replicas = 0;
  int64_t sparsecores_per_chip = 0;
  int64_t generation = 0;
};

inline std::atomic<int64_t>& ChipSystemWord() {
  // replicas (16 bits), sparsecores per chip (16 bits), generation (31 bits).
  static std::atomic<int64_t> word{0};
  return word;
}

inline ChipSystem CurrentChipSystem() {
  const int64_t w = ChipSystemWord().load();
  return {w & 0xffff, (w >> 16) & 0xffff, w >> 32};
}

// Installs (replicas > 0) or removes (0) the stand-in system; false for a
// count outside [0, 65535].
inline bool SetChipSystem(int64_t replicas, int64_t sparsecores_per_chip) {
  if (replicas < 0 || replicas > 0xffff || sparsecores_per_chip < 0 ||
      sparsecores_per_chip > 0xffff) {
    return false;
  }
  int64_t old = ChipSystemWord().load();
  for (;;) {
    const int64_t generation = ((old >> 32) + 1) & 0x7fffffff;
    const int64_t word = (generation << 32) | (sparsecores_per_chip << 16) | replicas;
    if (ChipSystemWord().compare_exchange_weak(old, word)) return true;
  }
}

// Where physical SparseCore shard `shard` (of replicas * sparsecores_per_chip,
// the `col & (P - 1)` of §2) lives: chip `shard / S`, that chip's local
// shard `shard % S` (TF's stacked variable: shard p is rows [p*R, (p+1)*R) of
// the logical stacked table, and chip k holds shards [k*S, (k+1)*S)).
struct ShardHome {
  int64_t chip, local_shard;
};
inline ShardHome HomeOfShard(int64_t shard, int64_t sparsecores_per_chip) {
  return {shard / sparsecores_per_chip, shard % sparsecores_per_chip};
}

}  // namespace sparsecore
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_SPARSECORE_H_
