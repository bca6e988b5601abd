// CPU kernels of the SparseCore input preprocessing (TPUEmbeddingV2): the
// COO conversion of a feature's batch, the per-SparseCore sort and its
// statistics, the padded CSR buffers, GlobalIterId and the dynamic-shape
// copies of the CSR buffers.  Registered as
// TfTpuEmb>Name and under TF's name (TF's CPU wheel has no kernel for them).
// What each computes: docs/sparsecore_semantics.md §1-§4, §8; the shared
// arithmetic is core/sparsecore.h.  Every input is checked before anything is
// written: a bad one is InvalidArgument naming the op and the offending
// index, never an out-of-bounds access.
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
#include "kernels/registration.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace {

namespace sc = ::tf_tpu_emb::sparsecore;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

absl::Status Invalid(const std::string& op, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

#define TTE_SC_CHECK(ctx, cond, status)      \
  do {                                       \
    if (!(cond)) {                           \
      (ctx)->CtxFailure(__FILE__, __LINE__, (status)); \
      return;                                \
    }                                        \
  } while (0)

#define TTE_SC_OK(ctx, expr)                                  \
  do {                                                        \
    const absl::Status _st = (expr);                          \
    if (!_st.ok()) {                                          \
      (ctx)->CtxFailure(__FILE__, __LINE__, _st);             \
      return;                                                 \
    }                                                         \
  } while (0)

absl::Status RankOne(const std::string& op, const char* name, const Tensor& t) {
  if (t.dims() != 1) {
    return Invalid(op, absl::StrCat(name, " must be a vector, got shape ", t.shape().DebugString()));
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------ §1 COO conversion

// The kept tokens of one feature after adjacent deduplication, with each
// sample's combiner scale (semantics §1).
struct Coo {
  std::vector<int32_t> rows, cols;
  std::vector<float> gains;
  std::vector<float> scale;  // per sample; empty for "sum"
};

absl::Status RowsOfTokens(const std::string& op, const Tensor& split, int64_t n,
                          int64_t sample_count, std::vector<int32_t>* rows) {
  rows->resize(n);
  if (split.dims() == 1 && split.NumElements() == 0) {  // dense
    if (n != 0 && n != sample_count) {
      return Invalid(op, absl::StrCat("a dense input has ", n, " values for ", sample_count,
                                      " samples (sample_count); they must be equal"));
    }
    std::iota(rows->begin(), rows->end(), 0);
    return absl::OkStatus();
  }
  if (split.dims() == 2) {  // SparseTensor indices
    if (split.dim_size(0) != n) {
      return Invalid(op, absl::StrCat("indices_or_row_splits has ", split.dim_size(0),
                                      " rows of indices for ", n, " values"));
    }
    if (n > 0 && split.dim_size(1) != 2) {
      return Invalid(op, absl::StrCat(
                             "indices of a SparseTensor must have 2 columns (a rank-2 "
                             "SparseTensor: higher ranks need shape strides), got ",
                             split.dim_size(1)));
    }
    const auto idx = split.matrix<int32_t>();
    int32_t prev = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t r = idx(i, 0);
      if (r < 0 || r >= sample_count) {
        return Invalid(op, absl::StrCat("indices_or_row_splits[", i, ", 0] = ", r,
                                        " is outside [0, sample_count = ", sample_count, ")"));
      }
      if (r < prev) {
        return Invalid(op, absl::StrCat("indices_or_row_splits[", i, ", 0] = ", r,
                                        " is smaller than the row before it (", prev,
                                        "): SparseTensor indices must be sorted"));
      }
      (*rows)[i] = prev = r;
    }
    return absl::OkStatus();
  }
  if (split.dims() == 1) {  // ragged row splits
    if (split.NumElements() != sample_count + 1) {
      return Invalid(op, absl::StrCat("ragged row_splits have ", split.NumElements(),
                                      " elements; sample_count + 1 = ", sample_count + 1,
                                      " expected"));
    }
    const auto s = split.vec<int32_t>();
    if (s(0) != 0) {
      return Invalid(op, absl::StrCat("row_splits[0] = ", s(0), ", must be 0"));
    }
    for (int64_t r = 1; r <= sample_count; ++r) {
      if (s(r) < s(r - 1)) {
        return Invalid(op, absl::StrCat("row_splits[", r, "] = ", s(r), " is smaller than row_splits[",
                                        r - 1, "] = ", s(r - 1)));
      }
    }
    if (s(sample_count) != n) {
      return Invalid(op, absl::StrCat("row_splits[", sample_count, "] = ", s(sample_count),
                                      " differs from the number of values ", n));
    }
    for (int64_t r = 0; r < sample_count; ++r) {
      for (int32_t i = s(r); i < s(r + 1); ++i) (*rows)[i] = static_cast<int32_t>(r);
    }
    return absl::OkStatus();
  }
  return Invalid(op, absl::StrCat("indices_or_row_splits must be empty (dense), a matrix "
                                  "(SparseTensor indices) or a vector (row splits), got shape ",
                                  split.shape().DebugString()));
}

absl::Status BuildCoo(const std::string& op, const Tensor& split, const Tensor& values,
                      const Tensor& weights, int64_t sample_count, sc::Combiner combiner,
                      Coo* out) {
  TF_RETURN_IF_ERROR(RankOne(op, "values", values));
  const int64_t n = values.NumElements();
  if (n > kInt32Max) return Invalid(op, absl::StrCat(n, " values exceed int32"));
  if (weights.dims() > 1 || (weights.dims() == 1 && weights.NumElements() != n)) {
    return Invalid(op, absl::StrCat("weights must be a scalar or have one element per value (",
                                    n, "), got shape ", weights.shape().DebugString()));
  }
  std::vector<int32_t> rows;
  TF_RETURN_IF_ERROR(RowsOfTokens(op, split, n, sample_count, &rows));
  const auto ids = values.vec<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (ids(i) < 0) return Invalid(op, absl::StrCat("values[", i, "] = ", ids(i), " is negative"));
  }
  const float* w = weights.flat<float>().data();
  const bool broadcast = weights.NumElements() == 1;
  if (!broadcast && weights.NumElements() != n) {
    return Invalid(op, absl::StrCat("weights has ", weights.NumElements(), " elements for ", n,
                                    " values"));
  }
  const bool rescale = combiner != sc::Combiner::kSum;
  out->scale.assign(rescale ? sample_count : 0, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float g = broadcast ? w[0] : w[i];
    if (rescale) out->scale[rows[i]] += sc::CombinerContribution(combiner, g);
    if (!out->rows.empty() && out->rows.back() == rows[i] && out->cols.back() == ids(i)) {
      out->gains.back() = out->gains.back() + g;
    } else {
      out->rows.push_back(rows[i]);
      out->cols.push_back(ids(i));
      out->gains.push_back(g);
    }
  }
  for (float& s : out->scale) s = sc::CombinerTransform(combiner, s);
  return absl::OkStatus();
}

float ScaledGain(const Coo& coo, size_t k) {
  return coo.scale.empty() ? coo.gains[k] : coo.gains[k] * coo.scale[coo.rows[k]];
}

absl::Status ReadCombiner(OpKernelConstruction* c, const std::string& op, sc::Combiner* out) {
  std::string name;
  TF_RETURN_IF_ERROR(c->GetAttr("combiner", &name));
  if (!sc::ParseCombiner(name, out)) {
    return Invalid(op, absl::StrCat("invalid combiner \"", name,
                                    "\": only \"sum\", \"mean\", and \"sqrtn\" are supported"));
  }
  return absl::OkStatus();
}

class ConvertToCooTensorOp : public OpKernel {
 public:
  explicit ConvertToCooTensorOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &sample_count_));
    OP_REQUIRES_OK(c, ReadCombiner(c, op_, &combiner_));
  }

  void Compute(OpKernelContext* ctx) override {
    Coo coo;
    TTE_SC_OK(ctx, BuildCoo(op_, ctx->input(0), ctx->input(1), ctx->input(2), sample_count_,
                            combiner_, &coo));
    const int64_t m = coo.rows.size();
    Tensor *rows, *cols, *gains;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({m}), &rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({m}), &cols));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({m}), &gains));
    for (int64_t k = 0; k < m; ++k) {
      rows->vec<int32_t>()(k) = coo.rows[k];
      cols->vec<int32_t>()(k) = coo.cols[k];
      gains->vec<float>()(k) = ScaledGain(coo, k);
    }
  }

 private:
  const std::string op_;
  int sample_count_ = 1;
  sc::Combiner combiner_ = sc::Combiner::kSum;
};

class ConvertToListOfSparseCoreCooTensorsOp : public OpKernel {
 public:
  explicit ConvertToListOfSparseCoreCooTensorsOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &sample_count_));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_per_chip", &num_sc_));
    OP_REQUIRES_OK(c, c->GetAttr("row_offset", &row_offset_));
    OP_REQUIRES_OK(c, c->GetAttr("col_offset", &col_offset_));
    OP_REQUIRES_OK(c, c->GetAttr("col_shift", &col_shift_));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_shards", &num_sc_shards_));
    OP_REQUIRES_OK(c, c->GetAttr("stacked_table_sample_count", &stacked_sample_count_));
    OP_REQUIRES_OK(c, ReadCombiner(c, op_, &combiner_));
    OP_REQUIRES(c, (num_sc_shards_ & (num_sc_shards_ - 1)) == 0,
                Invalid(op_, absl::StrCat("num_sc_shards ", num_sc_shards_,
                                          " is not a power of two.")));
    OP_REQUIRES(c, sample_count_ % num_sc_ == 0,
                Invalid(op_, absl::StrCat("sample_count ", sample_count_,
                                          " is not divisible by num_sc_per_chip ", num_sc_)));
  }

  void Compute(OpKernelContext* ctx) override {
    Coo coo;
    TTE_SC_OK(ctx, BuildCoo(op_, ctx->input(0), ctx->input(1), ctx->input(2), sample_count_,
                            combiner_, &coo));
    const int64_t per_sc = sample_count_ / num_sc_;
    const int64_t row_base = row_offset_ / num_sc_;
    const int64_t stacked_per_sc = stacked_sample_count_ / num_sc_;
    const int64_t mask = num_sc_shards_ - 1;
    // The kept tokens' output rows and cols, checked to fit int32 first.
    const int64_t m = coo.rows.size();
    std::vector<int32_t> out_rows(m), out_cols(m);
    std::vector<int64_t> per_sc_count(num_sc_, 0);
    for (int64_t k = 0; k < m; ++k) {
      const int64_t r = coo.rows[k], c = coo.cols[k];
      const int64_t sc_id = r / per_sc;
      const int64_t row = r % per_sc + row_base + stacked_per_sc * sc_id;
      const int64_t col = ((c + col_shift_) & mask) + (c & ~mask) + col_offset_;
      TTE_SC_CHECK(ctx, row <= kInt32Max && col <= kInt32Max,
                   Invalid(op_, absl::StrCat("value ", c, " of sample ", r, " maps to row ", row,
                                             ", col ", col, ", beyond int32")));
      out_rows[k] = static_cast<int32_t>(row);
      out_cols[k] = static_cast<int32_t>(col);
      ++per_sc_count[sc_id];
    }
    OpOutputList rows, cols, gains;
    OP_REQUIRES_OK(ctx, ctx->output_list("row_ids_list", &rows));
    OP_REQUIRES_OK(ctx, ctx->output_list("col_ids_list", &cols));
    OP_REQUIRES_OK(ctx, ctx->output_list("gains_list", &gains));
    int64_t k = 0;  // rows are non-decreasing: SparseCore s's tokens are contiguous
    for (int s = 0; s < num_sc_; ++s) {
      Tensor *r, *c, *g;
      const TensorShape shape({per_sc_count[s]});
      OP_REQUIRES_OK(ctx, rows.allocate(s, shape, &r));
      OP_REQUIRES_OK(ctx, cols.allocate(s, shape, &c));
      OP_REQUIRES_OK(ctx, gains.allocate(s, shape, &g));
      for (int64_t j = 0; j < per_sc_count[s]; ++j, ++k) {
        r->vec<int32_t>()(j) = out_rows[k];
        c->vec<int32_t>()(j) = out_cols[k];
        g->vec<float>()(j) = ScaledGain(coo, k);
      }
    }
  }

 private:
  const std::string op_;
  int sample_count_ = 1, num_sc_ = 1, row_offset_ = 0, col_offset_ = 0, col_shift_ = 0;
  int num_sc_shards_ = 1, stacked_sample_count_ = 1;
  sc::Combiner combiner_ = sc::Combiner::kSum;
};

// ------------------------------------------------------- §2 sort and statistics

struct Kept {
  int32_t row, col;
  float gain;
};

// The per-SparseCore sort of semantics §2: per group of features sharing a
// col_offset (ascending), the kept tokens in (col, position) order, and each
// physical replica's id and unique id counts.
class SortedList {
 public:
  absl::Status Init(OpKernelConstruction* c, const std::string& op) {
    op_ = op;
    int n, num_replica, num_sc;
    TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
    TF_RETURN_IF_ERROR(c->GetAttr("sample_count_list", &sample_counts_));
    TF_RETURN_IF_ERROR(c->GetAttr("col_offset_list", &col_offsets_));
    TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &num_replica));
    TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &num_sc));
    if (static_cast<int>(sample_counts_.size()) != n ||
        static_cast<int>(col_offsets_.size()) != n) {
      return Invalid(op, absl::StrCat("sample_count_list (", sample_counts_.size(),
                                      ") and col_offset_list (", col_offsets_.size(),
                                      ") must have one entry per feature (N = ", n, ")"));
    }
    int64_t batch = 0;
    for (int s : sample_counts_) batch += s;
    if (batch <= 0 || batch > kInt32Max) {
      return Invalid(op, absl::StrCat("the sum of sample_count_list (", batch,
                                      ") must be positive"));
    }
    batch_ = static_cast<int32_t>(batch);
    const int64_t p = static_cast<int64_t>(num_replica) * num_sc;
    if (p > (int64_t{1} << 30) || (p & (p - 1)) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(op, ": Expected num_physical_replica to be a power of two, got ", p));
    }
    num_physical_ = static_cast<int32_t>(p);
    while ((1 << bits_) < num_physical_) ++bits_;
    for (int i = 0; i < n; ++i) groups_[col_offsets_[i]].push_back(i);
    return absl::OkStatus();
  }

  absl::Status Run(OpKernelContext* ctx) {
    OpInputList rows, cols, gains;
    TF_RETURN_IF_ERROR(ctx->input_list("row_ids_list", &rows));
    TF_RETURN_IF_ERROR(ctx->input_list("col_ids_list", &cols));
    TF_RETURN_IF_ERROR(ctx->input_list("gains_list", &gains));
    counts_.assign(num_physical_, 0);
    uniques_.assign(num_physical_, 0);
    kept_.clear();
    const int32_t mask = num_physical_ - 1;
    for (const auto& [offset, features] : groups_) {
      std::vector<int32_t> r, c;
      std::vector<float> g;
      for (int f : features) {
        const int64_t n = cols[f].NumElements();
        if (rows[f].NumElements() != n) {
          return Invalid(op_, absl::StrCat("feature ", f, ": row ids and col ids should have same "
                                           "elements. But got ", rows[f].NumElements(),
                                           " elements for row ids and ", n,
                                           " elements for col ids."));
        }
        if (gains[f].NumElements() != n) {
          return Invalid(op_, absl::StrCat("feature ", f, ": gains and col ids should have same "
                                           "elements. But got ", gains[f].NumElements(),
                                           " elements for gains and ", n,
                                           " elements for col ids."));
        }
        const int32_t* rp = rows[f].flat<int32_t>().data();
        const int32_t* cp = cols[f].flat<int32_t>().data();
        const float* gp = gains[f].flat<float>().data();
        for (int64_t i = 0; i < n; ++i) {
          if (cp[i] < 0) {
            return Invalid(op_, absl::StrCat("col_ids_list[", f, "][", i, "] = ", cp[i],
                                             " is negative"));
          }
          if (rp[i] < 0) {
            return Invalid(op_, absl::StrCat("row_ids_list[", f, "][", i, "] = ", rp[i],
                                             " is negative"));
          }
        }
        r.insert(r.end(), rp, rp + n);
        c.insert(c.end(), cp, cp + n);
        g.insert(g.end(), gp, gp + n);
      }
      std::vector<int64_t> order(c.size());
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return c[a] < c[b]; });
      std::vector<Kept> group;
      int32_t prev_row = -1, prev_col = -1;
      for (const int64_t i : order) {
        if (r[i] != prev_row || c[i] != prev_col) {
          group.push_back({r[i], c[i], g[i]});
          ++counts_[c[i] & mask];
          if (c[i] != prev_col) ++uniques_[c[i] & mask];
        } else {
          group.back().gain += g[i];
        }
        prev_row = r[i];
        prev_col = c[i];
      }
      kept_.push_back(std::move(group));
    }
    return absl::OkStatus();
  }

  const std::string& op() const { return op_; }
  int32_t num_physical() const { return num_physical_; }
  int bits() const { return bits_; }
  int32_t batch() const { return batch_; }
  const std::vector<int64_t>& counts() const { return counts_; }
  const std::vector<int64_t>& uniques() const { return uniques_; }
  const std::vector<std::vector<Kept>>& kept() const { return kept_; }

 private:
  std::string op_;
  std::vector<int32_t> sample_counts_, col_offsets_;
  std::map<int32_t, std::vector<int>> groups_;
  int32_t num_physical_ = 1, batch_ = 1;
  int bits_ = 0;
  std::vector<int64_t> counts_, uniques_;
  std::vector<std::vector<Kept>> kept_;
};

class GetStatsFromListOfSparseCoreCooTensorsOp : public OpKernel {
 public:
  explicit GetStatsFromListOfSparseCoreCooTensorsOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, list_.Init(c, BareOpName(c)));
  }

  void Compute(OpKernelContext* ctx) override {
    SortedList list = list_;
    OP_REQUIRES_OK(ctx, list.Run(ctx));
    Tensor *max_ids, *max_uniques;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &max_ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &max_uniques));
    max_ids->scalar<int32_t>()() =
        static_cast<int32_t>(*std::max_element(list.counts().begin(), list.counts().end()));
    max_uniques->scalar<int32_t>()() =
        static_cast<int32_t>(*std::max_element(list.uniques().begin(), list.uniques().end()));
  }

 private:
  SortedList list_;
};

class SortListOfSparseCoreCooTensorsOp : public OpKernel {
 public:
  explicit SortListOfSparseCoreCooTensorsOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, list_.Init(c, BareOpName(c)));
    OP_REQUIRES_OK(c, c->GetAttr("table_name", &table_));
    OP_REQUIRES_OK(c, c->GetAttr("max_ids_per_sparse_core", &max_ids_));
    OP_REQUIRES_OK(c, c->GetAttr("max_unique_ids_per_sparse_core", &max_uniques_));
  }

  void Compute(OpKernelContext* ctx) override {
    SortedList list = list_;
    OP_REQUIRES_OK(ctx, list.Run(ctx));
    const std::string& op = list.op();
    const int32_t p = list.num_physical();
    Tensor* id_counts;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({p + 1}), &id_counts));
    auto counts = id_counts->vec<int32_t>();
    counts(0) = 0;
    for (int32_t r = 0; r < p; ++r) {
      TTE_SC_CHECK(ctx, list.counts()[r] <= max_ids_,
                   Invalid(op, absl::StrCat("Sparse core ", r, " gets ", list.counts()[r],
                                            " ids while the max ids per sparse core is set to be ",
                                            max_ids_, " for table ", table_)));
      TTE_SC_CHECK(ctx, list.uniques()[r] <= max_uniques_,
                   Invalid(op, absl::StrCat("Sparse core ", r, " gets ", list.uniques()[r],
                                            " unique ids while the max unique ids per sparse core "
                                            "is set to be ",
                                            max_uniques_, " for table ", table_)));
      counts(r + 1) = counts(r) + static_cast<int32_t>(list.counts()[r]);
    }
    const int64_t total = counts(p);
    Tensor *rows, *cols, *gains;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({total}), &rows));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({total}), &cols));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({total}), &gains));
    std::vector<int32_t> next(counts.data(), counts.data() + p);
    for (const auto& group : list.kept()) {
      for (const Kept& k : group) {
        const int32_t at = next[k.col & (p - 1)]++;
        rows->vec<int32_t>()(at) = k.row % list.batch();
        cols->vec<int32_t>()(at) = k.col >> list.bits();
        gains->vec<float>()(at) = k.gain;
      }
    }
  }

 private:
  SortedList list_;
  std::string table_;
  int max_ids_ = 1, max_uniques_ = 1;
};

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

  int64_t at = 0, pointer = 0, packed = 0;
  for (int s = 0; s < num_sc; ++s) {
    const int32_t* r = source.rows[s];
    const int32_t* c = source.cols[s];
    const float* g = source.gains[s];
    const int32_t* counts = source.counts[s];
    for (int64_t b = 1; b <= num_minibatches; ++b) {
      for (int64_t rep = 0; rep < p; ++rep) {
        // Without minibatching every bucket takes the replica's whole
        // segment (TF's loop, semantics §3).
        const int64_t begin_pos = minibatching ? source.position(s, bounds[b - 1], rep)
                                               : source.position(s, 0, rep);
        const int64_t end_pos = minibatching ? source.position(s, bounds[b], rep)
                                             : source.position(s, 1, rep);
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
        std::copy_n(c + begin, count, token_ids + at);
        std::copy_n(r + begin, count, sample_ids + at);
        std::copy_n(g + begin, count, out_gains + at);
        at += count;
        packed += count;
        row_pointers[pointer++] = static_cast<int32_t>(at);
        const int64_t padded = std::min(sc::RoundUp(at, sc::kXlaPadSize), max_ids);
        std::fill(token_ids + at, token_ids + padded, sc::kXlaPadValue);
        std::fill(sample_ids + at, sample_ids + padded, sc::kXlaPadValue);
        std::fill(out_gains + at, out_gains + padded, pad_gain);
        at = padded;
      }
      const int64_t padded = sc::RoundUp(pointer, sc::kXlaPadSize);
      std::fill(row_pointers + pointer, row_pointers + padded, static_cast<int32_t>(at));
      pointer = padded;
    }
  }
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

class ConvertToSparseCoreCsrWrappedCooTensorOp : public OpKernel {
 public:
  explicit ConvertToSparseCoreCsrWrappedCooTensorOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    int num_replica, sample_count_per_sc, per_sample;
    OP_REQUIRES_OK(c, c->GetAttr("table_name", &table_));
    OP_REQUIRES_OK(c, c->GetAttr("num_replica", &num_replica));
    OP_REQUIRES_OK(c, c->GetAttr("sample_count_per_sc", &sample_count_per_sc));
    OP_REQUIRES_OK(c, c->GetAttr("max_minibatches_per_sc", &max_minibatches_));
    OP_REQUIRES_OK(c, c->GetAttr("max_ids_per_chip_per_sample", &per_sample));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_per_chip", &num_sc_));
    OP_REQUIRES_OK(c, c->GetAttr("allow_id_dropping", &allow_dropping_));
    num_physical_ = static_cast<int64_t>(num_replica) * num_sc_;
    max_ids_ = static_cast<int64_t>(per_sample) * sample_count_per_sc * num_sc_;
    sizes_ = sc::CsrBufferSizesFor(num_replica, num_sc_, max_minibatches_, max_ids_);
    OP_REQUIRES(c, max_ids_ <= kInt32Max && sizes_.row_pointers <= kInt32Max,
                Invalid(op_, absl::StrCat("the buffers (", sizes_.row_pointers, " row pointers, ",
                                          max_ids_, " ids) exceed int32")));
    OP_REQUIRES(c, max_ids_ % sc::kXlaPadSize == 0,
                Invalid(op_, absl::StrCat("The max_ids_per_chip is set to be ", max_ids_,
                                          " which is not divisible by the xla_pad_size ",
                                          sc::kXlaPadSize, " .")));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList rows, cols, gains, id_counts;
    OP_REQUIRES_OK(ctx, ctx->input_list("sorted_row_ids_list", &rows));
    OP_REQUIRES_OK(ctx, ctx->input_list("sorted_col_ids_list", &cols));
    OP_REQUIRES_OK(ctx, ctx->input_list("sorted_gains_list", &gains));
    OP_REQUIRES_OK(ctx, ctx->input_list("id_counts_list", &id_counts));
    const Tensor& splits_t = ctx->input(4 * num_sc_);
    uint64_t splits = 0;
    const auto split_values = splits_t.flat<int64_t>();
    for (int64_t i = 0; i < split_values.size(); ++i) {
      TTE_SC_CHECK(ctx, split_values(i) >= 0,
                   Invalid(op_, absl::StrCat("splits[", i, "] = ", split_values(i),
                                             " is negative (bit 63 is no split point)")));
      splits |= static_cast<uint64_t>(split_values(i));
    }
    const std::vector<int> bounds = BucketBounds(splits);
    const int64_t num_minibatches = static_cast<int64_t>(bounds.size()) - 1;
    TTE_SC_CHECK(ctx, num_minibatches <= max_minibatches_,
                 Invalid(op_, absl::StrCat("the splits make ", num_minibatches,
                                           " minibatches per sparse core, more than "
                                           "max_minibatches_per_sc = ",
                                           max_minibatches_)));
    // Validate every SparseCore's inputs before writing anything.
    const int64_t p = num_physical_;
    const int64_t flat_size = p + 1, minibatch_size = p * sc::kMaxDivisions + 1;
    const bool minibatching = id_counts[0].NumElements() == minibatch_size;
    int64_t total_ids = 0;
    for (int s = 0; s < num_sc_; ++s) {
      const int64_t n = rows[s].NumElements();
      TTE_SC_CHECK(ctx, cols[s].NumElements() == n && gains[s].NumElements() == n,
                   Invalid(op_, absl::StrCat("sparse core ", s, ": sorted row ids (", n,
                                             "), col ids (", cols[s].NumElements(),
                                             ") and gains (", gains[s].NumElements(),
                                             ") must have the same length")));
      TTE_SC_CHECK(ctx, id_counts[s].NumElements() == (minibatching ? minibatch_size : flat_size),
                   Invalid(op_, absl::StrCat("The id counts should have either ", flat_size,
                                             " elements when there is no minibatching or ",
                                             minibatch_size,
                                             " elements when there are multiple minibatches for "
                                             "each sparsecore (the same for every sparse core). "
                                             "But id_counts_list[",
                                             s, "] has ", id_counts[s].NumElements(),
                                             " elements.")));
      const auto counts = id_counts[s].flat<int32_t>();
      for (int64_t i = 0; i < counts.size(); ++i) {
        const int32_t prev = i == 0 ? 0 : counts(i - 1);
        TTE_SC_CHECK(ctx, counts(i) >= prev && counts(i) <= n,
                     Invalid(op_, absl::StrCat("id_counts_list[", s, "][", i, "] = ", counts(i),
                                               " must lie in [", prev, ", ", n,
                                               "] (non-decreasing, at most the sorted tensors' "
                                               "length)")));
      }
      total_ids += counts(counts.size() - 1);
    }

    CsrSource source;
    for (int s = 0; s < num_sc_; ++s) {
      source.rows.push_back(rows[s].flat<int32_t>().data());
      source.cols.push_back(cols[s].flat<int32_t>().data());
      source.gains.push_back(gains[s].flat<float>().data());
      source.counts.push_back(id_counts[s].flat<int32_t>().data());
    }
    source.position = [&](int s, int64_t bound, int64_t rep) -> int64_t {
      (void)s;
      return minibatching ? rep * sc::kMaxDivisions + bound : rep + (bound > 0 ? 1 : 0);
    };
    OP_REQUIRES_OK(ctx, WriteCsr(ctx, op_, table_, source, bounds, num_sc_, p,
                                 sizes_.row_pointers, max_ids_, allow_dropping_, total_ids,
                                 minibatching));
  }

 private:
  const std::string op_;
  std::string table_;
  int max_minibatches_ = 1, num_sc_ = 1;
  bool allow_dropping_ = false;
  int64_t num_physical_ = 1, max_ids_ = 0;
  sc::CsrBufferSizes sizes_{};
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
    OP_REQUIRES(c, sample_count_ % num_sc_ == 0,
                Invalid(op_, absl::StrCat("sample_count ", sample_count_,
                                          " is not divisible by the number of sparsecores per "
                                          "chip ",
                                          num_sc_)));
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
    const int64_t division = (static_cast<int64_t>(vocab_) + sc::kMaxDivisions - 1) /
                             sc::kMaxDivisions;
    const int64_t num_counts = sc::kMaxDivisions * num_sc_ * p;
    // Per SparseCore, its kept (deduplicated) ids in (col, position) order,
    // and the count of every (replica, division).
    std::vector<std::vector<Kept>> kept(num_sc_);
    std::vector<int64_t> count(num_counts, 0);
    int64_t max_ids = 0, max_uniques = 0;
    int64_t begin = 0;
    for (int s = 0; s < num_sc_; ++s) {
      int64_t end = begin;
      while (end < n && rows(end) < (s + 1) * per_sc) ++end;
      std::vector<int64_t> order(end - begin);
      std::iota(order.begin(), order.end(), begin);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return cols(a) < cols(b); });
      std::vector<int64_t> ids(p, 0), uniques(p, 0);
      int32_t prev_row = -1, prev_col = -1;
      for (const int64_t i : order) {
        if (rows(i) != prev_row || cols(i) != prev_col) {
          kept[s].push_back({rows(i), cols(i), gains(i)});
          const int64_t rep = cols(i) % p;
          const int64_t bucket = std::min<int64_t>(cols(i) / division, sc::kMaxDivisions - 1);
          ++count[(s * p + rep) * sc::kMaxDivisions + bucket];
          ++ids[rep];
          if (cols(i) != prev_col) ++uniques[rep];
        } else {
          kept[s].back().gain += gains(i);
        }
        prev_row = rows(i);
        prev_col = cols(i);
      }
      max_ids = std::max(max_ids, *std::max_element(ids.begin(), ids.end()));
      max_uniques = std::max(max_uniques, *std::max_element(uniques.begin(), uniques.end()));
      begin = end;
    }
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
    for (int s = 0; s < num_sc_; ++s) {
      for (const Kept& k : kept[s]) {
        const int64_t bucket = std::min<int64_t>(k.col / division, sc::kMaxDivisions - 1);
        const int64_t at = next[(s * p + k.col % p) * sc::kMaxDivisions + bucket]++;
        out_rows->vec<int32_t>()(at) = static_cast<int32_t>(k.row % per_sc);
        out_cols->vec<int32_t>()(at) = static_cast<int32_t>(k.col / p);
        out_gains->vec<float>()(at) = k.gain;
      }
    }
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
    int num_replica, sample_count, per_sample;
    OP_REQUIRES_OK(c, c->GetAttr("table_name", &table_));
    OP_REQUIRES_OK(c, c->GetAttr("num_replica", &num_replica));
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &sample_count));
    OP_REQUIRES_OK(c, c->GetAttr("max_minibatches_per_sc", &max_minibatches_));
    OP_REQUIRES_OK(c, c->GetAttr("max_ids_per_chip_per_sample", &per_sample));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_per_chip", &num_sc_));
    OP_REQUIRES(c, sample_count % num_sc_ == 0,
                Invalid(op_, absl::StrCat("sample_count ", sample_count,
                                          " is not divisible by the number of sparsecores per "
                                          "chip ",
                                          num_sc_)));
    num_physical_ = static_cast<int64_t>(num_replica) * num_sc_;
    max_ids_ = static_cast<int64_t>(per_sample) * sample_count;
    sizes_ = sc::CsrBufferSizesFor(num_replica, num_sc_, max_minibatches_, max_ids_);
    OP_REQUIRES(c, max_ids_ <= kInt32Max && sizes_.row_pointers <= kInt32Max &&
                       num_physical_ * num_sc_ * sc::kMaxDivisions < kInt32Max,
                Invalid(op_, absl::StrCat("the buffers (", sizes_.row_pointers, " row pointers, ",
                                          max_ids_, " ids) exceed int32")));
    OP_REQUIRES(c, max_ids_ % sc::kXlaPadSize == 0,
                Invalid(op_, absl::StrCat("The max_ids_per_chip is set to be ", max_ids_,
                                          " which is not divisible by the xla_pad_size ",
                                          sc::kXlaPadSize, " .")));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(1);
    const Tensor& cols = ctx->input(2);
    const Tensor& gains = ctx->input(3);
    const Tensor& splits_t = ctx->input(4);
    const Tensor& counts_t = ctx->input(5);
    OP_REQUIRES_OK(ctx, RankOne(op_, "id_counts", counts_t));
    const int64_t n = rows.NumElements(), p = num_physical_;
    OP_REQUIRES(ctx, cols.NumElements() == n && gains.NumElements() == n,
                Invalid(op_, absl::StrCat("row_ids (", n, "), col_ids (", cols.NumElements(),
                                          ") and gains (", gains.NumElements(),
                                          ") must have the same length")));
    const int64_t num_counts = sc::kMaxDivisions * num_sc_ * p + 1;
    OP_REQUIRES(ctx, counts_t.NumElements() == num_counts,
                Invalid(op_, absl::StrCat("id_counts has ", counts_t.NumElements(),
                                          " elements; 64 divisions * ", num_sc_,
                                          " sparse cores * ", p, " replicas + 1 = ", num_counts,
                                          " expected")));
    const auto counts = counts_t.vec<int32_t>();
    for (int64_t i = 0; i < num_counts; ++i) {
      const int32_t prev = i == 0 ? 0 : counts(i - 1);
      TTE_SC_CHECK(ctx, counts(i) >= prev && counts(i) <= n,
                   Invalid(op_, absl::StrCat("id_counts[", i, "] = ", counts(i), " must lie in [",
                                             prev, ", ", n,
                                             "] (non-decreasing, at most the ids' length)")));
    }
    uint64_t splits = 0;
    const auto split_values = splits_t.flat<int64_t>();
    for (int64_t i = 0; i < split_values.size(); ++i) {
      TTE_SC_CHECK(ctx, split_values(i) >= 0,
                   Invalid(op_, absl::StrCat("splits[", i, "] = ", split_values(i),
                                             " is negative (bit 63 is no split point)")));
      splits |= static_cast<uint64_t>(split_values(i));
    }
    const std::vector<int> bounds = BucketBounds(splits);
    const int64_t num_minibatches = static_cast<int64_t>(bounds.size()) - 1;
    TTE_SC_CHECK(ctx, num_minibatches <= max_minibatches_,
                 Invalid(op_, absl::StrCat("The number of minibatches per sparse core is ",
                                           num_minibatches,
                                           ". But the max minibatches per sparse core is set to "
                                           "be ",
                                           max_minibatches_, " which is smaller.")));
    CsrSource source;
    for (int s = 0; s < num_sc_; ++s) {
      source.rows.push_back(rows.flat<int32_t>().data());
      source.cols.push_back(cols.flat<int32_t>().data());
      source.gains.push_back(gains.flat<float>().data());
      source.counts.push_back(counts.data());
    }
    source.position = [p](int s, int64_t bound, int64_t rep) -> int64_t {
      return (s * p + rep) * sc::kMaxDivisions + bound;
    };
    OP_REQUIRES_OK(ctx, WriteCsr(ctx, op_, table_, source, bounds, num_sc_, p,
                                 sizes_.row_pointers, max_ids_, /*allow_dropping=*/false,
                                 counts(num_counts - 1), /*minibatching=*/true));
  }

 private:
  const std::string op_;
  std::string table_;
  int max_minibatches_ = 1, num_sc_ = 1;
  int64_t num_physical_ = 1, max_ids_ = 0;
  sc::CsrBufferSizes sizes_{};
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
    OP_REQUIRES(c, sample_count % num_sc == 0,
                Invalid(op_, absl::StrCat("sample_count ", sample_count,
                                          " is not divisible by the number of sparsecores per "
                                          "chip ",
                                          num_sc)));
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
                   Invalid(op_, absl::StrCat("unpadded_sizes[", i, "] = ", n, " is outside [0, ",
                                             bound, "] (the first dimension of tensors[", i,
                                             "])")));
    }
    for (int i = 0; i < num_tensors; ++i) ctx->set_output(i, ctx->input(i));
  }

 private:
  const std::string op_;
  int num_sizes_ = 0;
};

template <typename Kernel>
void Register(const char* bare) {
  RegisterCpuKernel<Kernel>(bare, CoreOpRegistered(bare));
}

bool RegisterKernels() {
  Register<ConvertToCooTensorOp>("ConvertToCooTensor");
  Register<ConvertToListOfSparseCoreCooTensorsOp>("ConvertToListOfSparseCoreCooTensors");
  Register<SortListOfSparseCoreCooTensorsOp>("SortListOfSparseCoreCooTensors");
  Register<GetStatsFromListOfSparseCoreCooTensorsOp>("GetStatsFromListOfSparseCoreCooTensors");
  Register<ConvertToSparseCoreCsrWrappedCooTensorOp>("ConvertToSparseCoreCsrWrappedCooTensor");
  Register<GetMinibatchSplitsWithPhysicalReplicaOp>("GetMinibatchSplitsWithPhysicalReplica");
  Register<GetMinibatchesInCsrWithPhysicalReplicaOp>("GetMinibatchesInCsrWithPhysicalReplica");
  Register<StoreMinibatchStatisticsInFdoOp>("StoreMinibatchStatisticsInFdo");
  Register<GlobalIterIdOp>("GlobalIterId");
  Register<DynamicShapeCopyOp>("TPUCopyWithDynamicShape");
  Register<DynamicShapeCopyOp>("TPUAnnotateTensorsWithDynamicShape");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
