// CPU kernels of the SparseCore CSR preprocessing (TPUEmbeddingV2): the
// padded CSR buffers (ConvertToSparseCoreCsrWrappedCooTensor), the
// minibatching path (GetMinibatchSplitsWithPhysicalReplica,
// GetMinibatchesInCsrWithPhysicalReplica, StoreMinibatchStatisticsInFdo),
// GlobalIterId and the dynamic-shape copies of the CSR buffers.  Registered
// as TfTpuEmb>Name and under TF's name (TF's CPU wheel has no kernel for
// them).  What each computes: docs/sparsecore_semantics.md §3-§4, §8; the
// shared arithmetic is core/sparsecore.h.  Every input is checked before
// anything is written: a bad one is InvalidArgument naming the op and the
// offending index, never an out-of-bounds access.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sparsecore.h"
#include "kernels/registration.h"
#include "kernels/sparsecore/preprocess.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {
namespace {

namespace sc = ::tf_tpu_emb::sparsecore;

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
absl::Status WriteCsr(OpKernelContext* ctx, const std::string& op, const std::string& table,
                      const CsrSource& source, const std::vector<int>& bounds, int num_sc,
                      int64_t p, int64_t num_row_pointers, int64_t max_ids, bool allow_dropping,
                      int64_t total_ids, bool minibatching) {
  const int64_t num_minibatches = static_cast<int64_t>(bounds.size()) - 1;
  Tensor *row_pointers_t, *sample_ids_t, *token_ids_t, *gains_t;
  TF_RETURN_IF_ERROR(ctx->allocate_output(0, TensorShape({num_row_pointers}), &row_pointers_t));
  TF_RETURN_IF_ERROR(ctx->allocate_output(1, TensorShape({max_ids}), &sample_ids_t));
  TF_RETURN_IF_ERROR(ctx->allocate_output(2, TensorShape({max_ids}), &token_ids_t));
  TF_RETURN_IF_ERROR(ctx->allocate_output(3, TensorShape({max_ids}), &gains_t));
  int32_t* row_pointers = row_pointers_t->flat<int32_t>().data();
  int32_t* sample_ids = sample_ids_t->flat<int32_t>().data();
  int32_t* token_ids = token_ids_t->flat<int32_t>().data();
  float* out_gains = gains_t->flat<float>().data();
  const float pad_gain = static_cast<float>(sc::kXlaPadValue);

  // The layout first (row pointers, where each segment goes, the id
  // dropping check), one pass in order; then the segments' ids are copied
  // and padded on the intra-op threads (disjoint ranges of the buffers).
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
  ::tsl::thread::ThreadPool* pool = CpuPool(ctx);
  const int64_t cost = 12 * (packed / std::max<size_t>(1, segments.size()) + sc::kXlaPadSize);
  pool->ParallelFor(static_cast<int64_t>(segments.size()), cost, [&](int64_t lo, int64_t hi) {
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
  TF_RETURN_IF_ERROR(ctx->allocate_output(4, TensorShape({}), &row_pointers_unpadded));
  TF_RETURN_IF_ERROR(ctx->allocate_output(5, TensorShape({}), &ids_unpadded));
  TF_RETURN_IF_ERROR(ctx->allocate_output(6, TensorShape({}), &minibatches));
  row_pointers_unpadded->scalar<int32_t>()() =
      static_cast<int32_t>(num_sc * num_minibatches * sc::RoundUp(p, sc::kXlaPadSize));
  ids_unpadded->scalar<int32_t>()() = static_cast<int32_t>(at);
  minibatches->scalar<int32_t>()() = static_cast<int32_t>(num_minibatches);
  return absl::OkStatus();
}

// TF's check of the minibatching ops: the chip's samples split evenly over
// its SparseCores (semantics §4).
absl::Status CheckSampleCount(const std::string& op, int sample_count, int num_sc) {
  if (sample_count % num_sc == 0) return absl::OkStatus();
  return Invalid(op,
                 absl::StrCat("sample_count ", sample_count,
                              " is not divisible by the number of sparsecores per chip ", num_sc));
}

// The attrs both CSR ops share (semantics §3): the table, the minibatch
// limit, the SparseCore and physical replica counts, max_ids_per_chip (per
// sample * sample_count_per_sc * num_sc_per_chip with `per_sc`, else per
// sample * sample_count) and the buffer sizes, which must fit int32 (ours);
// max_ids_per_chip a multiple of the pad size (TF's check).
struct CsrAttrs {
  std::string table;
  int max_minibatches = 1, num_sc = 1;
  int64_t num_physical = 1, max_ids = 0;
  sc::CsrBufferSizes sizes{};

  absl::Status Read(OpKernelConstruction* c, const std::string& op, bool per_sc) {
    int num_replica, sample_count, per_sample;
    TF_RETURN_IF_ERROR(c->GetAttr("table_name", &table));
    TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &num_replica));
    TF_RETURN_IF_ERROR(c->GetAttr(per_sc ? "sample_count_per_sc" : "sample_count", &sample_count));
    TF_RETURN_IF_ERROR(c->GetAttr("max_minibatches_per_sc", &max_minibatches));
    TF_RETURN_IF_ERROR(c->GetAttr("max_ids_per_chip_per_sample", &per_sample));
    TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &num_sc));
    if (!per_sc) TF_RETURN_IF_ERROR(CheckSampleCount(op, sample_count, num_sc));
    num_physical = static_cast<int64_t>(num_replica) * num_sc;
    max_ids = static_cast<int64_t>(per_sample) * sample_count * (per_sc ? num_sc : 1);
    sizes = sc::CsrBufferSizesFor(num_replica, num_sc, max_minibatches, max_ids);
    // Without per_sc the id counts have 64 per (SparseCore, replica).
    const bool counts_fit = per_sc || num_physical * num_sc * sc::kMaxDivisions < kInt32Max;
    if (max_ids > kInt32Max || sizes.row_pointers > kInt32Max || !counts_fit) {
      return Invalid(op, absl::StrCat("the buffers (", sizes.row_pointers, " row pointers, ",
                                      max_ids, " ids) exceed int32"));
    }
    if (max_ids % sc::kXlaPadSize != 0) {
      return Invalid(op, absl::StrCat("The max_ids_per_chip is set to be ", max_ids,
                                      " which is not divisible by the xla_pad_size ",
                                      sc::kXlaPadSize, " ."));
    }
    return absl::OkStatus();
  }
};

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

class ConvertToSparseCoreCsrWrappedCooTensorOp : public OpKernel {
 public:
  explicit ConvertToSparseCoreCsrWrappedCooTensorOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, a_.Read(c, op_, /*per_sc=*/true));
    OP_REQUIRES_OK(c, c->GetAttr("allow_id_dropping", &allow_dropping_));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList rows, cols, gains, id_counts;
    OP_REQUIRES_OK(ctx, ctx->input_list("sorted_row_ids_list", &rows));
    OP_REQUIRES_OK(ctx, ctx->input_list("sorted_col_ids_list", &cols));
    OP_REQUIRES_OK(ctx, ctx->input_list("sorted_gains_list", &gains));
    OP_REQUIRES_OK(ctx, ctx->input_list("id_counts_list", &id_counts));
    const int num_sc = a_.num_sc;
    std::vector<int> bounds;
    OP_REQUIRES_OK(ctx, SplitBounds(op_, ctx->input(4 * num_sc), &bounds));
    const int64_t num_minibatches = static_cast<int64_t>(bounds.size()) - 1;
    TTE_SC_CHECK(ctx, num_minibatches <= a_.max_minibatches,
                 Invalid(op_, absl::StrCat("the splits make ", num_minibatches,
                                           " minibatches per sparse core, more than "
                                           "max_minibatches_per_sc = ",
                                           a_.max_minibatches)));
    // Validate every SparseCore's inputs before writing anything.
    const int64_t p = a_.num_physical;
    const int64_t flat_size = p + 1, minibatch_size = p * sc::kMaxDivisions + 1;
    const bool minibatching = id_counts[0].NumElements() == minibatch_size;
    int64_t total_ids = 0;
    for (int s = 0; s < num_sc; ++s) {
      const int64_t n = rows[s].NumElements();
      TTE_SC_CHECK(ctx, cols[s].NumElements() == n && gains[s].NumElements() == n,
                   Invalid(op_,
                           absl::StrCat("sparse core ", s, ": sorted row ids (", n, "), col ids (",
                                        cols[s].NumElements(), ") and gains (",
                                        gains[s].NumElements(), ") must have the same length")));
      TTE_SC_CHECK(
          ctx, id_counts[s].NumElements() == (minibatching ? minibatch_size : flat_size),
          Invalid(op_, absl::StrCat("The id counts should have either ", flat_size,
                                    " elements when there is no minibatching or ", minibatch_size,
                                    " elements when there are multiple minibatches for "
                                    "each sparsecore (the same for every sparse core). "
                                    "But id_counts_list[",
                                    s, "] has ", id_counts[s].NumElements(), " elements.")));
      const auto counts = id_counts[s].flat<int32_t>();
      OP_REQUIRES_OK(ctx, CheckIdCounts(op_, absl::StrCat("id_counts_list[", s, "]"), counts, n,
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
    OP_REQUIRES_OK(ctx,
                   WriteCsr(ctx, op_, a_.table, source, bounds, num_sc, p, a_.sizes.row_pointers,
                            a_.max_ids, allow_dropping_, total_ids, minibatching));
  }

 private:
  const std::string op_;
  CsrAttrs a_;
  bool allow_dropping_ = false;
};

// ------------------------------------------------------ §4 minibatching on CPU

// GetMinibatchSplitsWithPhysicalReplica: the whole chip's COO tensors (rows
// ascending) sorted per SparseCore into the 64 id-space divisions of each
// physical replica.  On a TPU the per-partition limits come from the FDO
// store by program_key and decide the splits; a CPU has no such limit
// (semantics §4): no split is needed, nothing is dropped, splits is 0.
class GetMinibatchSplitsWithPhysicalReplicaOp : public OpKernel {
 public:
  explicit GetMinibatchSplitsWithPhysicalReplicaOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    int num_replica;
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &sample_count_));
    OP_REQUIRES_OK(c, c->GetAttr("num_replica", &num_replica));
    OP_REQUIRES_OK(c, c->GetAttr("table_vocab_size", &vocab_));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_per_chip", &num_sc_));
    OP_REQUIRES_OK(c, CheckSampleCount(op_, sample_count_, num_sc_));
    num_physical_ = static_cast<int64_t>(num_replica) * num_sc_;
    OP_REQUIRES(c, num_physical_ * num_sc_ * sc::kMaxDivisions < kInt32Max,
                Invalid(op_, absl::StrCat(num_physical_, " physical replicas are too many")));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows_t = ctx->input(1);
    const Tensor& cols_t = ctx->input(2);
    const Tensor& gains_t = ctx->input(3);
    OP_REQUIRES_OK(ctx, RankOne(op_, "row_ids", rows_t));
    OP_REQUIRES_OK(ctx, RankOne(op_, "col_ids", cols_t));
    OP_REQUIRES_OK(ctx, RankOne(op_, "gains", gains_t));
    const int64_t n = rows_t.NumElements();
    OP_REQUIRES(ctx, cols_t.NumElements() == n && gains_t.NumElements() == n,
                Invalid(op_, absl::StrCat("row_ids (", n, "), col_ids (", cols_t.NumElements(),
                                          ") and gains (", gains_t.NumElements(),
                                          ") must have the same length")));
    const auto rows = rows_t.vec<int32_t>();
    const auto cols = cols_t.vec<int32_t>();
    const auto gains = gains_t.vec<float>();
    for (int64_t i = 0; i < n; ++i) {
      TTE_SC_CHECK(ctx, rows(i) >= 0 && rows(i) < sample_count_,
                   Invalid(op_, absl::StrCat("row_ids[", i, "] = ", rows(i), " is outside [0, ",
                                             sample_count_, ")")));
      TTE_SC_CHECK(ctx, i == 0 || rows(i) >= rows(i - 1),
                   Invalid(op_, absl::StrCat("row_ids[", i, "] = ", rows(i),
                                             " is smaller than the row before it: row ids need "
                                             "to be sorted in ascending order")));
      TTE_SC_CHECK(ctx, cols(i) >= 0 && cols(i) < vocab_,
                   Invalid(op_, absl::StrCat("col_ids[", i, "] = ", cols(i), " is outside [0, ",
                                             vocab_, ") (table_vocab_size)")));
    }
    const int64_t p = num_physical_, per_sc = sample_count_ / num_sc_;
    const int64_t division =
        (static_cast<int64_t>(vocab_) + sc::kMaxDivisions - 1) / sc::kMaxDivisions;
    const int64_t num_counts = sc::kMaxDivisions * num_sc_ * p;
    // Per SparseCore, its kept (deduplicated) ids in (col, position) order,
    // and the count of every (replica, division).
    std::vector<std::vector<Kept>> kept(num_sc_);
    std::vector<int64_t> count(num_counts, 0);
    // The SparseCores' ranges of rows (ascending), then each sorted on the
    // intra-op threads: each writes only its own kept list and counts.
    std::vector<int64_t> first(num_sc_ + 1, n);
    first[0] = 0;
    for (int s = 0, i = 0; s < num_sc_; ++s) {
      while (i < n && rows(i) < (s + 1) * per_sc) ++i;
      first[s + 1] = i;
    }
    std::vector<int64_t> max_ids_of(num_sc_, 0), max_uniques_of(num_sc_, 0);
    const auto sort_sc = [&](int64_t s) {
      std::vector<int64_t> ids(p, 0), uniques(p, 0);
      SortAndMerge(rows.data(), cols.data(), gains.data(), first[s], first[s + 1], &kept[s],
                   [&](int32_t col, bool new_col) {
                     const int64_t rep = col % p;
                     const int64_t bucket =
                         std::min<int64_t>(col / division, sc::kMaxDivisions - 1);
                     ++count[(s * p + rep) * sc::kMaxDivisions + bucket];
                     ++ids[rep];
                     if (new_col) ++uniques[rep];
                   });
      max_ids_of[s] = *std::max_element(ids.begin(), ids.end());
      max_uniques_of[s] = *std::max_element(uniques.begin(), uniques.end());
    };
    CpuPool(ctx)->ParallelFor(num_sc_, 16 * (n / num_sc_ + 1), [&](int64_t lo, int64_t hi) {
      for (int64_t s = lo; s < hi; ++s) sort_sc(s);
    });
    const int64_t max_ids = *std::max_element(max_ids_of.begin(), max_ids_of.end());
    const int64_t max_uniques = *std::max_element(max_uniques_of.begin(), max_uniques_of.end());
    Tensor* id_counts_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({num_counts + 1}), &id_counts_t));
    auto id_counts = id_counts_t->vec<int32_t>();
    id_counts(0) = 0;
    for (int64_t k = 0; k < num_counts; ++k) {
      id_counts(k + 1) = id_counts(k) + static_cast<int32_t>(count[k]);
    }
    const int64_t total = id_counts(num_counts);
    Tensor *out_rows, *out_cols, *out_gains;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &out_rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({total}), &out_cols));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({total}), &out_gains));
    std::vector<int64_t> next(id_counts.data(), id_counts.data() + num_counts);
    int32_t* row_out = out_rows->flat<int32_t>().data();
    int32_t* col_out = out_cols->flat<int32_t>().data();
    float* gain_out = out_gains->flat<float>().data();
    // SparseCore s writes only its own (s, replica, division) ranges.
    CpuPool(ctx)->ParallelFor(num_sc_, 8 * (n / num_sc_ + 1), [&](int64_t lo, int64_t hi) {
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
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({}), &splits));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(5, TensorShape({}), &max_ids_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(6, TensorShape({}), &max_uniques_t));
    splits->scalar<int64_t>()() = 0;
    max_ids_t->scalar<int32_t>()() = static_cast<int32_t>(max_ids);
    max_uniques_t->scalar<int32_t>()() = static_cast<int32_t>(max_uniques);
  }

 private:
  const std::string op_;
  int sample_count_ = 1, vocab_ = 1, num_sc_ = 1;
  int64_t num_physical_ = 1;
};

// GetMinibatchesInCsrWithPhysicalReplica: the CSR buffers (semantics §3)
// of GetMinibatchSplitsWithPhysicalReplica's output, its minibatches cut at
// `splits` (0 on CPU, or any caller's).  Ids that do not fit are an error,
// never dropped (TF drops them only under its flag
// tf_xla_sparse_core_allow_id_dropping_for_minibatching).
class GetMinibatchesInCsrWithPhysicalReplicaOp : public OpKernel {
 public:
  explicit GetMinibatchesInCsrWithPhysicalReplicaOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, a_.Read(c, op_, /*per_sc=*/false));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(1);
    const Tensor& cols = ctx->input(2);
    const Tensor& gains = ctx->input(3);
    const Tensor& splits_t = ctx->input(4);
    const Tensor& counts_t = ctx->input(5);
    OP_REQUIRES_OK(ctx, RankOne(op_, "id_counts", counts_t));
    const int64_t n = rows.NumElements(), p = a_.num_physical;
    const int num_sc = a_.num_sc;
    OP_REQUIRES(ctx, cols.NumElements() == n && gains.NumElements() == n,
                Invalid(op_, absl::StrCat("row_ids (", n, "), col_ids (", cols.NumElements(),
                                          ") and gains (", gains.NumElements(),
                                          ") must have the same length")));
    const int64_t num_counts = sc::kMaxDivisions * num_sc * p + 1;
    OP_REQUIRES(ctx, counts_t.NumElements() == num_counts,
                Invalid(op_, absl::StrCat("id_counts has ", counts_t.NumElements(),
                                          " elements; 64 divisions * ", num_sc, " sparse cores * ",
                                          p, " replicas + 1 = ", num_counts, " expected")));
    const auto counts = counts_t.flat<int32_t>();
    OP_REQUIRES_OK(ctx, CheckIdCounts(op_, "id_counts", counts, n, "the ids'"));
    std::vector<int> bounds;
    OP_REQUIRES_OK(ctx, SplitBounds(op_, splits_t, &bounds));
    const int64_t num_minibatches = static_cast<int64_t>(bounds.size()) - 1;
    TTE_SC_CHECK(ctx, num_minibatches <= a_.max_minibatches,
                 Invalid(op_, absl::StrCat("The number of minibatches per sparse core is ",
                                           num_minibatches,
                                           ". But the max minibatches per sparse core is set to "
                                           "be ",
                                           a_.max_minibatches, " which is smaller.")));
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
    OP_REQUIRES_OK(ctx, WriteCsr(ctx, op_, a_.table, source, bounds, num_sc, p,
                                 a_.sizes.row_pointers, a_.max_ids, /*allow_dropping=*/false,
                                 counts(num_counts - 1), /*minibatching=*/true));
  }

 private:
  const std::string op_;
  CsrAttrs a_;
};

// StoreMinibatchStatisticsInFdo: on a TPU, records max_ids/max_uniques in
// the FDO store of the program; a CPU has none (semantics §4): it checks
// its inputs are scalars and records nothing.
class StoreMinibatchStatisticsInFdoOp : public OpKernel {
 public:
  explicit StoreMinibatchStatisticsInFdoOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    int sample_count, num_sc;
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &sample_count));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_per_chip", &num_sc));
    OP_REQUIRES_OK(c, CheckSampleCount(op_, sample_count, num_sc));
  }

  void Compute(OpKernelContext* ctx) override {
    for (int i : {1, 2}) {
      TTE_SC_CHECK(ctx, ctx->input(i).NumElements() == 1,
                   Invalid(op_, absl::StrCat(i == 1 ? "max_ids" : "max_uniques",
                                             " must be a scalar, got shape ",
                                             ctx->input(i).shape().DebugString())));
    }
  }

 private:
  const std::string op_;
};

// ------------------------------------------------------------------ §8 other

class GlobalIterIdOp : public OpKernel {
 public:
  explicit GlobalIterIdOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = ctx->frame_iter().iter_id;
  }
};

// TPUCopyWithDynamicShape / TPUAnnotateTensorsWithDynamicShape: on a TPU
// the device copy of the CSR buffers with their unpadded sizes as dynamic
// first dimensions; on CPU the tensors themselves (their static, padded
// shapes stay what the shape function said; the CSR kernels read only up to
// the row pointers).  Each unpadded size must be a scalar within its
// tensor's first dimension (semantics §8).
class DynamicShapeCopyOp : public OpKernel {
 public:
  explicit DynamicShapeCopyOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    if (c->HasAttr("N")) OP_REQUIRES_OK(c, c->GetAttr("N", &num_sizes_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int num_tensors = ctx->num_inputs() - num_sizes_;
    for (int i = 0; i < num_sizes_; ++i) {
      const Tensor& size = ctx->input(num_tensors + i);
      TTE_SC_CHECK(ctx, size.dims() == 0,
                   Invalid(op_, absl::StrCat("unpadded_sizes[", i, "] must be a scalar, got shape ",
                                             size.shape().DebugString())));
      if (i >= num_tensors) continue;
      const Tensor& t = ctx->input(i);
      const int64_t bound = t.dims() == 0 ? 1 : t.dim_size(0);
      const int32_t n = size.scalar<int32_t>()();
      TTE_SC_CHECK(ctx, n >= 0 && n <= bound,
                   Invalid(op_,
                           absl::StrCat("unpadded_sizes[", i, "] = ", n, " is outside [0, ", bound,
                                        "] (the first dimension of tensors[", i, "])")));
    }
    for (int i = 0; i < num_tensors; ++i) ctx->set_output(i, ctx->input(i));
  }

 private:
  const std::string op_;
  int num_sizes_ = 0;
};

bool RegisterKernels() {
  RegisterBoth<ConvertToSparseCoreCsrWrappedCooTensorOp>("ConvertToSparseCoreCsrWrappedCooTensor");
  RegisterBoth<GetMinibatchSplitsWithPhysicalReplicaOp>("GetMinibatchSplitsWithPhysicalReplica");
  RegisterBoth<GetMinibatchesInCsrWithPhysicalReplicaOp>("GetMinibatchesInCsrWithPhysicalReplica");
  RegisterBoth<StoreMinibatchStatisticsInFdoOp>("StoreMinibatchStatisticsInFdo");
  RegisterBoth<GlobalIterIdOp>("GlobalIterId");
  RegisterBoth<DynamicShapeCopyOp>("TPUCopyWithDynamicShape");
  RegisterBoth<DynamicShapeCopyOp>("TPUAnnotateTensorsWithDynamicShape");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
