// What every input mapper shares (engine/mapper_base.h): the error-message
// helpers, the positional checks, and the enqueue ops' combiners attribute.
#include "engine/mapper_base.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/input_mappers.h"

namespace tf_tpu_emb {
namespace mapping {

// "input 2 (feature 'watched', table 'video')"
std::string Describe(const std::string& op, const Engine& e, int input, int output) {
  const int table = e.outputs()[output].table;
  std::string s = absl::StrCat(op, ": input ", input, " (");
  if (!e.table_mode()) {
    absl::StrAppend(&s, "feature '", e.config().feature_descriptor(output).name(), "', ");
  }
  absl::StrAppend(&s, "table '", e.config().table_descriptor(table).name(), "')");
  return s;
}

// Inputs are positional: input i feeds output i (a table in table mode, a
// feature descriptor otherwise).
absl::Status CheckPositionalCount(const std::string& op, int n, const Engine& e) {
  if (n != static_cast<int>(e.outputs().size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": got ", n, " inputs but the config has ", e.outputs().size(),
                     e.table_mode() ? " tables" : " feature descriptors"));
  }
  return absl::OkStatus();
}

absl::Status CheckWeights(Who who, const Tensor& ids, const Tensor& weights) {
  if (weights.NumElements() != 0 && weights.NumElements() != ids.NumElements()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who(), ": aggregation_weights has ", weights.NumElements(),
                     " elements but embedding_indices has ", ids.NumElements(),
                     " (weights must be empty or one per id)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSplits(Who who, const Tensor& splits, int64_t n) {
  const int64_t rows = splits.NumElements() - 1;
  const IntView sv(splits);
  if (sv[0] != 0 || sv[rows] != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(who(), ": row splits must start at 0 and end at the number of ids (", n,
                     "), got ", sv[0], " and ", sv[rows]));
  }
  for (int64_t b = 0; b < rows; ++b) {
    if (sv[b + 1] < sv[b]) {
      return absl::InvalidArgumentError(absl::StrCat(who(),
                                                     ": row splits must be non-decreasing; split ",
                                                     b + 1, " is ", sv[b + 1], " after ", sv[b]));
    }
  }
  return absl::OkStatus();
}

// Positions of a feature whose output has `shape` (bags laid out
// row-major), for COO indices, row splits or dense ids (see README).
absl::Status ArbitraryPositions(Who who, const std::vector<int64_t>& shape, const Tensor& splits,
                                const Tensor& ids, std::vector<int64_t>* pos) {
  const int64_t n = ids.NumElements();
  const int r = shape.size();
  int64_t positions = 1;
  for (int64_t d : shape) positions *= d;
  pos->resize(n);
  if (splits.dims() == 2 && splits.dim_size(0) > 0) {  // COO indices
    const int64_t cols = splits.dim_size(1);
    if (splits.dim_size(0) != n) {
      return absl::InvalidArgumentError(absl::StrCat(who(), ": sample_indices has ",
                                                     splits.dim_size(0), " rows but there are ", n,
                                                     " embedding ids"));
    }
    if (cols != r && cols != r + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), ": sample_indices has ", cols, " columns; the feature's input_shape has rank ", r,
          " so ", r, " or ", r + 1, " columns are expected"));
    }
    int64_t* out = pos->data();
    return WithInts(splits, [&](const auto* idx) -> absl::Status {
      for (int64_t k = 0; k < n; ++k) {
        const auto* row = idx + k * cols;
        int64_t p = 0;
        for (int j = 0; j < r && p >= 0; ++j) {
          const int64_t v = row[j];
          if (v < 0 || (j == 0 && v >= shape[0])) {
            return absl::InvalidArgumentError(absl::StrCat(who(), ": sample index ", v, " (row ", k,
                                                           ", column ", j, ") is outside [0, ",
                                                           shape[j], ")"));
          }
          p = v >= shape[j] ? -1 : p * shape[j] + v;  // past a trailing dim: truncated
        }
        if (cols == r + 1 && row[r] < 0) {  // the position inside the bag
          return absl::InvalidArgumentError(absl::StrCat(who(), ": sample index ", int64_t{row[r]},
                                                         " (row ", k, ", column ", r,
                                                         ") is negative"));
        }
        out[k] = p;
      }
      return absl::OkStatus();
    });
  }
  if (splits.dims() == 1 && splits.NumElements() > 0) {  // row splits
    const int64_t rows = splits.NumElements() - 1;
    const int64_t width =
        r >= 2 && rows * shape[r - 1] == positions && rows != positions ? shape[r - 1] : 1;
    if (rows * width != positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), ": row_splits describe ", rows, " rows but the feature has ", positions,
          " output positions",
          r >= 2 ? absl::StrCat(" (or ", positions / shape[r - 1], " sequences)") : ""));
    }
    TF_RETURN_IF_ERROR(CheckSplits(who, splits, n));
    const IntView sv(splits);
    for (int64_t b = 0; b < rows; ++b) {
      const int64_t lo = sv[b], hi = sv[b + 1];
      for (int64_t k = lo; k < hi; ++k) {
        const int64_t j = k - lo;
        (*pos)[k] = width == 1 ? b : (j < width ? b * width + j : -1);
      }
    }
    return absl::OkStatus();
  }
  if (splits.dims() < 1 || splits.dims() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        who(), ": sample_indices_or_row_splits must have rank 1 or 2, got rank ", splits.dims()));
  }
  // Empty indices: one id per output position (or no ids at all).
  if (n != 0 && n != positions) {
    return absl::InvalidArgumentError(
        absl::StrCat(who(),
                     ": without sample indices or row splits there must be one id per "
                     "output position (",
                     positions, "), got ", n));
  }
  for (int64_t k = 0; k < n; ++k) (*pos)[k] = k;
  return absl::OkStatus();
}

}  // namespace mapping

absl::Status ParseCombiners(const std::string& op, const std::vector<std::string>& names,
                            std::vector<Combiner>* combiners) {
  combiners->clear();
  for (const std::string& c : names) {
    if (c != "sum" && c != "mean" && c != "sqrtn") {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": Invalid combiner '", c,
                       "': only \"sum\", \"mean\", and \"sqrtn\" are supported."));
    }
    combiners->push_back(c == "mean"    ? Combiner::kMean
                         : c == "sqrtn" ? Combiner::kSqrtn
                                        : Combiner::kSum);
  }
  return absl::OkStatus();
}

}  // namespace tf_tpu_emb
