// The SparseCore preprocessing (§1-§4 of docs/sparsecore_semantics.md) as
// functions of their attrs and input tensors: what the kernels
// (kernels/sparsecore/coo_kernels.cc, kernels/sparsecore/csr_kernels.cc)
// call after reading their attrs, and what the fuzz target
// (fuzz/targets/sparsecore_preprocess.cc) calls with its own context.  The
// computations live in kernels/sparsecore/coo_preprocess.cc (§1-§2) and
// kernels/sparsecore/csr_preprocess.cc (§3-§4); this header also has the
// status helpers that stop a Compute, the vector check and §2's sort and
// merge of COO tokens.
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_PREPROCESS_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_PREPROCESS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sparsecore.h"
#include "kernels/sparsecore/kernel_util.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

#define TTE_SC_CHECK(ctx, cond, status)                \
  do {                                                 \
    if (!(cond)) {                                     \
      (ctx)->CtxFailure(__FILE__, __LINE__, (status)); \
      return;                                          \
    }                                                  \
  } while (0)

#define TTE_SC_OK(ctx, expr)                      \
  do {                                            \
    const absl::Status _st = (expr);              \
    if (!_st.ok()) {                              \
      (ctx)->CtxFailure(__FILE__, __LINE__, _st); \
      return;                                     \
    }                                             \
  } while (0)

inline absl::Status RankOne(const std::string& op, const char* name, const Tensor& t) {
  if (t.dims() != 1) {
    return Invalid(op,
                   absl::StrCat(name, " must be a vector, got shape ", t.shape().DebugString()));
  }
  return absl::OkStatus();
}

// A kept COO token of §2 (or §4): its row, col and merged gain.
// Not zeroed when made (a vector of them is sized to the tokens first).
struct Kept {
  Kept() {}  // NOLINT: leaves the fields unset on purpose
  Kept(int32_t r, int32_t c, float g) : row(r), col(c), gain(g) {}
  int32_t row, col;
  float gain;
};

// Bits needed for values [0, v].
inline int BitsFor(uint64_t v) {
  int bits = 0;
  while (bits < 64 && (v >> bits) != 0) ++bits;
  return bits;
}

// keys[0, n) (col << pos_bits | position) in stable order of the col
// bits [pos_bits, pos_bits + col_bits): an LSD radix sort in as few passes
// of at most 11 bits as the largest col needs, every pass's histogram
// counted in one read.  Each pass is stable, so equal cols keep their
// positions' order; the cost is linear (a comparison sort of the positions
// was most of a SortListOfSparseCoreCooTensors;
// benchmarks/bench_sparsecore.py).
template <int Passes, typename Key>
void RadixPasses(std::vector<Key>* keys, int pos_bits, int digit) {
  const int64_t n = static_cast<int64_t>(keys->size());
  const size_t buckets = size_t{1} << digit;
  const Key digit_mask = static_cast<Key>(buckets - 1);
  // Counts fit int32: fewer than 2^31 tokens (TF's int32 buffers).
  std::vector<int32_t> start(Passes * buckets, 0);
  int32_t* count[Passes];
  int shift[Passes];
  for (int p = 0; p < Passes; ++p) {
    count[p] = start.data() + p * buckets;
    shift[p] = pos_bits + p * digit;
  }
  for (const Key k : *keys) {
    for (int p = 0; p < Passes; ++p) ++count[p][(k >> shift[p]) & digit_mask];
  }
  std::vector<Key> tmp(n);
  for (int p = 0; p < Passes; ++p) {
    int32_t* at = count[p];
    int32_t sum = 0;
    for (size_t b = 0; b < buckets; ++b) {
      const int32_t c = at[b];
      at[b] = sum;
      sum += c;
    }
    const int sh = shift[p];
    Key* out = tmp.data();
    for (const Key k : *keys) out[at[(k >> sh) & digit_mask]++] = k;
    keys->swap(tmp);
  }
}

template <typename Key>
void RadixByCol(std::vector<Key>* keys, int pos_bits, int col_bits) {
  if (col_bits == 0 || keys->size() < 2) return;
  const int passes = (col_bits + 10) / 11;
  const int digit = (col_bits + passes - 1) / passes;
  switch (passes) {
    case 1: return RadixPasses<1>(keys, pos_bits, digit);
    case 2: return RadixPasses<2>(keys, pos_bits, digit);
    default: return RadixPasses<3>(keys, pos_bits, digit);
  }
}

// §2's sort and merge of tokens [begin, end) with keys of type Key (wide
// enough for sort_col << pos_bits | position, sort_col of col_bits bits):
// sort_col is col with its low `rotate` bits moved above the others, so
// the kept tokens come in (col mod 2^rotate, col) order.
template <typename Key, typename OnKept>
void SortAndMergeWith(const int32_t* rows, const int32_t* cols, const float* gains, int64_t begin,
                      int64_t end, int rotate, int high_bits, int pos_bits, std::vector<Kept>* kept,
                      OnKept on_kept) {
  const int64_t n = end - begin;
  const Key low_mask = (Key{1} << rotate) - 1;
  std::vector<Key> keys(n);
  for (int64_t i = 0; i < n; ++i) {
    const Key c = static_cast<Key>(cols[begin + i]);
    const Key sort_col = ((c & low_mask) << high_bits) | (c >> rotate);
    keys[i] = (sort_col << pos_bits) | static_cast<Key>(i);
  }
  RadixByCol(&keys, pos_bits, rotate + high_bits);
  const size_t first = kept->size();
  kept->resize(first + n);
  Kept* out = kept->data() + first;
  int64_t m = 0;
  const Key pos_mask = (Key{1} << pos_bits) - 1;
  const Key high_mask = (Key{1} << high_bits) - 1;
  int32_t prev_row = -1;
  Key prev_col = ~Key{0};
  for (const Key key : keys) {
    const int64_t i = begin + static_cast<int64_t>(key & pos_mask);
    const int32_t row = rows[i];
    const Key sort_col = key >> pos_bits;
    if (row != prev_row || sort_col != prev_col) {
      const int32_t col =
          static_cast<int32_t>(((sort_col & high_mask) << rotate) | (sort_col >> high_bits));
      out[m++] = Kept(row, col, gains[i]);
      on_kept(col, sort_col != prev_col);
    } else {
      out[m - 1].gain += gains[i];
    }
    prev_row = row;
    prev_col = sort_col;
  }
  kept->resize(first + m);
}

// §2's sort and merge of tokens [begin, end): by (col, position); a token
// with the previous token's row and col adds its gain to the kept one,
// every other token is appended to `kept` and reported as on_kept(col,
// new_col), new_col when its col differs from the previous token's.  With
// `rotate` = log2(P) the kept tokens come replica by replica (col mod P),
// each replica's in col order: the order §2's output needs, so writing it
// is sequential; the merging and counts are the same (equal cols stay
// adjacent).  Rows and cols are not negative (checked by the callers);
// fewer than 2^32 tokens (TF's int32 buffers).  The keys are 32 bits when
// col and position fit (half the memory traffic of 64).
template <typename OnKept>
void SortAndMerge(const int32_t* rows, const int32_t* cols, const float* gains, int64_t begin,
                  int64_t end, std::vector<Kept>* kept, OnKept on_kept, int rotate = 0) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  int32_t max_col = 0;
  for (int64_t i = begin; i < end; ++i) max_col = std::max(max_col, cols[i]);
  const int high_bits = BitsFor(static_cast<uint64_t>(max_col) >> rotate);
  const int pos_bits = std::max(1, BitsFor(static_cast<uint64_t>(n - 1)));
  if (rotate + high_bits + pos_bits <= 32) {
    SortAndMergeWith<uint32_t>(rows, cols, gains, begin, end, rotate, high_bits, pos_bits, kept,
                               on_kept);
  } else {
    SortAndMergeWith<uint64_t>(rows, cols, gains, begin, end, rotate, high_bits, pos_bits, kept,
                               on_kept);
  }
}

// ------------------------------------------------------ the computations

// What a preprocessing computation needs of whoever runs it: threads to
// share its parts and its outputs.  A kernel's comes from its
// OpKernelContext (KernelPreprocessContext); a caller without one (the
// fuzz target) gives its own.
struct PreprocessContext {
  int num_threads = 1;
  // Runs fn over ranges covering [0, n) (tsl's ThreadPool::ParallelFor:
  // `cost` a unit's cost; the ranges may run concurrently).
  std::function<void(int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn)>
      parallel_for;
  // Output `index` (the op def's outputs in order, a list output's entries
  // one after the other) of `shape`.
  std::function<absl::Status(int index, const TensorShape& shape, Tensor** out)> allocate;
};

inline PreprocessContext KernelPreprocessContext(OpKernelContext* ctx) {
  ::tsl::thread::ThreadPool* pool = CpuPool(ctx);
  PreprocessContext c;
  c.num_threads = pool->NumThreads();
  c.parallel_for = [pool](int64_t n, int64_t cost,
                          const std::function<void(int64_t, int64_t)>& fn) {
    pool->ParallelFor(n, cost, fn);
  };
  c.allocate = [ctx](int index, const TensorShape& shape, Tensor** out) {
    return ctx->allocate_output(index, shape, out);
  };
  return c;
}

// The `combiner` attr (§1): "sum", "mean" or "sqrtn".
absl::Status ParseCombinerAttr(const std::string& op, const std::string& name,
                               ::tf_tpu_emb::sparsecore::Combiner* out);

// §1's attrs: ConvertToCooTensor reads sample_count and combiner,
// ConvertToListOfSparseCoreCooTensors all of them (CheckList: its checks).
struct CooAttrs {
  int sample_count = 1, num_sc = 1, row_offset = 0, col_offset = 0, col_shift = 0;
  int num_sc_shards = 1, stacked_sample_count = 1;
  ::tf_tpu_emb::sparsecore::Combiner combiner = ::tf_tpu_emb::sparsecore::Combiner::kSum;

  absl::Status CheckList(const std::string& op) const;
};

// ConvertToCooTensor (§1): outputs 0-2 (row_ids, col_ids, gains).
absl::Status ConvertToCoo(const std::string& op, const CooAttrs& a, const Tensor& split,
                          const Tensor& values, const Tensor& weights, PreprocessContext& ctx);

// ConvertToListOfSparseCoreCooTensors (§1): outputs [0, num_sc) row ids,
// [num_sc, 2 num_sc) col ids, [2 num_sc, 3 num_sc) gains.
absl::Status ConvertToCooList(const std::string& op, const CooAttrs& a, const Tensor& split,
                              const Tensor& values, const Tensor& weights, PreprocessContext& ctx);

// The per-SparseCore sort of semantics §2: per group of features sharing a
// col_offset (ascending), the kept tokens in (col, position) order, and each
// physical replica's id and unique id counts.
class SortedList {
 public:
  // The attrs of §2's ops: N, sample_count_list, col_offset_list,
  // num_replica, num_sc_per_chip.
  absl::Status Init(const std::string& op, int n, std::vector<int32_t> sample_counts,
                    std::vector<int32_t> col_offsets, int num_replica, int num_sc);

  // What Run finds: each replica's id and unique id counts and the kept
  // tokens of each group.
  struct Result {
    std::vector<int64_t> counts, uniques;
    std::vector<std::vector<Kept>> kept;
  };

  // The N features' row, col and gain tensors.  The groups are independent:
  // they are sorted on the context's threads.
  absl::Status Run(const std::vector<Tensor>& rows, const std::vector<Tensor>& cols,
                   const std::vector<Tensor>& gains, PreprocessContext& ctx, Result* out) const;

  const std::string& op() const { return op_; }
  int32_t num_physical() const { return num_physical_; }
  int bits() const { return bits_; }
  int32_t batch() const { return batch_; }

 private:
  absl::Status CheckFeature(int f, const Tensor& rows, const Tensor& cols,
                            const Tensor& gains) const;

  std::string op_;
  int n_ = 1;
  std::vector<int32_t> sample_counts_, col_offsets_;
  // The features of each col_offset, in ascending col_offset.
  std::vector<std::pair<int32_t, std::vector<int>>> groups_;
  int32_t num_physical_ = 1, batch_ = 1;
  int bits_ = 0;
};

// GetStatsFromListOfSparseCoreCooTensors (§2): outputs 0-1.
absl::Status GetStatsFromCooList(const SortedList& list, const std::vector<Tensor>& rows,
                                 const std::vector<Tensor>& cols, const std::vector<Tensor>& gains,
                                 PreprocessContext& ctx);

// SortListOfSparseCoreCooTensors (§2): outputs 0-3 (sorted rows, cols,
// gains, id_counts); `table`, `max_ids` and `max_uniques` its attrs.
absl::Status SortCooList(const SortedList& list, const std::string& table, int max_ids,
                         int max_uniques, const std::vector<Tensor>& rows,
                         const std::vector<Tensor>& cols, const std::vector<Tensor>& gains,
                         PreprocessContext& ctx);

// The attrs both CSR ops share (semantics §3): the table, the minibatch
// limit, the SparseCore and physical replica counts, max_ids_per_chip (per
// sample * sample_count_per_sc * num_sc_per_chip with `per_sc`, else per
// sample * sample_count) and the buffer sizes, which must fit int32 (ours);
// max_ids_per_chip a multiple of the pad size (TF's check).
struct CsrAttrs {
  std::string table;
  int max_minibatches = 1, num_sc = 1;
  int64_t num_physical = 1, max_ids = 0;
  ::tf_tpu_emb::sparsecore::CsrBufferSizes sizes{};

  // From the attrs table_name, num_replica, sample_count_per_sc (`per_sc`)
  // or sample_count, max_minibatches_per_sc, max_ids_per_chip_per_sample
  // and num_sc_per_chip.
  absl::Status Init(const std::string& op, bool per_sc, std::string table_name, int num_replica,
                    int sample_count, int max_minibatches_per_sc, int per_sample,
                    int num_sc_per_chip);
};

// ConvertToSparseCoreCsrWrappedCooTensor (§3): the num_sc SparseCores'
// sorted lists and id counts, `splits`; outputs 0-6.
absl::Status ConvertToCsrWrappedCoo(const std::string& op, const CsrAttrs& a, bool allow_dropping,
                                    const std::vector<Tensor>& rows,
                                    const std::vector<Tensor>& cols,
                                    const std::vector<Tensor>& gains,
                                    const std::vector<Tensor>& id_counts, const Tensor& splits,
                                    PreprocessContext& ctx);

// TF's check of the minibatching ops: the chip's samples split evenly over
// its SparseCores (semantics §4).
absl::Status CheckSampleCount(const std::string& op, int sample_count, int num_sc);

// GetMinibatchSplitsWithPhysicalReplica's attrs (§4; Init: its checks).
struct MinibatchSplitsAttrs {
  int sample_count = 1, vocab = 1, num_sc = 1;
  int64_t num_physical = 1;

  absl::Status Init(const std::string& op, int sample_count, int num_replica, int table_vocab_size,
                    int num_sc_per_chip);
};

// GetMinibatchSplitsWithPhysicalReplica (§4): inputs row_ids, col_ids,
// gains (program_key is not read); outputs 0-6.
absl::Status GetMinibatchSplits(const std::string& op, const MinibatchSplitsAttrs& a,
                                const Tensor& rows_t, const Tensor& cols_t, const Tensor& gains_t,
                                PreprocessContext& ctx);

// GetMinibatchesInCsrWithPhysicalReplica (§4): inputs row_ids, col_ids,
// gains, splits, id_counts; outputs 0-6.
absl::Status GetMinibatchesInCsr(const std::string& op, const CsrAttrs& a, const Tensor& rows,
                                 const Tensor& cols, const Tensor& gains, const Tensor& splits_t,
                                 const Tensor& counts_t, PreprocessContext& ctx);

}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_SPARSECORE_PREPROCESS_H_
