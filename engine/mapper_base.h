// The machinery the input mappers share (engine-internal; included by the
// mappers, engine/{positional,feature_batch,routed}_mapper(s).cc, and the
// worker's router, engine/routing.cc): element views of id/weight tensors,
// the error-message helpers (engine/mapper_base.cc), and MapperBase --
// combiners per input, positional inputs, the id check and the CSR assembly,
// so that a mapper only says where each input element goes (MapFeatures).
#ifndef TF_TPU_EMB_ENGINE_MAPPER_BASE_H_
#define TF_TPU_EMB_ENGINE_MAPPER_BASE_H_

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/exceptions.h"
#include "engine/input_mappers.h"
#include "tsl/platform/threadpool.h"  // every TF 2.16-2.21 ships this path

namespace tf_tpu_emb {
namespace mapping {

using ::tensorflow::DT_DOUBLE;
using ::tensorflow::DT_INT64;
using ::tensorflow::Tensor;

// Element access to an int32/int64 (IntView) or float32/float64 (FloatView)
// tensor through a raw pointer: built once per tensor, cheap per element.
class IntView {
 public:
  explicit IntView(const Tensor& t)
      : data_(t.tensor_data().data()),
        is64_(t.dtype() == DT_INT64),
        cols_(t.dims() == 2 ? t.dim_size(1) : 1) {}
  int64_t operator[](int64_t i) const {
    return is64_ ? static_cast<const int64_t*>(data_)[i] : static_cast<const int32_t*>(data_)[i];
  }
  // Element (row, col) of a rank-2 tensor.
  int64_t operator()(int64_t row, int64_t col) const { return (*this)[row * cols_ + col]; }

 private:
  const void* data_;
  bool is64_;
  int64_t cols_;
};

// Calls fn(const int32_t*) or fn(const int64_t*) with the data of an
// int32/int64 tensor: a loop written once, compiled per element type (the
// enqueue's per-id passes vectorise; IntView decides the type per element).
template <typename Fn>
auto WithInts(const Tensor& t, Fn fn) {
  const char* data = t.tensor_data().data();
  return t.dtype() == DT_INT64 ? fn(reinterpret_cast<const int64_t*>(data))
                               : fn(reinterpret_cast<const int32_t*>(data));
}

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

// "input 2 (feature 'watched', table 'video')": the input an error is about.
std::string Describe(const std::string& op, const Engine& e, int input, int output);
// Inputs are positional: input i feeds output i (a table in table mode, a
// feature descriptor otherwise).
absl::Status CheckPositionalCount(const std::string& op, int n, const Engine& e);
// Weights are empty or one per id.
absl::Status CheckWeights(Who who, const Tensor& ids, const Tensor& weights);
// Row splits start at 0, end at n and do not decrease.
absl::Status CheckSplits(Who who, const Tensor& splits, int64_t n);
// Positions of a feature whose output has `shape` (bags laid out
// row-major), for COO indices, row splits or dense ids (see README).
absl::Status ArbitraryPositions(Who who, const std::vector<int64_t>& shape, const Tensor& splits,
                                const Tensor& ids, std::vector<int64_t>* pos);

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
      return absl::InvalidArgumentError(
          absl::StrCat(op_, ": ", k, " combiners given; expected 0, one per input (", n,
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
      // The rows this engine holds (a host's shard: routed local ids).
      const int64_t vocab = e.table(e.outputs()[s.output].table).vocabulary_size;
      const int64_t n = s.ids->NumElements();
      // One branch-free pass (it vectorises); the first bad id only on failure.
      const bool all_in_range = WithInts(*s.ids, [&](const auto* ids) {
        bool ok = true;
        for (int64_t k = 0; k < n; ++k) {
          ok &= static_cast<uint64_t>(int64_t{ids[k]}) < static_cast<uint64_t>(vocab);
        }
        return ok;
      });
      if (!all_in_range) {
        const IntView ids(*s.ids);
        for (int64_t k = 0; k < n; ++k) {
          const int64_t id = ids[k];
          if (id < 0 || id >= vocab) {
            return absl::InvalidArgumentError(
                absl::StrCat(Describe(op_, e, i, s.output), ": embedding id ", id, " at index ", k,
                             " is outside the table's vocabulary [0, ", vocab, ")"));
          }
        }
      }
      if (s.weights != nullptr) {
        const FloatView weights(*s.weights);
        for (int64_t k = 0; k < n; ++k) {
          if (!std::isfinite(weights[k])) {
            return absl::InvalidArgumentError(absl::StrCat(Describe(op_, e, i, s.output),
                                                           ": aggregation weight at index ", k,
                                                           " is not finite"));
          }
        }
      }
      return absl::OkStatus();
    });
  }

  // The common case of one source per output whose positions do not
  // decrease and drop nothing (row splits, dense ids, COO indices in
  // row-major order): the CSR keeps the input's order, so the ids and
  // weights are copied as they are and the offsets are where the positions
  // step up.  Returns false (and leaves `ob` for the general path) otherwise.
  static bool AssembleInOrder(const FeatureSource& s, int64_t num_positions, OutputBatch* ob) {
    const std::vector<int64_t>& pos = s.positions;
    const int64_t n = pos.size();
    ob->offsets.resize(num_positions + 1);
    int64_t* offsets = ob->offsets.data();
    int64_t bag = 0;  // offsets[0, bag) are written
    for (int64_t k = 0; k < n; ++k) {
      const int64_t p = pos[k];
      if (p < bag - 1 || p < 0 || p >= num_positions) return false;  // decreasing, dropped
      while (bag <= p) offsets[bag++] = k;
    }
    while (bag <= num_positions) offsets[bag++] = n;
    ob->ids.resize(n);
    WithInts(*s.ids, [&](const auto* ids) {
      for (int64_t k = 0; k < n; ++k) ob->ids[k] = ids[k];
      return 0;
    });
    if (s.weights != nullptr) {
      ob->weights.resize(n);
      const FloatView weights(*s.weights);
      for (int64_t k = 0; k < n; ++k) ob->weights[k] = weights[k];
    }
    return true;
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
      if (feeding[o].size() == 1 &&
          AssembleInOrder(*feeding[o][0], e.outputs()[o].positions, &ob)) {
        return absl::OkStatus();
      }
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

}  // namespace mapping
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_MAPPER_BASE_H_
