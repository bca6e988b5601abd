// The input mappers of the positional formats (IntegerBatch, SparseBatch,
// ArbitraryTensorBatch: input i feeds output i), over engine/mapper_base.h;
// the feature-oriented SparseTensor/RaggedTensorBatch mapper is in
// engine/feature_batch_mapper.cc, the hosts' mapper of routed batches in
// engine/routed_mapper.cc.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "engine/input_mappers.h"
#include "engine/mapper_base.h"

namespace tf_tpu_emb {
namespace {

using mapping::ArbitraryPositions;
using mapping::CheckPositionalCount;
using mapping::Describe;
using mapping::IntView;
using mapping::MapperBase;
using mapping::Who;
using ::tensorflow::Tensor;

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
        return absl::InvalidArgumentError(absl::StrCat(Describe(op_, e, i, i),
                                                       ": expected one id per output row (",
                                                       positions, "), got ", s.ids->NumElements()));
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
        return absl::InvalidArgumentError(
            absl::StrCat(who(), ": sample_indices has ", idx.NumElements(),
                         " elements but there are ", count, " embedding ids"));
      }
      pos->resize(count);
      const IntView iv(idx);
      for (int64_t k = 0; k < count; ++k) {
        const int64_t p = iv[k];
        if (p < 0 || p >= rows) {
          return absl::InvalidArgumentError(absl::StrCat(who(), ": sample index ", p, " at index ",
                                                         k, " is outside [0, ", rows,
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

}  // namespace tf_tpu_emb
