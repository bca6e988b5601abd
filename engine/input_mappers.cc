#include "engine/input_mappers.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/exceptions.h"
#include "xla/tsl/platform/threadpool.h"

namespace tf_tpu_emb {

using ::tensorflow::DT_DOUBLE;
using ::tensorflow::DT_INT64;
using ::tensorflow::Tensor;

namespace {

// Element access to an int32/int64 (IntView) or float32/float64 (FloatView)
// tensor through a raw pointer: built once per tensor, cheap per element.
class IntView {
 public:
  explicit IntView(const Tensor& t)
      : data_(t.tensor_data().data()), is64_(t.dtype() == DT_INT64),
        cols_(t.dims() == 2 ? t.dim_size(1) : 1) {}
  int64_t operator[](int64_t i) const {
    return is64_ ? static_cast<const int64_t*>(data_)[i]
                 : static_cast<const int32_t*>(data_)[i];
  }
  // Element (row, col) of a rank-2 tensor.
  int64_t operator()(int64_t row, int64_t col) const { return (*this)[row * cols_ + col]; }

 private:
  const void* data_;
  bool is64_;
  int64_t cols_;
};

class FloatView {
 public:
  explicit FloatView(const Tensor& t)
      : data_(t.tensor_data().data()), is64_(t.dtype() == DT_DOUBLE) {}
  float operator[](int64_t i) const {
    return is64_ ? static_cast<float>(static_cast<const double*>(data_)[i])
                 : static_cast<const float*>(data_)[i];
  }

 private:
  const void* data_;
  bool is64_;
};

// The "who" of an error message, built only when there is an error.
using Who = absl::FunctionRef<std::string()>;

// Runs fn(i) for every i in [0, n) on `pool` (serially without one) and
// returns the error of the lowest failing i (so errors do not depend on
// scheduling).
template <typename Fn>
absl::Status ParallelForStatus(::tsl::thread::ThreadPool* pool, int n, Fn fn) {
  std::vector<absl::Status> status(n);
  auto work = [&](int64_t begin, int64_t end) {
    // An exception must not leave a pool thread (it would terminate).
    for (int64_t i = begin; i < end; ++i) {
      const absl::Status thrown =
          CatchExceptions("tf_tpu_emb", [&] { status[i] = fn(static_cast<int>(i)); });
      if (!thrown.ok()) status[i] = thrown;
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(n, /*cost_per_unit=*/1 << 20, work);
  } else {
    work(0, n);
  }
  for (const absl::Status& s : status) TF_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

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
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": got ", n, " inputs but the config has ", e.outputs().size(),
        e.table_mode() ? " tables" : " feature descriptors"));
  }
  return absl::OkStatus();
}

absl::Status CheckWeights(Who who, const Tensor& ids, const Tensor& weights) {
  if (weights.NumElements() != 0 && weights.NumElements() != ids.NumElements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        who(), ": aggregation_weights has ", weights.NumElements(),
        " elements but embedding_indices has ", ids.NumElements(),
        " (weights must be empty or one per id)"));
  }
  return absl::OkStatus();
}

absl::Status CheckSplits(Who who, const Tensor& splits, int64_t n) {
  const int64_t rows = splits.NumElements() - 1;
  const IntView sv(splits);
  if (sv[0] != 0 || sv[rows] != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        who(), ": row splits must start at 0 and end at the number of ids (", n, "), got ",
        sv[0], " and ", sv[rows]));
  }
  for (int64_t b = 0; b < rows; ++b) {
    if (sv[b + 1] < sv[b]) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), ": row splits must be non-decreasing; split ", b + 1, " is ",
          sv[b + 1], " after ", sv[b]));
    }
  }
  return absl::OkStatus();
}

// Positions of a feature whose output has `shape` (bags laid out
// row-major), for COO indices, row splits or dense ids (see README).
absl::Status ArbitraryPositions(Who who, const std::vector<int64_t>& shape,
                                const Tensor& splits, const Tensor& ids,
                                std::vector<int64_t>* pos) {
  const int64_t n = ids.NumElements();
  const int r = shape.size();
  int64_t positions = 1;
  for (int64_t d : shape) positions *= d;
  pos->resize(n);
  if (splits.dims() == 2 && splits.dim_size(0) > 0) {  // COO indices
    const int64_t cols = splits.dim_size(1);
    if (splits.dim_size(0) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), ": sample_indices has ", splits.dim_size(0), " rows but there are ",
          n, " embedding ids"));
    }
    if (cols != r && cols != r + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), ": sample_indices has ", cols, " columns; the feature's input_shape has rank ",
          r, " so ", r, " or ", r + 1, " columns are expected"));
    }
    const IntView idx(splits);
    for (int64_t k = 0; k < n; ++k) {
      int64_t p = 0;
      for (int j = 0; j < r && p >= 0; ++j) {
        const int64_t v = idx(k, j);
        if (v < 0 || (j == 0 && v >= shape[0])) {
          return absl::InvalidArgumentError(absl::StrCat(
              who(), ": sample index ", v, " (row ", k, ", column ", j,
              ") is outside [0, ", shape[j], ")"));
        }
        p = v >= shape[j] ? -1 : p * shape[j] + v;  // past a trailing dim: truncated
      }
      if (cols == r + 1 && idx(k, r) < 0) {  // the position inside the bag
        return absl::InvalidArgumentError(absl::StrCat(
            who(), ": sample index ", idx(k, r), " (row ", k, ", column ", r,
            ") is negative"));
      }
      (*pos)[k] = p;
    }
    return absl::OkStatus();
  }
  if (splits.dims() == 1 && splits.NumElements() > 0) {  // row splits
    const int64_t rows = splits.NumElements() - 1;
    const int64_t width = r >= 2 && rows * shape[r - 1] == positions && rows != positions
                              ? shape[r - 1] : 1;
    if (rows * width != positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), ": row_splits describe ", rows, " rows but the feature has ", positions,
          " output positions", r >= 2 ? absl::StrCat(" (or ", positions / shape[r - 1],
                                                     " sequences)") : ""));
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
    return absl::InvalidArgumentError(absl::StrCat(
        who(), ": without sample indices or row splits there must be one id per "
             "output position (", positions, "), got ", n));
  }
  for (int64_t k = 0; k < n; ++k) (*pos)[k] = k;
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseCombiners(const std::string& op, const std::vector<std::string>& names,
                            std::vector<Combiner>* combiners) {
  combiners->clear();
  for (const std::string& c : names) {
    if (c != "sum" && c != "mean" && c != "sqrtn") {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": Invalid combiner '", c,
          "': only \"sum\", \"mean\", and \"sqrtn\" are supported."));
    }
    combiners->push_back(c == "mean" ? Combiner::kMean
                                     : c == "sqrtn" ? Combiner::kSqrtn : Combiner::kSum);
  }
  return absl::OkStatus();
}

namespace {

// The parts every mapper shares: combiners per input, positional inputs,
// the id check and the CSR assembly.  A mapper only says where each input
// element goes (MapFeatures).
class MapperBase : public InputMapper {
 public:
  absl::Status Map(const Engine& e, const EnqueueInputs& in, ::tsl::thread::ThreadPool* pool,
                   Batch* batch) const override {
    const Work w{e, in, pool};
    std::vector<FeatureSource> sources;
    std::vector<std::vector<Combiner>> slot_combiners(e.outputs().size());
    TF_RETURN_IF_ERROR(MapFeatures(w, &sources, &slot_combiners));
    TF_RETURN_IF_ERROR(CheckIds(w, sources));
    Assemble(w, sources, std::move(slot_combiners), batch);
    return absl::OkStatus();
  }

 protected:
  // One input feature mapped onto an engine output: element k goes to bag
  // positions[k] of the output, or nowhere when positions[k] < 0 (truncated
  // sequence positions).
  struct FeatureSource {
    int output = 0;
    std::vector<int64_t> positions;
    const Tensor* ids = nullptr;
    const Tensor* weights = nullptr;  // nullptr: all weights are 1
  };
  // What one Map call works on.
  struct Work {
    const Engine& e;
    const EnqueueInputs& in;
    ::tsl::thread::ThreadPool* pool;
  };

  MapperBase(std::string op, std::vector<Combiner> combiners)
      : op_(std::move(op)), combiners_(std::move(combiners)) {}

  // Maps each input feature onto the engine's outputs (validating it); may
  // set slot_combiners[o] (default: the one combiner "sum").
  virtual absl::Status MapFeatures(const Work& w, std::vector<FeatureSource>* sources,
                                   std::vector<std::vector<Combiner>>* slot_combiners) const = 0;

  const std::string op_;
  const std::vector<Combiner> combiners_;  // empty, one per input or one per table

  // Combiner of each input: `combiners_` is empty (all "sum"), one per input,
  // or one per table.  `inputs_first` decides when N == number of tables.
  absl::Status InputCombiners(const Engine& e, int n, const std::vector<int>& input_tables,
                              bool inputs_first, std::vector<Combiner>* out) const {
    out->assign(n, Combiner::kSum);
    const int k = combiners_.size();
    if (k == 0) return absl::OkStatus();
    const bool per_input = k == n && (inputs_first || k != e.num_tables());
    if (!per_input && k != e.num_tables()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": ", k, " combiners given; expected 0, one per input (", n,
          ") or one per table (", e.num_tables(), ")"));
    }
    for (int i = 0; i < n; ++i) (*out)[i] = combiners_[per_input ? i : input_tables[i]];
    return absl::OkStatus();
  }

  // Maps positional inputs (input i feeds output i), each input's element
  // positions given by `positions(who, i, splits_or_indices, ids, &pos)`.
  template <typename PositionsFn>
  absl::Status MapPositional(const Work& w, bool inputs_first, PositionsFn positions,
                             std::vector<FeatureSource>* sources,
                             std::vector<std::vector<Combiner>>* slot_combiners) const {
    const Engine& e = w.e;
    const int n = w.in.ids.size();
    TF_RETURN_IF_ERROR(CheckPositionalCount(op_, n, e));
    std::vector<int> tables(n);
    for (int i = 0; i < n; ++i) tables[i] = e.outputs()[i].table;
    std::vector<Combiner> combiners;
    TF_RETURN_IF_ERROR(InputCombiners(e, n, tables, inputs_first, &combiners));
    sources->resize(n);
    return ParallelForStatus(w.pool, n, [&](int i) -> absl::Status {
      auto who = [&] { return Describe(op_, e, i, i); };
      FeatureSource& s = (*sources)[i];
      const Tensor& ids = *w.in.ids[i];
      const Tensor& weights = *w.in.weights[i];
      s.output = i;
      s.ids = &ids;
      TF_RETURN_IF_ERROR(CheckWeights(who, ids, weights));
      s.weights = weights.NumElements() ? &weights : nullptr;
      (*slot_combiners)[i] = {combiners[i]};
      return positions(who, i, *w.in.splits[i], ids, &s.positions);
    });
  }

 private:
  absl::Status CheckIds(const Work& w, const std::vector<FeatureSource>& sources) const {
    const Engine& e = w.e;
    return ParallelForStatus(w.pool, sources.size(), [&](int i) -> absl::Status {
      const FeatureSource& s = sources[i];
      const int64_t vocab =
          e.config().table_descriptor(e.outputs()[s.output].table).vocabulary_size();
      const IntView ids(*s.ids);
      const int64_t n = s.ids->NumElements();
      for (int64_t k = 0; k < n; ++k) {
        const int64_t id = ids[k];
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat(
              Describe(op_, e, i, s.output), ": embedding id ", id, " at index ", k,
              " is outside the table's vocabulary [0, ", vocab, ")"));
        }
      }
      if (s.weights != nullptr) {
        const FloatView weights(*s.weights);
        for (int64_t k = 0; k < n; ++k) {
          if (!std::isfinite(weights[k])) {
            return absl::InvalidArgumentError(absl::StrCat(
                Describe(op_, e, i, s.output), ": aggregation weight at index ", k,
                " is not finite"));
          }
        }
      }
      return absl::OkStatus();
    });
  }

  // Groups the sources' elements by output into CSR (stable: input order),
  // one output per task.
  static void Assemble(const Work& w, const std::vector<FeatureSource>& sources,
                       std::vector<std::vector<Combiner>> slot_combiners, Batch* batch) {
    const Engine& e = w.e;
    const int num_outputs = e.outputs().size();
    batch->outputs.resize(num_outputs);
    std::vector<std::vector<const FeatureSource*>> feeding(num_outputs);
    for (const FeatureSource& s : sources) feeding[s.output].push_back(&s);
    ParallelForStatus(w.pool, num_outputs, [&](int o) {
      OutputBatch& ob = batch->outputs[o];
      ob.slot_combiners = std::move(slot_combiners[o]);
      if (ob.slot_combiners.empty()) ob.slot_combiners.push_back(Combiner::kSum);
      ob.offsets.assign(e.outputs()[o].positions + 1, 0);
      bool weighted = false;
      for (const FeatureSource* s : feeding[o]) {
        weighted |= s->weights != nullptr;
        for (int64_t p : s->positions) {
          if (p >= 0) ++ob.offsets[p + 1];
        }
      }
      for (size_t p = 1; p < ob.offsets.size(); ++p) ob.offsets[p] += ob.offsets[p - 1];
      ob.ids.resize(ob.offsets.back());
      if (weighted) ob.weights.resize(ob.offsets.back());
      std::vector<int64_t> cursor(ob.offsets.begin(), ob.offsets.end() - 1);
      for (const FeatureSource* s : feeding[o]) {
        const IntView ids(*s->ids);
        const bool has_weights = s->weights != nullptr;
        const FloatView weights(has_weights ? *s->weights : *s->ids);
        for (size_t k = 0; k < s->positions.size(); ++k) {
          const int64_t p = s->positions[k];
          if (p < 0) continue;
          const int64_t at = cursor[p]++;
          ob.ids[at] = ids[k];
          if (weighted) ob.weights[at] = has_weights ? weights[k] : 1.0f;
        }
      }
      return absl::OkStatus();
    }).IgnoreError();
  }
};

// ------------------------------------------------------------ IntegerBatch

class IntegerBatchMapper : public MapperBase {
 public:
  explicit IntegerBatchMapper(std::string op) : MapperBase(std::move(op), {}) {}

 protected:
  absl::Status MapFeatures(const Work& w, std::vector<FeatureSource>* sources,
                           std::vector<std::vector<Combiner>>*) const override {
    const Engine& e = w.e;
    const int n = w.in.ids.size();
    TF_RETURN_IF_ERROR(CheckPositionalCount(op_, n, e));
    sources->resize(n);
    for (int i = 0; i < n; ++i) {
      FeatureSource& s = (*sources)[i];
      s.output = i;
      s.ids = w.in.ids[i];
      const int64_t positions = e.outputs()[i].positions;
      if (s.ids->NumElements() != positions) {
        return absl::InvalidArgumentError(absl::StrCat(
            Describe(op_, e, i, i), ": expected one id per output row (", positions, "), got ",
            s.ids->NumElements()));
      }
      s.positions.resize(positions);
      for (int64_t k = 0; k < positions; ++k) s.positions[k] = k;
    }
    return absl::OkStatus();
  }
};

// ------------------------------------------------------------- SparseBatch

class SparseBatchMapper : public MapperBase {
 public:
  SparseBatchMapper(std::string op, std::vector<Combiner> combiners)
      : MapperBase(std::move(op), std::move(combiners)) {}

 protected:
  absl::Status MapFeatures(const Work& w, std::vector<FeatureSource>* sources,
                           std::vector<std::vector<Combiner>>* slot_combiners) const override {
    auto positions = [&](Who who, int i, const Tensor& idx, const Tensor& ids,
                         std::vector<int64_t>* pos) -> absl::Status {
      const int64_t count = ids.NumElements();
      const int64_t rows = w.e.outputs()[i].positions;
      if (idx.NumElements() != count) {
        return absl::InvalidArgumentError(absl::StrCat(
            who(), ": sample_indices has ", idx.NumElements(), " elements but there are ",
            count, " embedding ids"));
      }
      pos->resize(count);
      const IntView iv(idx);
      for (int64_t k = 0; k < count; ++k) {
        const int64_t p = iv[k];
        if (p < 0 || p >= rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              who(), ": sample index ", p, " at index ", k, " is outside [0, ", rows,
              ") (batch_size * num_features rows)"));
        }
        (*pos)[k] = p;
      }
      return absl::OkStatus();
    };
    return MapPositional(w, /*inputs_first=*/false, positions, sources, slot_combiners);
  }
};

// ---------------------------------------------------- ArbitraryTensorBatch

class ArbitraryTensorMapper : public MapperBase {
 public:
  ArbitraryTensorMapper(std::string op, std::vector<Combiner> combiners)
      : MapperBase(std::move(op), std::move(combiners)) {}

 protected:
  absl::Status MapFeatures(const Work& w, std::vector<FeatureSource>* sources,
                           std::vector<std::vector<Combiner>>* slot_combiners) const override {
    auto positions = [&w](Who who, int i, const Tensor& splits, const Tensor& ids,
                          std::vector<int64_t>* pos) {
      return ArbitraryPositions(who, w.e.outputs()[i].shape, splits, ids, pos);
    };
    return MapPositional(w, /*inputs_first=*/false, positions, sources, slot_combiners);
  }
};

// ------------------------------------------ SparseTensor / RaggedTensorBatch

class FeatureBatchMapper : public MapperBase {
 public:
  FeatureBatchMapper(std::string op, std::vector<Combiner> combiners, FeatureAttrs attrs,
                     bool ragged)
      : MapperBase(std::move(op), std::move(combiners)), attrs_(std::move(attrs)),
        ragged_(ragged) {}

 protected:
  absl::Status MapFeatures(const Work& w, std::vector<FeatureSource>* sources,
                           std::vector<std::vector<Combiner>>* slot_combiners) const override {
    const Engine& e = w.e;
    const EnqueueInputs& in = w.in;
    const std::vector<int32_t>& max_sequence_lengths = attrs_.max_sequence_lengths;
    const std::vector<int32_t>& num_features = attrs_.num_features;
    const int n = in.ids.size();
    if (static_cast<int>(attrs_.table_ids.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": table_ids has ", attrs_.table_ids.size(), " entries but there are ", n,
          " inputs"));
    }
    for (const auto* list : {&max_sequence_lengths, &num_features}) {
      if (!list->empty() && static_cast<int>(list->size()) != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": max_sequence_lengths and num_features must be empty or have one "
                 "entry per input (", n, "), got ", list->size()));
      }
    }
    std::vector<int> tables(attrs_.table_ids.begin(), attrs_.table_ids.end());
    for (int i = 0; i < n; ++i) {
      if (tables[i] < 0 || tables[i] >= e.num_tables()) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": table_ids[", i, "] = ", tables[i], " is not a table id in [0, ",
            e.num_tables(), ")"));
      }
    }
    std::vector<Combiner> combiners;
    TF_RETURN_IF_ERROR(InputCombiners(e, n, tables, /*inputs_first=*/true, &combiners));
    sources->resize(n);
    if (!e.table_mode()) {
      TF_RETURN_IF_ERROR(CheckPositionalCount(op_, n, e));
      for (int i = 0; i < n; ++i) {
        if (tables[i] != e.outputs()[i].table) {
          return absl::InvalidArgumentError(absl::StrCat(
              Describe(op_, e, i, i), ": table_ids[", i, "] = ", tables[i],
              " but the config's feature ", i, " looks up table ", e.outputs()[i].table));
        }
      }
      auto positions = [this, &e](Who who, int i, const Tensor& idx, const Tensor& ids,
                                  std::vector<int64_t>* pos) {
        return FeaturePositions(who, e.outputs()[i].shape, idx, ids, pos);
      };
      return MapPositional(w, /*inputs_first=*/true, positions, sources, slot_combiners);
    }
    // Table mode: lay the features of each table out in its feature rows.
    const int64_t batch = e.config().batch_size_per_tensor_core();
    std::vector<int64_t> used(e.num_tables(), 0), offset(n), width(n);
    for (int i = 0; i < n; ++i) {
      const int seq = max_sequence_lengths.empty() ? 0 : max_sequence_lengths[i];
      const int nf = num_features.empty() ? 1 : num_features[i];
      if (seq < 0 || nf < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": input ", i, " has max_sequence_length ", seq, " and num_features ", nf,
            "; they must be >= 0 and >= 1"));
      }
      width[i] = seq > 0 ? seq : nf;
      offset[i] = used[tables[i]];
      used[tables[i]] += width[i];
    }
    for (int t = 0; t < e.num_tables(); ++t) {
      (*slot_combiners)[t].assign(e.config().table_descriptor(t).num_features(), Combiner::kSum);
      if (used[t] != 0 && used[t] != e.config().table_descriptor(t).num_features()) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": the inputs of table '", e.config().table_descriptor(t).name(), "' take ",
            used[t], " rows per sample but the table has num_features ",
            e.config().table_descriptor(t).num_features()));
      }
    }
    for (int i = 0; i < n; ++i) {
      const int t = tables[i];
      auto who_fn = [&] { return Describe(op_, e, i, t); };
      Who who = who_fn;
      const bool sequence = !max_sequence_lengths.empty() && max_sequence_lengths[i] > 0;
      const int64_t w_i = width[i], nf_t = e.config().table_descriptor(t).num_features();
      FeatureSource& s = (*sources)[i];
      s.output = t;
      s.ids = in.ids[i];
      TF_RETURN_IF_ERROR(CheckWeights(who, *in.ids[i], *in.weights[i]));
      s.weights = in.weights[i]->NumElements() ? in.weights[i] : nullptr;
      for (int64_t j = 0; j < w_i; ++j) (*slot_combiners)[t][offset[i] + j] = combiners[i];
      // Each element's (sample b, row-in-feature j), or j = -1 to drop it.
      const Tensor& idx = *in.splits[i];
      const int64_t count = in.ids[i]->NumElements();
      std::vector<int64_t>& pos = s.positions;
      pos.resize(count);
      auto place = [&](int64_t k, int64_t b, int64_t j) {
        pos[k] = j < 0 ? -1 : b * nf_t + offset[i] + j;
      };
      const int64_t rows = sequence ? batch : batch * w_i;  // sparse rows of the input
      auto from_row = [&](int64_t k, int64_t row, int64_t within) -> absl::Status {
        if (row < 0 || row >= rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              who(), ": sample index ", row, " at index ", k, " is outside [0, ", rows, ")"));
        }
        if (sequence) {
          if (within < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                who(), ": negative sequence position ", within, " at index ", k));
          }
          place(k, row, within < w_i ? within : -1);
        } else {
          place(k, row / w_i, row % w_i);
        }
        return absl::OkStatus();
      };
      if (idx.NumElements() == 0) {  // dense: one id per row (per position for sequences)
        if (count != 0 && count != batch * w_i) {
          return absl::InvalidArgumentError(absl::StrCat(
              who(), ": without sample indices there must be ", batch * w_i, " ids, got ",
              count));
        }
        for (int64_t k = 0; k < count; ++k) place(k, k / w_i, k % w_i);
      } else if (ragged_) {
        if (idx.dims() != 1 || idx.NumElements() - 1 != rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              who(), ": sample_splits must be a vector of ", rows + 1, " row splits, got shape ",
              idx.shape().DebugString()));
        }
        TF_RETURN_IF_ERROR(CheckSplits(who, idx, count));
        const IntView sv(idx);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t lo = sv[r], hi = sv[r + 1];
          for (int64_t k = lo; k < hi; ++k) TF_RETURN_IF_ERROR(from_row(k, r, k - lo));
        }
      } else {
        const bool matrix = idx.dims() == 2;
        if (idx.dims() < 1 || idx.dims() > 2 || idx.dim_size(0) != count) {
          return absl::InvalidArgumentError(absl::StrCat(
              who(), ": sample_indices must be [", count, "] or [", count,
              ", k] (one row per id), got shape ", idx.shape().DebugString()));
        }
        if (sequence && (!matrix || idx.dim_size(1) < 2)) {
          return absl::InvalidArgumentError(absl::StrCat(
              who(), ": a sequence feature needs [n, 2] sample indices (sample, position), "
                     "got shape ", idx.shape().DebugString()));
        }
        const IntView iv(idx);
        for (int64_t k = 0; k < count; ++k) {
          const int64_t row = matrix ? iv(k, 0) : iv[k];
          const int64_t within = sequence ? iv(k, 1) : 0;
          TF_RETURN_IF_ERROR(from_row(k, row, within));
        }
      }
    }
    return absl::OkStatus();
  }

  // Feature-descriptor mode, after TF's op docs: SparseTensorBatch's
  // sample_indices are sp_ids.indices (rank 2, COO as for
  // ArbitraryTensorBatch) or its first column (rank 1: the sample of each
  // id, for a feature of input_shape [batch]); RaggedTensorBatch's
  // sample_splits are row splits (rank 1).  Empty means one id per position.
  absl::Status FeaturePositions(Who who, const std::vector<int64_t>& shape, const Tensor& idx,
                                const Tensor& ids, std::vector<int64_t>* pos) const {
    if (ragged_ ? idx.dims() != 1 : (idx.dims() != 1 && idx.dims() != 2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), ragged_ ? ": sample_splits must have rank 1 (row splits)"
                         : ": sample_indices must have rank 1 or 2",
          ", got shape ", idx.shape().DebugString()));
    }
    if (ragged_ || idx.dims() == 2 || idx.NumElements() == 0) {
      return ArbitraryPositions(who, shape, idx, ids, pos);
    }
    const int64_t n = ids.NumElements();
    if (shape.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), ": rank-1 sample_indices (sp_ids.indices[:, 0]) give only the sample of "
                 "each id, but the feature's input_shape has rank ", shape.size(),
          "; pass [n, ", shape.size(), "] or [n, ", shape.size() + 1, "] indices"));
    }
    if (idx.NumElements() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(), ": sample_indices has ", idx.NumElements(), " elements but there are ", n,
          " embedding ids"));
    }
    const IntView iv(idx);
    pos->resize(n);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = iv[k];
      if (v < 0 || v >= shape[0]) {
        return absl::InvalidArgumentError(absl::StrCat(
            who(), ": sample index ", v, " at index ", k, " is outside [0, ", shape[0], ")"));
      }
      (*pos)[k] = v;
    }
    return absl::OkStatus();
  }

 private:
  const FeatureAttrs attrs_;
  const bool ragged_;
};

}  // namespace

std::unique_ptr<InputMapper> InputMapper::IntegerBatch(std::string op) {
  return std::make_unique<IntegerBatchMapper>(std::move(op));
}
std::unique_ptr<InputMapper> InputMapper::SparseBatch(std::string op,
                                                      std::vector<Combiner> combiners) {
  return std::make_unique<SparseBatchMapper>(std::move(op), std::move(combiners));
}
std::unique_ptr<InputMapper> InputMapper::ArbitraryTensorBatch(std::string op,
                                                               std::vector<Combiner> combiners) {
  return std::make_unique<ArbitraryTensorMapper>(std::move(op), std::move(combiners));
}
std::unique_ptr<InputMapper> InputMapper::FeatureBatch(std::string op,
                                                       std::vector<Combiner> combiners,
                                                       FeatureAttrs attrs, bool ragged) {
  return std::make_unique<FeatureBatchMapper>(std::move(op), std::move(combiners),
                                              std::move(attrs), ragged);
}

}  // namespace tf_tpu_emb
