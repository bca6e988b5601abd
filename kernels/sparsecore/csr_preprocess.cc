// The SparseCore CSR preprocessing (TPUEmbeddingV2) as functions of attrs
// and tensors (kernels/sparsecore/preprocess.h): the padded CSR buffers
// (ConvertToSparseCoreCsrWrappedCooTensor) and the minibatching path
// (GetMinibatchSplitsWithPhysicalReplica,
// GetMinibatchesInCsrWithPhysicalReplica).  Their kernels are
// kernels/sparsecore/csr_kernels.cc.  What each computes:
// docs/sparsecore_semantics.md §3-§4; the shared arithmetic is
// core/sparsecore.h.  Every input is checked before anything is written: a
// bad one is InvalidArgument naming the op and the offending index, never an
// out-of-bounds access.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sparsecore.h"
#include "kernels/sparsecore/preprocess.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {

namespace sc = ::tf_tpu_emb::sparsecore;

namespace {

// ------------------------------------------------------------ §3 CSR buffers

// The sorted split points of a minibatch bit set, with 0 and kMaxDivisions
// around them (semantics §4).
std::vector<int> BucketBounds(uint64_t splits) {
  std::vector<int> bounds = {0};
  for (int bit = 0; bit < 63; ++bit) {
    if (!((splits >> bit) & 1)) continue;
    int level = 0;
    while ((2 << level) - 1 <= bit) ++level;  // bit in [2^level - 1, 2^(level+1) - 1)
    const int section = bit - ((1 << level) - 1);
    const int size = 1 << (sc::kMaxDivisionLevel - 1 - level);
    bounds.push_back(size + section * size * 2);
  }
  std::sort(bounds.begin() + 1, bounds.end());
  bounds.push_back(sc::kMaxDivisions);
  return bounds;
}

// Where a SparseCore's sorted ids come from (semantics §3): its rows, cols,
// gains and id_counts, and the id_counts position of (bucket bound, replica).
struct CsrSource {
  std::vector<const int32_t*> rows, cols, counts;
  std::vector<const float*> gains;
  std::function<int64_t(int sc, int64_t bound, int64_t replica)> position;
};

// Writes the seven outputs of the CSR buffers (semantics §3): for each
// SparseCore, minibatch and replica the segment's ids, the row pointer and
// the padding; the tails TF leaves unwritten filled (ours).  The sources'
// positions have been checked by the caller.
absl::Status WriteCsr(PreprocessContext& ctx, const std::string& op, const std::string& table,
                      const CsrSource& source, const std::vector<int>& bounds, int num_sc,
                      int64_t p, int64_t num_row_pointers, int64_t max_ids, bool allow_dropping,
                      int64_t total_ids, bool minibatching) {
  const int64_t num_minibatches = static_cast<int64_t>(bounds.size()) - 1;
  Tensor *row_pointers_t, *sample_ids_t, *token_ids_t, *gains_t;
  TF_RETURN_IF_ERROR(ctx.allocate(0, TensorShape({num_row_pointers}), &row_pointers_t));
  TF_RETURN_IF_ERROR(ctx.allocate(1, TensorShape({max_ids}), &sample_ids_t));
  TF_RETURN_IF_ERROR(ctx.allocate(2, TensorShape({max_ids}), &token_ids_t));
  TF_RETURN_IF_ERROR(ctx.allocate(3, TensorShape({max_ids}), &gains_t));
  int32_t* row_pointers = row_pointers_t->flat<int32_t>().data();
  int32_t* sample_ids = sample_ids_t->flat<int32_t>().data();
  int32_t* token_ids = token_ids_t->flat<int32_t>().data();
  float* out_gains = gains_t->flat<float>().data();
  const float pad_gain = static_cast<float>(sc::kXlaPadValue);

  // The layout first (row pointers, where each segment goes, the id
  // dropping check), one pass in order; then the segments' ids are copied
  // and padded on the context's threads (disjoint ranges of the buffers).
  struct Segment {
    int s;
    int64_t begin, count, at, padded;
  };
  std::vector<Segment> segments;
  int64_t at = 0, pointer = 0, packed = 0;
  for (int s = 0; s < num_sc; ++s) {
    const int32_t* counts = source.counts[s];
    for (int64_t b = 1; b <= num_minibatches; ++b) {
      for (int64_t rep = 0; rep < p; ++rep) {
        // Without minibatching every bucket takes the replica's whole
        // segment (TF's loop, semantics §3).
        const int64_t begin_pos =
            minibatching ? source.position(s, bounds[b - 1], rep) : source.position(s, 0, rep);
        const int64_t end_pos =
            minibatching ? source.position(s, bounds[b], rep) : source.position(s, 1, rep);
        const int64_t begin = counts[begin_pos];
        int64_t count = counts[end_pos] - begin;
        if (at + count > max_ids) {
          if (!allow_dropping) {
            return Invalid(op, absl::StrCat("The max_ids_per_chip is set to be ", max_ids,
                                            " which is not going to fit all ids. The remaining "
                                            "id count is ",
                                            total_ids - packed,
                                            " . Please consider setting the allow_id_dropping "
                                            "to be true. (table ",
                                            table, ", sparse core ", s, ")"));
          }
          count = max_ids - at;
        }
        const int64_t end = at + count;
        packed += count;
        row_pointers[pointer++] = static_cast<int32_t>(end);
        const int64_t padded = std::min(sc::RoundUp(end, sc::kXlaPadSize), max_ids);
        segments.push_back({s, begin, count, at, padded});
        at = padded;
      }
      const int64_t padded = sc::RoundUp(pointer, sc::kXlaPadSize);
      std::fill(row_pointers + pointer, row_pointers + padded, static_cast<int32_t>(at));
      pointer = padded;
    }
  }
  const int64_t cost = 12 * (packed / std::max<size_t>(1, segments.size()) + sc::kXlaPadSize);
  ctx.parallel_for(static_cast<int64_t>(segments.size()), cost, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const Segment& g = segments[k];
      std::copy_n(source.cols[g.s] + g.begin, g.count, token_ids + g.at);
      std::copy_n(source.rows[g.s] + g.begin, g.count, sample_ids + g.at);
      std::copy_n(source.gains[g.s] + g.begin, g.count, out_gains + g.at);
      const int64_t end = g.at + g.count;
      std::fill(token_ids + end, token_ids + g.padded, sc::kXlaPadValue);
      std::fill(sample_ids + end, sample_ids + g.padded, sc::kXlaPadValue);
      std::fill(out_gains + end, out_gains + g.padded, pad_gain);
    }
  });
  // Ours: the tails TF leaves unwritten.
  std::fill(row_pointers + pointer, row_pointers + num_row_pointers, static_cast<int32_t>(at));
  std::fill(token_ids + at, token_ids + max_ids, sc::kXlaPadValue);
  std::fill(sample_ids + at, sample_ids + max_ids, sc::kXlaPadValue);
  std::fill(out_gains + at, out_gains + max_ids, pad_gain);

  Tensor *row_pointers_unpadded, *ids_unpadded, *minibatches;
  TF_RETURN_IF_ERROR(ctx.allocate(4, TensorShape({}), &row_pointers_unpadded));
  TF_RETURN_IF_ERROR(ctx.allocate(5, TensorShape({}), &ids_unpadded));
  TF_RETURN_IF_ERROR(ctx.allocate(6, TensorShape({}), &minibatches));
  row_pointers_unpadded->scalar<int32_t>()() =
      static_cast<int32_t>(num_sc * num_minibatches * sc::RoundUp(p, sc::kXlaPadSize));
  ids_unpadded->scalar<int32_t>()() = static_cast<int32_t>(at);
  minibatches->scalar<int32_t>()() = static_cast<int32_t>(num_minibatches);
  return absl::OkStatus();
}

// The minibatch bounds of `splits` (its elements' bits or'ed; a negative
// element is InvalidArgument, ours: semantics §4).
absl::Status SplitBounds(const std::string& op, const Tensor& splits_t, std::vector<int>* bounds) {
  uint64_t splits = 0;
  const auto split_values = splits_t.flat<int64_t>();
  for (int64_t i = 0; i < split_values.size(); ++i) {
    if (split_values(i) < 0) {
      return Invalid(op, absl::StrCat("splits[", i, "] = ", split_values(i),
                                      " is negative (bit 63 is no split point)"));
    }
    splits |= static_cast<uint64_t>(split_values(i));
  }
  *bounds = BucketBounds(splits);
  return absl::OkStatus();
}

// Every entry of `counts` (`name`) non-decreasing from 0 and at most `n`,
// the length of `what` (ours: TF checks only the last).
absl::Status CheckIdCounts(const std::string& op, const std::string& name,
                           const ::tensorflow::TTypes<int32_t>::ConstFlat& counts, int64_t n,
                           const char* what) {
  for (int64_t i = 0; i < counts.size(); ++i) {
    const int32_t prev = i == 0 ? 0 : counts(i - 1);
    if (counts(i) < prev || counts(i) > n) {
      return Invalid(op, absl::StrCat(name, "[", i, "] = ", counts(i), " must lie in [", prev, ", ",
                                      n, "] (non-decreasing, at most ", what, " length)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSampleCount(const std::string& op, int sample_count, int num_sc) {
  if (sample_count % num_sc == 0) return absl::OkStatus();
  return Invalid(op,
                 absl::StrCat("sample_count ", sample_count,
                              " is not divisible by the number of sparsecores per chip ", num_sc));
}

absl::Status CsrAttrs::Init(const std::string& op, bool per_sc, std::string table_name,
                            int num_replica, int sample_count, int max_minibatches_per_sc,
                            int per_sample, int num_sc_per_chip) {
  table = std::move(table_name);
  max_minibatches = max_minibatches_per_sc;
  num_sc = num_sc_per_chip;
  if (!per_sc) TF_RETURN_IF_ERROR(CheckSampleCount(op, sample_count, num_sc));
  num_physical = static_cast<int64_t>(num_replica) * num_sc;
  // Each product saturates (three int attrs overflow int64) and is refused.
  max_ids = sc::MaxIdsPerChip(per_sample, sample_count, per_sc ? num_sc : 1);
  sizes = sc::CsrBufferSizesFor(num_replica, num_sc, max_minibatches, max_ids);
  // Without per_sc the id counts have 64 per (SparseCore, replica).
  const bool counts_fit =
      per_sc || sc::SaturatingMul(num_physical, int64_t{num_sc} * sc::kMaxDivisions) < kInt32Max;
  if (max_ids > kInt32Max || sizes.row_pointers > kInt32Max || !counts_fit) {
    return Invalid(op, absl::StrCat("the buffers (", sizes.row_pointers, " row pointers, ", max_ids,
                                    " ids) exceed int32"));
  }
  if (max_ids % sc::kXlaPadSize != 0) {
    return Invalid(op, absl::StrCat("The max_ids_per_chip is set to be ", max_ids,
                                    " which is not divisible by the xla_pad_size ", sc::kXlaPadSize,
                                    " ."));
  }
  return absl::OkStatus();
}

absl::Status ConvertToCsrWrappedCoo(const std::string& op, const CsrAttrs& a, bool allow_dropping,
                                    const std::vector<Tensor>& rows,
                                    const std::vector<Tensor>& cols,
                                    const std::vector<Tensor>& gains,
                                    const std::vector<Tensor>& id_counts, const Tensor& splits,
                                    PreprocessContext& ctx) {
  const int num_sc = a.num_sc;
  for (const auto* list : {&rows, &cols, &gains, &id_counts}) {
    if (static_cast<int64_t>(list->size()) != num_sc) {
      return Invalid(op, absl::StrCat("every input list must have num_sc_per_chip = ", num_sc,
                                      " tensors, got ", list->size()));
    }
  }
  std::vector<int> bounds;
  TF_RETURN_IF_ERROR(SplitBounds(op, splits, &bounds));
  const int64_t num_minibatches = static_cast<int64_t>(bounds.size()) - 1;
  if (num_minibatches > a.max_minibatches) {
    return Invalid(op, absl::StrCat("the splits make ", num_minibatches,
                                    " minibatches per sparse core, more than "
                                    "max_minibatches_per_sc = ",
                                    a.max_minibatches));
  }
  // Validate every SparseCore's inputs before writing anything.
  const int64_t p = a.num_physical;
  const int64_t flat_size = p + 1, minibatch_size = p * sc::kMaxDivisions + 1;
  const bool minibatching = id_counts[0].NumElements() == minibatch_size;
  int64_t total_ids = 0;
  for (int s = 0; s < num_sc; ++s) {
    const int64_t n = rows[s].NumElements();
    if (cols[s].NumElements() != n || gains[s].NumElements() != n) {
      return Invalid(op, absl::StrCat("sparse core ", s, ": sorted row ids (", n, "), col ids (",
                                      cols[s].NumElements(), ") and gains (",
                                      gains[s].NumElements(), ") must have the same length"));
    }
    if (id_counts[s].NumElements() != (minibatching ? minibatch_size : flat_size)) {
      return Invalid(op, absl::StrCat("The id counts should have either ", flat_size,
                                      " elements when there is no minibatching or ", minibatch_size,
                                      " elements when there are multiple minibatches for "
                                      "each sparsecore (the same for every sparse core). "
                                      "But id_counts_list[",
                                      s, "] has ", id_counts[s].NumElements(), " elements."));
    }
    const auto counts = id_counts[s].flat<int32_t>();
    TF_RETURN_IF_ERROR(CheckIdCounts(op, absl::StrCat("id_counts_list[", s, "]"), counts, n,
                                     "the sorted tensors'"));
    total_ids += counts(counts.size() - 1);
  }

  CsrSource source;
  for (int s = 0; s < num_sc; ++s) {
    source.rows.push_back(rows[s].flat<int32_t>().data());
    source.cols.push_back(cols[s].flat<int32_t>().data());
    source.gains.push_back(gains[s].flat<float>().data());
    source.counts.push_back(id_counts[s].flat<int32_t>().data());
  }
  source.position = [&](int s, int64_t bound, int64_t rep) -> int64_t {
    (void)s;
    return minibatching ? rep * sc::kMaxDivisions + bound : rep + (bound > 0 ? 1 : 0);
  };
  return WriteCsr(ctx, op, a.table, source, bounds, num_sc, p, a.sizes.row_pointers, a.max_ids,
                  allow_dropping, total_ids, minibatching);
}

absl::Status MinibatchSplitsAttrs::Init(const std::string& op, int sample_count_attr,
                                        int num_replica, int table_vocab_size,
                                        int num_sc_per_chip) {
  sample_count = sample_count_attr;
  vocab = table_vocab_size;
  num_sc = num_sc_per_chip;
  TF_RETURN_IF_ERROR(CheckSampleCount(op, sample_count, num_sc));
  num_physical = static_cast<int64_t>(num_replica) * num_sc;
  if (sc::SaturatingMul(num_physical, int64_t{num_sc} * sc::kMaxDivisions) >= kInt32Max) {
    return Invalid(op, absl::StrCat(num_physical, " physical replicas are too many"));
  }
  return absl::OkStatus();
}

absl::Status GetMinibatchSplits(const std::string& op, const MinibatchSplitsAttrs& a,
                                const Tensor& rows_t, const Tensor& cols_t, const Tensor& gains_t,
                                PreprocessContext& ctx) {
  TF_RETURN_IF_ERROR(RankOne(op, "row_ids", rows_t));
  TF_RETURN_IF_ERROR(RankOne(op, "col_ids", cols_t));
  TF_RETURN_IF_ERROR(RankOne(op, "gains", gains_t));
  const int64_t n = rows_t.NumElements();
  if (cols_t.NumElements() != n || gains_t.NumElements() != n) {
    return Invalid(op, absl::StrCat("row_ids (", n, "), col_ids (", cols_t.NumElements(),
                                    ") and gains (", gains_t.NumElements(),
                                    ") must have the same length"));
  }
  const int sample_count = a.sample_count, num_sc = a.num_sc, vocab = a.vocab;
  const auto rows = rows_t.vec<int32_t>();
  const auto cols = cols_t.vec<int32_t>();
  const auto gains = gains_t.vec<float>();
  for (int64_t i = 0; i < n; ++i) {
    if (rows(i) < 0 || rows(i) >= sample_count) {
      return Invalid(op, absl::StrCat("row_ids[", i, "] = ", rows(i), " is outside [0, ",
                                      sample_count, ")"));
    }
    if (i > 0 && rows(i) < rows(i - 1)) {
      return Invalid(op, absl::StrCat("row_ids[", i, "] = ", rows(i),
                                      " is smaller than the row before it: row ids need "
                                      "to be sorted in ascending order"));
    }
    if (cols(i) < 0 || cols(i) >= vocab) {
      return Invalid(op, absl::StrCat("col_ids[", i, "] = ", cols(i), " is outside [0, ", vocab,
                                      ") (table_vocab_size)"));
    }
  }
  const int64_t p = a.num_physical, per_sc = sample_count / num_sc;
  const int64_t division =
      (static_cast<int64_t>(vocab) + sc::kMaxDivisions - 1) / sc::kMaxDivisions;
  const int64_t num_counts = sc::kMaxDivisions * num_sc * p;
  // Per SparseCore, its kept (deduplicated) ids in (col, position) order,
  // and the count of every (replica, division).
  std::vector<std::vector<Kept>> kept(num_sc);
  std::vector<int64_t> count(num_counts, 0);
  // The SparseCores' ranges of rows (ascending), then each sorted on the
  // context's threads: each writes only its own kept list and counts.
  std::vector<int64_t> first(num_sc + 1, n);
  first[0] = 0;
  for (int s = 0, i = 0; s < num_sc; ++s) {
    while (i < n && rows(i) < (s + 1) * per_sc) ++i;
    first[s + 1] = i;
  }
  std::vector<int64_t> max_ids_of(num_sc, 0), max_uniques_of(num_sc, 0);
  const auto sort_sc = [&](int64_t s) {
    std::vector<int64_t> ids(p, 0), uniques(p, 0);
    SortAndMerge(rows.data(), cols.data(), gains.data(), first[s], first[s + 1], &kept[s],
                 [&](int32_t col, bool new_col) {
                   const int64_t rep = col % p;
                   const int64_t bucket = std::min<int64_t>(col / division, sc::kMaxDivisions - 1);
                   ++count[(s * p + rep) * sc::kMaxDivisions + bucket];
                   ++ids[rep];
                   if (new_col) ++uniques[rep];
                 });
    max_ids_of[s] = *std::max_element(ids.begin(), ids.end());
    max_uniques_of[s] = *std::max_element(uniques.begin(), uniques.end());
  };
  ctx.parallel_for(num_sc, 16 * (n / num_sc + 1), [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) sort_sc(s);
  });
  const int64_t max_ids = *std::max_element(max_ids_of.begin(), max_ids_of.end());
  const int64_t max_uniques = *std::max_element(max_uniques_of.begin(), max_uniques_of.end());
  Tensor* id_counts_t;
  TF_RETURN_IF_ERROR(ctx.allocate(4, TensorShape({num_counts + 1}), &id_counts_t));
  auto id_counts = id_counts_t->vec<int32_t>();
  id_counts(0) = 0;
  for (int64_t k = 0; k < num_counts; ++k) {
    id_counts(k + 1) = id_counts(k) + static_cast<int32_t>(count[k]);
  }
  const int64_t total = id_counts(num_counts);
  Tensor *out_rows, *out_cols, *out_gains;
  TF_RETURN_IF_ERROR(ctx.allocate(0, TensorShape({total}), &out_rows));
  TF_RETURN_IF_ERROR(ctx.allocate(1, TensorShape({total}), &out_cols));
  TF_RETURN_IF_ERROR(ctx.allocate(2, TensorShape({total}), &out_gains));
  std::vector<int64_t> next(id_counts.data(), id_counts.data() + num_counts);
  int32_t* row_out = out_rows->flat<int32_t>().data();
  int32_t* col_out = out_cols->flat<int32_t>().data();
  float* gain_out = out_gains->flat<float>().data();
  // SparseCore s writes only its own (s, replica, division) ranges.
  ctx.parallel_for(num_sc, 8 * (n / num_sc + 1), [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) {
      for (const Kept& k : kept[s]) {
        const int64_t bucket = std::min<int64_t>(k.col / division, sc::kMaxDivisions - 1);
        const int64_t at = next[(s * p + k.col % p) * sc::kMaxDivisions + bucket]++;
        row_out[at] = static_cast<int32_t>(k.row % per_sc);
        col_out[at] = static_cast<int32_t>(k.col / p);
        gain_out[at] = k.gain;
      }
    }
  });
  Tensor *splits, *max_ids_t, *max_uniques_t;
  TF_RETURN_IF_ERROR(ctx.allocate(3, TensorShape({}), &splits));
  TF_RETURN_IF_ERROR(ctx.allocate(5, TensorShape({}), &max_ids_t));
  TF_RETURN_IF_ERROR(ctx.allocate(6, TensorShape({}), &max_uniques_t));
  splits->scalar<int64_t>()() = 0;
  max_ids_t->scalar<int32_t>()() = static_cast<int32_t>(max_ids);
  max_uniques_t->scalar<int32_t>()() = static_cast<int32_t>(max_uniques);
  return absl::OkStatus();
}

absl::Status GetMinibatchesInCsr(const std::string& op, const CsrAttrs& a, const Tensor& rows,
                                 const Tensor& cols, const Tensor& gains, const Tensor& splits_t,
                                 const Tensor& counts_t, PreprocessContext& ctx) {
  TF_RETURN_IF_ERROR(RankOne(op, "id_counts", counts_t));
  const int64_t n = rows.NumElements(), p = a.num_physical;
  const int num_sc = a.num_sc;
  if (cols.NumElements() != n || gains.NumElements() != n) {
    return Invalid(op,
                   absl::StrCat("row_ids (", n, "), col_ids (", cols.NumElements(), ") and gains (",
                                gains.NumElements(), ") must have the same length"));
  }
  const int64_t num_counts = sc::kMaxDivisions * num_sc * p + 1;
  if (counts_t.NumElements() != num_counts) {
    return Invalid(op, absl::StrCat("id_counts has ", counts_t.NumElements(),
                                    " elements; 64 divisions * ", num_sc, " sparse cores * ", p,
                                    " replicas + 1 = ", num_counts, " expected"));
  }
  const auto counts = counts_t.flat<int32_t>();
  TF_RETURN_IF_ERROR(CheckIdCounts(op, "id_counts", counts, n, "the ids'"));
  std::vector<int> bounds;
  TF_RETURN_IF_ERROR(SplitBounds(op, splits_t, &bounds));
  const int64_t num_minibatches = static_cast<int64_t>(bounds.size()) - 1;
  if (num_minibatches > a.max_minibatches) {
    return Invalid(op,
                   absl::StrCat("The number of minibatches per sparse core is ", num_minibatches,
                                ". But the max minibatches per sparse core is set to "
                                "be ",
                                a.max_minibatches, " which is smaller."));
  }
  CsrSource source;
  for (int s = 0; s < num_sc; ++s) {
    source.rows.push_back(rows.flat<int32_t>().data());
    source.cols.push_back(cols.flat<int32_t>().data());
    source.gains.push_back(gains.flat<float>().data());
    source.counts.push_back(counts.data());
  }
  source.position = [p](int s, int64_t bound, int64_t rep) -> int64_t {
    return (s * p + rep) * sc::kMaxDivisions + bound;
  };
  return WriteCsr(ctx, op, a.table, source, bounds, num_sc, p, a.sizes.row_pointers, a.max_ids,
                  /*allow_dropping=*/false, counts(num_counts - 1), /*minibatching=*/true);
}

}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
