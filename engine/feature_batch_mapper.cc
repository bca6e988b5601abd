// The feature-oriented input mapper: EnqueueTPUEmbeddingSparseTensorBatch
// and (Dynamic)EnqueueTPUEmbeddingRaggedTensorBatch, in feature-descriptor
// mode (input i is feature i) and in table mode (the features of a table fill
// its num_features rows per sample, sequence features one row per position).
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
using mapping::CheckSplits;
using mapping::CheckWeights;
using mapping::Describe;
using mapping::IntView;
using mapping::MapperBase;
using mapping::Who;
using ::tensorflow::Tensor;

// ------------------------------------------ SparseTensor / RaggedTensorBatch

class FeatureBatchMapper : public MapperBase {
 public:
  FeatureBatchMapper(std::string op, std::vector<Combiner> combiners, FeatureAttrs attrs,
                     bool ragged)
      : MapperBase(std::move(op), std::move(combiners)),
        attrs_(std::move(attrs)),
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
      return absl::InvalidArgumentError(absl::StrCat(op_, ": table_ids has ",
                                                     attrs_.table_ids.size(),
                                                     " entries but there are ", n, " inputs"));
    }
    for (const auto* list : {&max_sequence_lengths, &num_features}) {
      if (!list->empty() && static_cast<int>(list->size()) != n) {
        return absl::InvalidArgumentError(
            absl::StrCat(op_,
                         ": max_sequence_lengths and num_features must be empty or have one "
                         "entry per input (",
                         n, "), got ", list->size()));
      }
    }
    std::vector<int> tables(attrs_.table_ids.begin(), attrs_.table_ids.end());
    for (int i = 0; i < n; ++i) {
      if (tables[i] < 0 || tables[i] >= e.num_tables()) {
        return absl::InvalidArgumentError(absl::StrCat(op_, ": table_ids[", i, "] = ", tables[i],
                                                       " is not a table id in [0, ", e.num_tables(),
                                                       ")"));
      }
    }
    std::vector<Combiner> combiners;
    TF_RETURN_IF_ERROR(InputCombiners(e, n, tables, /*inputs_first=*/true, &combiners));
    sources->resize(n);
    if (!e.table_mode()) {
      TF_RETURN_IF_ERROR(CheckPositionalCount(op_, n, e));
      for (int i = 0; i < n; ++i) {
        if (tables[i] != e.outputs()[i].table) {
          return absl::InvalidArgumentError(absl::StrCat(Describe(op_, e, i, i), ": table_ids[", i,
                                                         "] = ", tables[i],
                                                         " but the config's feature ", i,
                                                         " looks up table ", e.outputs()[i].table));
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
        return absl::InvalidArgumentError(
            absl::StrCat(op_, ": input ", i, " has max_sequence_length ", seq, " and num_features ",
                         nf, "; they must be >= 0 and >= 1"));
      }
      width[i] = seq > 0 ? seq : nf;
      offset[i] = used[tables[i]];
      used[tables[i]] += width[i];
    }
    for (int t = 0; t < e.num_tables(); ++t) {
      (*slot_combiners)[t].assign(e.config().table_descriptor(t).num_features(), Combiner::kSum);
      if (used[t] != 0 && used[t] != e.config().table_descriptor(t).num_features()) {
        return absl::InvalidArgumentError(
            absl::StrCat(op_, ": the inputs of table '", e.config().table_descriptor(t).name(),
                         "' take ", used[t], " rows per sample but the table has num_features ",
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
            return absl::InvalidArgumentError(
                absl::StrCat(who(), ": negative sequence position ", within, " at index ", k));
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
              who(), ": without sample indices there must be ", batch * w_i, " ids, got ", count));
        }
        for (int64_t k = 0; k < count; ++k) place(k, k / w_i, k % w_i);
      } else if (ragged_) {
        if (idx.dims() != 1 || idx.NumElements() - 1 != rows) {
          return absl::InvalidArgumentError(
              absl::StrCat(who(), ": sample_splits must be a vector of ", rows + 1,
                           " row splits, got shape ", idx.shape().DebugString()));
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
          return absl::InvalidArgumentError(
              absl::StrCat(who(), ": sample_indices must be [", count, "] or [", count,
                           ", k] (one row per id), got shape ", idx.shape().DebugString()));
        }
        if (sequence && (!matrix || idx.dim_size(1) < 2)) {
          return absl::InvalidArgumentError(
              absl::StrCat(who(),
                           ": a sequence feature needs [n, 2] sample indices (sample, position), "
                           "got shape ",
                           idx.shape().DebugString()));
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
      return absl::InvalidArgumentError(
          absl::StrCat(who(),
                       ragged_ ? ": sample_splits must have rank 1 (row splits)"
                               : ": sample_indices must have rank 1 or 2",
                       ", got shape ", idx.shape().DebugString()));
    }
    if (ragged_ || idx.dims() == 2 || idx.NumElements() == 0) {
      return ArbitraryPositions(who, shape, idx, ids, pos);
    }
    const int64_t n = ids.NumElements();
    if (shape.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          who(),
          ": rank-1 sample_indices (sp_ids.indices[:, 0]) give only the sample of "
          "each id, but the feature's input_shape has rank ",
          shape.size(), "; pass [n, ", shape.size(), "] or [n, ", shape.size() + 1, "] indices"));
    }
    if (idx.NumElements() != n) {
      return absl::InvalidArgumentError(absl::StrCat(who(), ": sample_indices has ",
                                                     idx.NumElements(), " elements but there are ",
                                                     n, " embedding ids"));
    }
    const IntView iv(idx);
    pos->resize(n);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = iv[k];
      if (v < 0 || v >= shape[0]) {
        return absl::InvalidArgumentError(absl::StrCat(who(), ": sample index ", v, " at index ", k,
                                                       " is outside [0, ", shape[0], ")"));
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

std::unique_ptr<InputMapper> InputMapper::FeatureBatch(std::string op,
                                                       std::vector<Combiner> combiners,
                                                       FeatureAttrs attrs, bool ragged) {
  return std::make_unique<FeatureBatchMapper>(std::move(op), std::move(combiners), std::move(attrs),
                                              ragged);
}

}  // namespace tf_tpu_emb
