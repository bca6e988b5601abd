// The SparseCore COO preprocessing (TPUEmbeddingV2) as functions of attrs
// and tensors (kernels/sparsecore/preprocess.h): the COO conversion of a
// feature's batch (ConvertToCooTensor, ConvertToListOfSparseCoreCooTensors)
// and the per-SparseCore sort and its statistics
// (SortListOfSparseCoreCooTensors, GetStatsFromListOfSparseCoreCooTensors).
// Their kernels are kernels/sparsecore/coo_kernels.cc.  What each computes:
// docs/sparsecore_semantics.md §1-§2; the shared arithmetic is
// core/sparsecore.h.  Every input is checked before anything is written: a
// bad one is InvalidArgument naming the op and the offending index, never an
// out-of-bounds access.
#include <algorithm>
#include <cstdint>
#include <map>
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

// ------------------------------------------------------------ §1 COO conversion

// A feature's batch as §1 reads it: the token range [splits[r],
// splits[r + 1]) of each sample r (ragged form, whatever the input's form),
// the ids and the weights (one, broadcast, or one a token).
struct CooInput {
  std::vector<int32_t> own_splits;  // when the input is not ragged
  const int32_t* splits = nullptr;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  bool broadcast = false;
  int64_t sample_count = 0;
  sc::Combiner combiner = sc::Combiner::kSum;

  float Weight(int64_t i) const { return broadcast ? weights[0] : weights[i]; }
};

// The sample splits of `split` (dense: empty; SparseTensor indices: a
// matrix; ragged row splits: a vector), every form checked (§1, ours).
absl::Status SampleSplits(const std::string& op, const Tensor& split, int64_t n, CooInput* in) {
  const int64_t sample_count = in->sample_count;
  if (split.dims() == 1 && split.NumElements() == 0) {  // dense
    if (n != 0 && n != sample_count) {
      return Invalid(op, absl::StrCat("a dense input has ", n, " values for ", sample_count,
                                      " samples (sample_count); they must be equal"));
    }
    in->own_splits.resize(sample_count + 1);
    if (n == 0) {
      std::fill(in->own_splits.begin(), in->own_splits.end(), 0);
    } else {
      std::iota(in->own_splits.begin(), in->own_splits.end(), 0);
    }
    in->splits = in->own_splits.data();
    return absl::OkStatus();
  }
  if (split.dims() == 2) {  // SparseTensor indices
    if (split.dim_size(0) != n) {
      return Invalid(op, absl::StrCat("indices_or_row_splits has ", split.dim_size(0),
                                      " rows of indices for ", n, " values"));
    }
    if (n > 0 && split.dim_size(1) != 2) {
      return Invalid(op, absl::StrCat("indices of a SparseTensor must have 2 columns (a rank-2 "
                                      "SparseTensor: higher ranks need shape strides), got ",
                                      split.dim_size(1)));
    }
    const int32_t* idx = split.flat<int32_t>().data();
    std::vector<int32_t>& s = in->own_splits;
    s.assign(sample_count + 1, 0);
    int32_t prev = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t r = idx[2 * i];
      if (r < 0 || r >= sample_count) {
        return Invalid(op, absl::StrCat("indices_or_row_splits[", i, ", 0] = ", r,
                                        " is outside [0, sample_count = ", sample_count, ")"));
      }
      if (r < prev) {
        return Invalid(op, absl::StrCat("indices_or_row_splits[", i, ", 0] = ", r,
                                        " is smaller than the row before it (", prev,
                                        "): SparseTensor indices must be sorted"));
      }
      ++s[r + 1];
      prev = r;
    }
    for (int64_t r = 1; r <= sample_count; ++r) s[r] += s[r - 1];
    in->splits = s.data();
    return absl::OkStatus();
  }
  if (split.dims() == 1) {  // ragged row splits
    if (split.NumElements() != sample_count + 1) {
      return Invalid(op,
                     absl::StrCat("ragged row_splits have ", split.NumElements(),
                                  " elements; sample_count + 1 = ", sample_count + 1, " expected"));
    }
    const int32_t* s = split.flat<int32_t>().data();
    if (s[0] != 0) {
      return Invalid(op, absl::StrCat("row_splits[0] = ", s[0], ", must be 0"));
    }
    for (int64_t r = 1; r <= sample_count; ++r) {
      if (s[r] < s[r - 1]) {
        return Invalid(op, absl::StrCat("row_splits[", r, "] = ", s[r],
                                        " is smaller than row_splits[", r - 1, "] = ", s[r - 1]));
      }
    }
    if (s[sample_count] != n) {
      return Invalid(op, absl::StrCat("row_splits[", sample_count, "] = ", s[sample_count],
                                      " differs from the number of values ", n));
    }
    in->splits = s;
    return absl::OkStatus();
  }
  return Invalid(op, absl::StrCat("indices_or_row_splits must be empty (dense), a matrix "
                                  "(SparseTensor indices) or a vector (row splits), got shape ",
                                  split.shape().DebugString()));
}

absl::Status ReadCoo(const std::string& op, const Tensor& split, const Tensor& values,
                     const Tensor& weights, int64_t sample_count, sc::Combiner combiner,
                     CooInput* in) {
  TF_RETURN_IF_ERROR(RankOne(op, "values", values));
  const int64_t n = values.NumElements();
  if (n > kInt32Max) return Invalid(op, absl::StrCat(n, " values exceed int32"));
  if (weights.dims() > 1 || (weights.dims() == 1 && weights.NumElements() != n)) {
    return Invalid(op, absl::StrCat("weights must be a scalar or have one element per value (", n,
                                    "), got shape ", weights.shape().DebugString()));
  }
  in->sample_count = sample_count;
  in->combiner = combiner;
  TF_RETURN_IF_ERROR(SampleSplits(op, split, n, in));
  in->ids = values.flat<int32_t>().data();
  in->weights = weights.flat<float>().data();
  in->broadcast = weights.NumElements() == 1;
  return absl::OkStatus();
}

// A part of §1's conversion: samples [begin, end), written to `rows`,
// `cols` and `gains` from position `at`.  The parts of a batch are
// independent (adjacent deduplication never crosses a sample), so they run
// on the intra-op threads; each writes what one thread would.
struct CooPart {
  int64_t begin = 0, end = 0;
  int out = 0;       // the output list entry (SparseCore) it writes
  int64_t kept = 0;  // tokens kept after adjacent deduplication
  int64_t at = 0;    // its first position in that entry
  absl::Status status;
};

// Pass 1 of a part: checks its ids (not negative; `col_of(id)` within
// int32) and counts the tokens kept.  `row_of(sample)` is the output row.
template <typename RowOf, typename ColOf>
void CountPart(const std::string& op, const CooInput& in, RowOf row_of, ColOf col_of,
               CooPart* part) {
  int64_t kept = 0;
  for (int64_t r = part->begin; r < part->end; ++r) {
    const int32_t lo = in.splits[r], hi = in.splits[r + 1];
    const int64_t row = row_of(r);
    for (int32_t i = lo; i < hi; ++i) {
      const int32_t id = in.ids[i];
      if (id < 0) {
        part->status = Invalid(op, absl::StrCat("values[", i, "] = ", id, " is negative"));
        return;
      }
      const int64_t col = col_of(id);
      if (row > kInt32Max || col > kInt32Max) {
        part->status = Invalid(op, absl::StrCat("value ", id, " of sample ", r, " maps to row ",
                                                row, ", col ", col, ", beyond int32"));
        return;
      }
      kept += i == lo || id != in.ids[i - 1];
    }
  }
  part->kept = kept;
}

// Pass 2 of a part: the kept tokens of each sample with their merged gains
// (added in token order) times the sample's combiner scale.
template <typename RowOf, typename ColOf>
void WritePart(const CooInput& in, RowOf row_of, ColOf col_of, const CooPart& part, int32_t* rows,
               int32_t* cols, float* gains) {
  int64_t at = part.at;
  for (int64_t r = part.begin; r < part.end; ++r) {
    const int32_t lo = in.splits[r], hi = in.splits[r + 1];
    if (lo == hi) continue;
    float scale = 1.0f;
    if (in.combiner != sc::Combiner::kSum) {
      float sum = 0.0f;
      for (int32_t i = lo; i < hi; ++i) sum += sc::CombinerContribution(in.combiner, in.Weight(i));
      scale = sc::CombinerTransform(in.combiner, sum);
    }
    const int32_t row = static_cast<int32_t>(row_of(r));
    const int64_t first = at;
    for (int32_t i = lo; i < hi; ++i) {
      const int32_t id = in.ids[i];
      if (i > lo && id == in.ids[i - 1]) {
        gains[at - 1] += in.Weight(i);
        continue;
      }
      rows[at] = row;
      cols[at] = static_cast<int32_t>(col_of(id));
      gains[at] = in.Weight(i);
      ++at;
    }
    if (in.combiner != sc::Combiner::kSum) {
      for (int64_t k = first; k < at; ++k) gains[k] *= scale;
    }
  }
}

// Runs both passes of `parts` on the context's threads, allocating output
// entry e's three tensors (sized by its parts' kept tokens) through
// `allocate(e, size, &rows, &cols, &gains)` between them.  The first failing
// part's status (the lowest sample) is the op's.
template <typename RowOf, typename ColOf, typename Allocate>
absl::Status ConvertParts(PreprocessContext& ctx, const std::string& op, const CooInput& in,
                          int num_out, RowOf row_of, ColOf col_of, std::vector<CooPart>* parts,
                          Allocate allocate) {
  const int64_t tokens = in.splits[in.sample_count];
  const int64_t cost = 8 * (tokens / std::max<int64_t>(1, parts->size()) + 1);
  ctx.parallel_for(parts->size(), cost, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) CountPart(op, in, row_of, col_of, &(*parts)[p]);
  });
  std::vector<int64_t> sizes(num_out, 0);
  for (CooPart& part : *parts) {
    TF_RETURN_IF_ERROR(part.status);
    part.at = sizes[part.out];
    sizes[part.out] += part.kept;
  }
  std::vector<int32_t*> rows(num_out), cols(num_out);
  std::vector<float*> gains(num_out);
  for (int e = 0; e < num_out; ++e) {
    TF_RETURN_IF_ERROR(allocate(e, sizes[e], &rows[e], &cols[e], &gains[e]));
  }
  ctx.parallel_for(parts->size(), 2 * cost, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const CooPart& part = (*parts)[p];
      WritePart(in, row_of, col_of, part, rows[part.out], cols[part.out], gains[part.out]);
    }
  });
  return absl::OkStatus();
}

// Samples [begin, end) cut into about `pieces` parts of entry `out`.
void AddParts(int64_t begin, int64_t end, int out, int64_t pieces, std::vector<CooPart>* parts) {
  pieces = std::max<int64_t>(1, std::min(pieces, end - begin));
  for (int64_t k = 0; k < pieces; ++k) {
    CooPart part;
    part.begin = begin + (end - begin) * k / pieces;
    part.end = begin + (end - begin) * (k + 1) / pieces;
    part.out = out;
    parts->push_back(part);
  }
}

// Parts a thread when the batch is large enough to share (else one).
int64_t PartsFor(const PreprocessContext& ctx, int64_t tokens) {
  constexpr int64_t kTokensAPart = 4096;
  return std::max<int64_t>(1, std::min<int64_t>(ctx.num_threads, tokens / kTokensAPart));
}

// Output entry `e` of ConvertToCooList's three lists of `num_out` entries.
absl::Status AllocateCooEntry(PreprocessContext& ctx, int num_out, int e, int64_t m, int32_t** r,
                              int32_t** c, float** g) {
  Tensor *rows, *cols, *gains;
  const TensorShape shape({m});
  TF_RETURN_IF_ERROR(ctx.allocate(e, shape, &rows));
  TF_RETURN_IF_ERROR(ctx.allocate(num_out + e, shape, &cols));
  TF_RETURN_IF_ERROR(ctx.allocate(2 * num_out + e, shape, &gains));
  *r = rows->flat<int32_t>().data();
  *c = cols->flat<int32_t>().data();
  *g = gains->flat<float>().data();
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseCombinerAttr(const std::string& op, const std::string& name, sc::Combiner* out) {
  if (!sc::ParseCombiner(name, out)) {
    return Invalid(op, absl::StrCat("invalid combiner \"", name,
                                    "\": only \"sum\", \"mean\", and \"sqrtn\" are supported"));
  }
  return absl::OkStatus();
}

absl::Status CooAttrs::CheckList(const std::string& op) const {
  if ((num_sc_shards & (num_sc_shards - 1)) != 0) {
    return Invalid(op, absl::StrCat("num_sc_shards ", num_sc_shards, " is not a power of two."));
  }
  if (sample_count % num_sc != 0) {
    return Invalid(op, absl::StrCat("sample_count ", sample_count,
                                    " is not divisible by num_sc_per_chip ", num_sc));
  }
  return absl::OkStatus();
}

absl::Status ConvertToCoo(const std::string& op, const CooAttrs& a, const Tensor& split,
                          const Tensor& values, const Tensor& weights, PreprocessContext& ctx) {
  CooInput in;
  TF_RETURN_IF_ERROR(ReadCoo(op, split, values, weights, a.sample_count, a.combiner, &in));
  std::vector<CooPart> parts;
  AddParts(0, a.sample_count, 0, PartsFor(ctx, in.splits[a.sample_count]), &parts);
  return ConvertParts(
      ctx, op, in, 1, [](int64_t r) { return r; },
      [](int32_t id) { return static_cast<int64_t>(id); }, &parts,
      [&](int e, int64_t m, int32_t** r, int32_t** c, float** g) {
        return AllocateCooEntry(ctx, 1, e, m, r, c, g);
      });
}

absl::Status ConvertToCooList(const std::string& op, const CooAttrs& a, const Tensor& split,
                              const Tensor& values, const Tensor& weights, PreprocessContext& ctx) {
  CooInput in;
  TF_RETURN_IF_ERROR(ReadCoo(op, split, values, weights, a.sample_count, a.combiner, &in));
  // SparseCore s takes samples [s * per_sc, (s + 1) * per_sc): its rows
  // are r % per_sc + row_base + stacked_per_sc * s (§1).
  const int num_sc = a.num_sc;
  const int64_t per_sc = a.sample_count / num_sc;
  const int64_t row_base = a.row_offset / num_sc;
  const int64_t stacked_per_sc = a.stacked_sample_count / num_sc;
  const int64_t mask = a.num_sc_shards - 1;
  const int64_t shift = a.col_shift, offset = a.col_offset;
  const auto row_of = [=](int64_t r) {
    return r % per_sc + row_base + stacked_per_sc * (r / per_sc);
  };
  const auto col_of = [=](int32_t id) {
    const int64_t c = id;
    return ((c + shift) & mask) + (c & ~mask) + offset;
  };
  std::vector<CooPart> parts;
  const int64_t pieces = (PartsFor(ctx, in.splits[a.sample_count]) + num_sc - 1) / num_sc;
  for (int s = 0; s < num_sc; ++s) AddParts(s * per_sc, (s + 1) * per_sc, s, pieces, &parts);
  return ConvertParts(ctx, op, in, num_sc, row_of, col_of, &parts,
                      [&](int s, int64_t m, int32_t** r, int32_t** c, float** g) {
                        return AllocateCooEntry(ctx, num_sc, s, m, r, c, g);
                      });
}

// ------------------------------------------------------- §2 sort and statistics

absl::Status SortedList::Init(const std::string& op, int n, std::vector<int32_t> sample_counts,
                              std::vector<int32_t> col_offsets, int num_replica, int num_sc) {
  op_ = op;
  n_ = n;
  sample_counts_ = std::move(sample_counts);
  col_offsets_ = std::move(col_offsets);
  if (static_cast<int>(sample_counts_.size()) != n || static_cast<int>(col_offsets_.size()) != n) {
    return Invalid(op, absl::StrCat("sample_count_list (", sample_counts_.size(),
                                    ") and col_offset_list (", col_offsets_.size(),
                                    ") must have one entry per feature (N = ", n, ")"));
  }
  int64_t batch = 0;
  for (int s : sample_counts_) batch += s;
  if (batch <= 0 || batch > kInt32Max) {
    return Invalid(op, absl::StrCat("the sum of sample_count_list (", batch, ") must be positive"));
  }
  batch_ = static_cast<int32_t>(batch);
  const int64_t p = static_cast<int64_t>(num_replica) * num_sc;
  if (p > (int64_t{1} << 30) || (p & (p - 1)) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": Expected num_physical_replica to be a power of two, got ", p));
  }
  num_physical_ = static_cast<int32_t>(p);
  while ((1 << bits_) < num_physical_) ++bits_;
  std::map<int32_t, std::vector<int>> groups;
  for (int i = 0; i < n; ++i) groups[col_offsets_[i]].push_back(i);
  groups_.assign(groups.begin(), groups.end());
  return absl::OkStatus();
}

absl::Status SortedList::Run(const std::vector<Tensor>& rows, const std::vector<Tensor>& cols,
                             const std::vector<Tensor>& gains, PreprocessContext& ctx,
                             Result* out) const {
  if (static_cast<int>(rows.size()) != n_ || static_cast<int>(cols.size()) != n_ ||
      static_cast<int>(gains.size()) != n_) {
    return Invalid(op_, absl::StrCat("row_ids_list (", rows.size(), "), col_ids_list (",
                                     cols.size(), ") and gains_list (", gains.size(),
                                     ") must have N = ", n_, " tensors"));
  }
  int64_t tokens = 0;
  for (int f = 0; f < n_; ++f) {
    TF_RETURN_IF_ERROR(CheckFeature(f, rows[f], cols[f], gains[f]));
    tokens += cols[f].NumElements();
  }
  const int64_t num_groups = static_cast<int64_t>(groups_.size());
  out->kept.assign(num_groups, {});
  std::vector<std::vector<int64_t>> counts(num_groups), uniques(num_groups);
  const int32_t mask = num_physical_ - 1;
  const auto sort_group = [&](int64_t k) {
    const std::vector<int>& features = groups_[k].second;
    std::vector<int32_t> r, c;
    std::vector<float> g;
    const int32_t *rp, *cp;
    const float* gp;
    int64_t n = 0;
    if (features.size() == 1) {
      const int f = features[0];
      rp = rows[f].flat<int32_t>().data();
      cp = cols[f].flat<int32_t>().data();
      gp = gains[f].flat<float>().data();
      n = cols[f].NumElements();
    } else {
      for (int f : features) {
        const int32_t* fr = rows[f].flat<int32_t>().data();
        const int32_t* fc = cols[f].flat<int32_t>().data();
        const float* fg = gains[f].flat<float>().data();
        const int64_t m = cols[f].NumElements();
        r.insert(r.end(), fr, fr + m);
        c.insert(c.end(), fc, fc + m);
        g.insert(g.end(), fg, fg + m);
      }
      rp = r.data();
      cp = c.data();
      gp = g.data();
      n = static_cast<int64_t>(c.size());
    }
    std::vector<int64_t>& count = counts[k];
    std::vector<int64_t>& unique = uniques[k];
    count.assign(num_physical_, 0);
    unique.assign(num_physical_, 0);
    // The kept tokens come replica by replica (rotated by bits_): the
    // current replica's counts stay in registers until it changes.
    int32_t replica = -1;
    int64_t ids = 0, uniques_of = 0;
    const auto flush = [&] {
      if (replica < 0) return;
      count[replica] += ids;
      unique[replica] += uniques_of;
    };
    SortAndMerge(
        rp, cp, gp, 0, n, &out->kept[k],
        [&](int32_t col, bool new_col) {
          if ((col & mask) != replica) {
            flush();
            replica = col & mask;
            ids = uniques_of = 0;
          }
          ++ids;
          uniques_of += new_col;
        },
        bits_);
    flush();
  };
  ctx.parallel_for(num_groups, 16 * (tokens / std::max<int64_t>(1, num_groups) + 1),
                   [&](int64_t b, int64_t e) {
                     for (int64_t k = b; k < e; ++k) sort_group(k);
                   });
  out->counts.assign(num_physical_, 0);
  out->uniques.assign(num_physical_, 0);
  for (int64_t k = 0; k < num_groups; ++k) {
    for (int32_t p = 0; p < num_physical_; ++p) {
      out->counts[p] += counts[k][p];
      out->uniques[p] += uniques[k][p];
    }
  }
  return absl::OkStatus();
}

// Feature f's lists: equal lengths (TF's check), no negative row or col.
absl::Status SortedList::CheckFeature(int f, const Tensor& rows, const Tensor& cols,
                                      const Tensor& gains) const {
  const int64_t n = cols.NumElements();
  if (rows.NumElements() != n) {
    return Invalid(op_, absl::StrCat("feature ", f,
                                     ": row ids and col ids should have same "
                                     "elements. But got ",
                                     rows.NumElements(), " elements for row ids and ", n,
                                     " elements for col ids."));
  }
  if (gains.NumElements() != n) {
    return Invalid(op_, absl::StrCat("feature ", f,
                                     ": gains and col ids should have same "
                                     "elements. But got ",
                                     gains.NumElements(), " elements for gains and ", n,
                                     " elements for col ids."));
  }
  const int32_t* rp = rows.flat<int32_t>().data();
  const int32_t* cp = cols.flat<int32_t>().data();
  for (int64_t i = 0; i < n; ++i) {
    if ((cp[i] | rp[i]) >= 0) continue;
    if (cp[i] < 0) {
      return Invalid(op_, absl::StrCat("col_ids_list[", f, "][", i, "] = ", cp[i], " is negative"));
    }
    return Invalid(op_, absl::StrCat("row_ids_list[", f, "][", i, "] = ", rp[i], " is negative"));
  }
  return absl::OkStatus();
}

absl::Status GetStatsFromCooList(const SortedList& list, const std::vector<Tensor>& rows,
                                 const std::vector<Tensor>& cols, const std::vector<Tensor>& gains,
                                 PreprocessContext& ctx) {
  SortedList::Result result;
  TF_RETURN_IF_ERROR(list.Run(rows, cols, gains, ctx, &result));
  Tensor *max_ids, *max_uniques;
  TF_RETURN_IF_ERROR(ctx.allocate(0, TensorShape({}), &max_ids));
  TF_RETURN_IF_ERROR(ctx.allocate(1, TensorShape({}), &max_uniques));
  max_ids->scalar<int32_t>()() =
      static_cast<int32_t>(*std::max_element(result.counts.begin(), result.counts.end()));
  max_uniques->scalar<int32_t>()() =
      static_cast<int32_t>(*std::max_element(result.uniques.begin(), result.uniques.end()));
  return absl::OkStatus();
}

absl::Status SortCooList(const SortedList& list, const std::string& table, int max_ids,
                         int max_uniques, const std::vector<Tensor>& rows,
                         const std::vector<Tensor>& cols, const std::vector<Tensor>& gains,
                         PreprocessContext& ctx) {
  SortedList::Result result;
  TF_RETURN_IF_ERROR(list.Run(rows, cols, gains, ctx, &result));
  const std::string& op = list.op();
  const int32_t p = list.num_physical();
  Tensor* id_counts;
  TF_RETURN_IF_ERROR(ctx.allocate(3, TensorShape({p + 1}), &id_counts));
  auto counts = id_counts->vec<int32_t>();
  counts(0) = 0;
  for (int32_t r = 0; r < p; ++r) {
    if (result.counts[r] > max_ids) {
      return Invalid(op, absl::StrCat("Sparse core ", r, " gets ", result.counts[r],
                                      " ids while the max ids per sparse core is set to be ",
                                      max_ids, " for table ", table));
    }
    if (result.uniques[r] > max_uniques) {
      return Invalid(op, absl::StrCat("Sparse core ", r, " gets ", result.uniques[r],
                                      " unique ids while the max unique ids per sparse core "
                                      "is set to be ",
                                      max_uniques, " for table ", table));
    }
    counts(r + 1) = counts(r) + static_cast<int32_t>(result.counts[r]);
  }
  const int64_t total = counts(p);
  Tensor *rows_t, *cols_t, *gains_t;
  TF_RETURN_IF_ERROR(ctx.allocate(0, TensorShape({total}), &rows_t));
  TF_RETURN_IF_ERROR(ctx.allocate(1, TensorShape({total}), &cols_t));
  TF_RETURN_IF_ERROR(ctx.allocate(2, TensorShape({total}), &gains_t));
  std::vector<int32_t> next(counts.data(), counts.data() + p);
  int32_t* row_out = rows_t->flat<int32_t>().data();
  int32_t* col_out = cols_t->flat<int32_t>().data();
  float* gain_out = gains_t->flat<float>().data();
  // A group's kept tokens come replica by replica (SortedList::Run): the
  // write cursor stays in a register while the replica does not change.
  const int32_t batch = list.batch();
  const int bits = list.bits();
  for (const auto& group : result.kept) {
    int32_t replica = -1, at = 0;
    for (const Kept& k : group) {
      if ((k.col & (p - 1)) != replica) {
        if (replica >= 0) next[replica] = at;
        replica = k.col & (p - 1);
        at = next[replica];
      }
      row_out[at] = k.row < batch ? k.row : k.row % batch;
      col_out[at] = k.col >> bits;
      gain_out[at] = k.gain;
      ++at;
    }
    if (replica >= 0) next[replica] = at;
  }
  return absl::OkStatus();
}

}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
