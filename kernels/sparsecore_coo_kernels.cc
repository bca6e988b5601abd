// CPU kernels of the SparseCore COO preprocessing (TPUEmbeddingV2): the
// COO conversion of a feature's batch (ConvertToCooTensor,
// ConvertToListOfSparseCoreCooTensors) and the per-SparseCore sort and its
// statistics (SortListOfSparseCoreCooTensors,
// GetStatsFromListOfSparseCoreCooTensors).  Registered as TfTpuEmb>Name and
// under TF's name (TF's CPU wheel has no kernel for them).  What each
// computes: docs/sparsecore_semantics.md §1-§2; the shared arithmetic is
// core/sparsecore.h.  Every input is checked before anything is written: a
// bad one is InvalidArgument naming the op and the offending index, never an
// out-of-bounds access.
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
#include "kernels/sparsecore_preprocess.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace {

namespace sc = ::tf_tpu_emb::sparsecore;
using sc_util::Invalid;
using sc_util::Kept;
using sc_util::kInt32Max;
using sc_util::RankOne;
using sc_util::RegisterBoth;
using sc_util::SortAndMerge;

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
    int32_t* row_out = rows->flat<int32_t>().data();
    int32_t* col_out = cols->flat<int32_t>().data();
    float* gain_out = gains->flat<float>().data();
    for (int64_t k = 0; k < m; ++k) {
      row_out[k] = coo.rows[k];
      col_out[k] = coo.cols[k];
      gain_out[k] = ScaledGain(coo, k);
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
      int32_t* row_out = r->flat<int32_t>().data();
      int32_t* col_out = c->flat<int32_t>().data();
      float* gain_out = g->flat<float>().data();
      for (int64_t j = 0; j < per_sc_count[s]; ++j, ++k) {
        row_out[j] = out_rows[k];
        col_out[j] = out_cols[k];
        gain_out[j] = ScaledGain(coo, k);
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
      std::vector<Kept> group;
      SortAndMerge(r.data(), c.data(), g.data(), 0, static_cast<int64_t>(c.size()), &group,
                   [&](int32_t col, bool new_col) {
                     ++counts_[col & mask];
                     if (new_col) ++uniques_[col & mask];
                   });
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
    int32_t* row_out = rows->flat<int32_t>().data();
    int32_t* col_out = cols->flat<int32_t>().data();
    float* gain_out = gains->flat<float>().data();
    for (const auto& group : list.kept()) {
      for (const Kept& k : group) {
        const int32_t at = next[k.col & (p - 1)]++;
        row_out[at] = k.row % list.batch();
        col_out[at] = k.col >> list.bits();
        gain_out[at] = k.gain;
      }
    }
  }

 private:
  SortedList list_;
  std::string table_;
  int max_ids_ = 1, max_uniques_ = 1;
};

bool RegisterKernels() {
  RegisterBoth<ConvertToCooTensorOp>("ConvertToCooTensor");
  RegisterBoth<ConvertToListOfSparseCoreCooTensorsOp>("ConvertToListOfSparseCoreCooTensors");
  RegisterBoth<SortListOfSparseCoreCooTensorsOp>("SortListOfSparseCoreCooTensors");
  RegisterBoth<GetStatsFromListOfSparseCoreCooTensorsOp>("GetStatsFromListOfSparseCoreCooTensors");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
