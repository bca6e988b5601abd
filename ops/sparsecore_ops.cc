// Op definitions of TF's SparseCore op family (TPUEmbeddingV2's preprocessing
// and lookup ops) under the "TfTpuEmb>" namespace, with
// TF 2.21's inputs, outputs, attrs, defaults, constraints and statefulness
// (tests/sparsecore/test_sparsecore_op_defs.py compares them with TF's
// registry, and the inferred shapes with TF's own shape functions).  The
// semantics are docs/sparsecore_semantics.md.
//
// None of these ops addresses an engine: each is a function of its inputs
// (tables and slots come in as tensors and go out updated), so none carries
// the `engine` attr of tpu_embedding_ops.cc.  The CPU kernels (kernels/
// sparsecore_*.cc) are registered under both names.
//
// TF's shape functions (tensorflow/core/tpu/ops/sparse_core_ops.cc,
// sparse_core_preprocess_ops.cc, tpu_copy_with_dynamic_shape_op.cc) were the
// reference; these are our own, in the few families below.  The families
// that repeat per optimizer (gradient + optimizer, custom-combiner gradient,
// standalone optimizer) come from one table in ops/sparsecore_optimizer_ops.cc.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sparsecore.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_tpu_emb {
namespace {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

#define TTE_PREFIX "TfTpuEmb>"
#define TTE_OP(name) REGISTER_OP(TTE_PREFIX name)

absl::Status RankOneInputs(InferenceContext* c, int begin, int end) {
  ShapeHandle unused;
  for (int i = begin; i < end; ++i) TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
  return absl::OkStatus();
}

// Every output a vector of unknown length (the COO tensors: their length is
// the number of ids after deduplication).
absl::Status UnknownVectorsShapeFn(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->UnknownShapeOfRank(1));
  return absl::OkStatus();
}

absl::Status ScalarsShapeFn(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->Scalar());
  return absl::OkStatus();
}

absl::Status FeatureListAttrsShapeFn(InferenceContext* c) {
  std::vector<int32_t> sample_counts, col_offsets;
  int32_t n;
  TF_RETURN_IF_ERROR(c->GetAttr("sample_count_list", &sample_counts));
  TF_RETURN_IF_ERROR(c->GetAttr("col_offset_list", &col_offsets));
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  if (static_cast<int32_t>(sample_counts.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample_count_list must have the same size as number of feature inputs, but got ",
        sample_counts.size(), " vs ", n));
  }
  if (static_cast<int32_t>(col_offsets.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "col_offset_list must have the same size as number of feature inputs, but got ",
        col_offsets.size(), " vs ", n));
  }
  return UnknownVectorsShapeFn(c);
}

// sorted_row_ids, sorted_col_ids, sorted_gains: vectors; splits: scalar;
// id_counts: a vector; max_ids, max_uniques: scalars.
absl::Status MinibatchSplitsShapeFn(InferenceContext* c) {
  for (int i : {0, 1, 2, 4}) c->set_output(i, c->UnknownShapeOfRank(1));
  for (int i : {3, 5, 6}) c->set_output(i, c->Scalar());
  return absl::OkStatus();
}

// The padded CSR wrapped COO buffers (semantics "CSR buffers"): row_pointers
// of max_minibatches_per_sc * num_sc_per_chip * RoundUp(num_replica *
// num_sc_per_chip, 8) entries, three id buffers of max_ids_per_chip entries,
// three scalars.  `per_sc`: ConvertToSparseCoreCsrWrappedCooTensor's
// sample_count_per_sc (max_ids_per_chip = per sample * sample_count_per_sc *
// num_sc_per_chip); else GetMinibatchesInCsrWithPhysicalReplica's
// sample_count (per sample * sample_count), whose inputs are all vectors.
template <bool per_sc>
absl::Status CsrBuffersShapeFn(InferenceContext* c) {
  if (!per_sc) TF_RETURN_IF_ERROR(RankOneInputs(c, 0, c->num_inputs()));
  int32_t max_minibatches_per_sc, num_replica, sample_count, per_sample, num_sc;
  TF_RETURN_IF_ERROR(c->GetAttr("max_minibatches_per_sc", &max_minibatches_per_sc));
  TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &num_replica));
  TF_RETURN_IF_ERROR(c->GetAttr(per_sc ? "sample_count_per_sc" : "sample_count", &sample_count));
  TF_RETURN_IF_ERROR(c->GetAttr("max_ids_per_chip_per_sample", &per_sample));
  TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &num_sc));
  const sparsecore::CsrBufferSizes sizes = sparsecore::CsrBufferSizesFor(
      num_replica, num_sc, max_minibatches_per_sc,
      sparsecore::MaxIdsPerChip(per_sample, sample_count, per_sc ? num_sc : 1));
  c->set_output(0, c->MakeShape({sizes.row_pointers}));
  for (int i = 1; i < 4; ++i) c->set_output(i, c->MakeShape({sizes.ids}));
  for (int i = 4; i < 7; ++i) c->set_output(i, c->Scalar());
  return absl::OkStatus();
}

// The lookups' common part: inputs [0, ids_end) vectors, those from
// `ids_begin` of one length (the ids and gains), a matrix table at
// `table`; the activations [input_size, feature_width].
absl::Status LookupShape(InferenceContext* c, int ids_begin, int ids_end, int table,
                         ShapeHandle* activations) {
  int input_size;
  TF_RETURN_IF_ERROR(c->GetAttr("input_size", &input_size));
  ShapeHandle unused, merged;
  TF_RETURN_IF_ERROR(RankOneInputs(c, 0, ids_end));
  for (int i = ids_begin + 1; i < ids_end; ++i) {
    TF_RETURN_IF_ERROR(c->Merge(c->input(i), c->input(ids_begin), &merged));
  }
  TF_RETURN_IF_ERROR(c->WithRank(c->input(table), 2, &unused));
  return c->ReplaceDim(c->input(table), 0, c->MakeDim(input_size), activations);
}

// XlaSparseDenseMatmul: three id vectors of one length, a scalar offsets, a
// matrix table; activations and four vectors (the CSR form).
absl::Status CooMatmulShapeFn(InferenceContext* c) {
  ShapeHandle unused, activations;
  TF_RETURN_IF_ERROR(LookupShape(c, 0, 3, 4, &activations));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &unused));
  c->set_output(0, activations);
  for (int i = 1; i < 5; ++i) c->set_output(i, c->UnknownShapeOfRank(1));
  return absl::OkStatus();
}

// The CSR lookups: four vectors (the ids, gains of one length), a matrix
// table, a scalar minibatch count; activations [input_size, feature_width].
absl::Status CsrMatmulShapeFn(InferenceContext* c) {
  ShapeHandle unused, activations;
  TF_RETURN_IF_ERROR(LookupShape(c, 1, 4, 4, &activations));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 0, &unused));
  c->set_output(0, activations);
  return absl::OkStatus();
}

// XlaSparseDenseMatmulCustomCombinerOnTcWithCsrInput: as the CSR lookup with
// one more id vector (sorted_pos_ids), plus the preserved valencies
// [input_size] and vectors [input_size, max_valency, feature_width].
absl::Status CustomCombinerMatmulShapeFn(InferenceContext* c) {
  int input_size, max_valency, num_weights;
  TF_RETURN_IF_ERROR(c->GetAttr("input_size", &input_size));
  TF_RETURN_IF_ERROR(c->GetAttr("max_valency", &max_valency));
  TF_RETURN_IF_ERROR(c->GetAttr("num_weights", &num_weights));
  ShapeHandle unused, activations;
  TF_RETURN_IF_ERROR(LookupShape(c, 1, 5, 5, &activations));
  if (num_weights > 0) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(6), 1, &unused));
    DimensionHandle dim;
    TF_RETURN_IF_ERROR(c->WithValue(c->Dim(c->input(6), 0), num_weights, &dim));
  }
  c->set_output(0, activations);
  c->set_output(1, c->MakeShape({input_size}));
  c->set_output(2, c->MakeShape(
                       {c->MakeDim(input_size), c->MakeDim(max_valency), c->Dim(c->input(5), 1)}));
  return absl::OkStatus();
}

// TPUCopyWithDynamicShape / TPUAnnotateTensorsWithDynamicShape: each tensor
// keeps its shape (the trailing N unpadded sizes have no output).
absl::Status DynamicShapeCopyShapeFn(InferenceContext* c) {
  int n = 0;
  if (c->GetAttr("N", &n).ok() == false) n = 0;
  for (int i = 0; i < c->num_inputs() - n; ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

using ::tensorflow::shape_inference::NoOutputs;

TTE_OP("ConvertToCooTensor")
    .Input("indices_or_row_splits: int32")
    .Input("values: int32")
    .Input("weights: float32")
    .Output("row_ids: int32")
    .Output("col_ids: int32")
    .Output("gains: float32")
    .Attr("sample_count: int >= 1")
    .Attr("combiner: string")
    .SetIsStateful()
    .SetShapeFn(UnknownVectorsShapeFn);

TTE_OP("ConvertToListOfSparseCoreCooTensors")
    .Input("indices_or_row_splits: int32")
    .Input("values: int32")
    .Input("weights: float32")
    .Output("row_ids_list: num_sc_per_chip * int32")
    .Output("col_ids_list: num_sc_per_chip * int32")
    .Output("gains_list: num_sc_per_chip * float32")
    .Attr("sample_count: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("row_offset: int >= 0")
    .Attr("col_offset: int >= 0")
    .Attr("col_shift: int >= 0")
    .Attr("num_sc_shards: int >= 1")
    .Attr("stacked_table_sample_count: int >= 1")
    .Attr("combiner: string")
    .SetShapeFn(UnknownVectorsShapeFn);

TTE_OP("ConvertToSparseCoreCsrWrappedCooTensor")
    .Input("sorted_row_ids_list: num_sc_per_chip * int32")
    .Input("sorted_col_ids_list: num_sc_per_chip * int32")
    .Input("sorted_gains_list: num_sc_per_chip * float32")
    .Input("id_counts_list: num_sc_per_chip * int32")
    .Input("splits: int64")
    .Output("row_pointers: int32")
    .Output("sorted_sample_ids: int32")
    .Output("sorted_token_ids: int32")
    .Output("sorted_gains: float32")
    .Output("row_pointers_unpadded_size: int32")
    .Output("ids_unpadded_size: int32")
    .Output("num_minibatches_per_sc: int32")
    .Attr("sample_count_per_sc: int >= 1")
    .Attr("num_replica: int >= 1")
    .Attr("max_minibatches_per_sc: int >= 1")
    .Attr("max_ids_per_chip_per_sample: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("table_name: string")
    .Attr("allow_id_dropping: bool")
    .SetShapeFn(CsrBuffersShapeFn<true>);

TTE_OP("GetMinibatchSplitsWithPhysicalReplica")
    .Input("program_key: string")
    .Input("row_ids: int32")
    .Input("col_ids: int32")
    .Input("gains: float32")
    .Output("sorted_row_ids: int32")
    .Output("sorted_col_ids: int32")
    .Output("sorted_gains: float32")
    .Output("splits: int64")
    .Output("id_counts: int32")
    .Output("max_ids: int32")
    .Output("max_uniques: int32")
    .Attr("sample_count: int >= 1")
    .Attr("num_replica: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("table_name: string")
    .Attr("mini_batch_splits: string")
    .SetIsStateful()
    .SetShapeFn(MinibatchSplitsShapeFn);

TTE_OP("GetMinibatchesInCsrWithPhysicalReplica")
    .Input("program_key: string")
    .Input("row_ids: int32")
    .Input("col_ids: int32")
    .Input("gains: float32")
    .Input("splits: int64")
    .Input("id_counts: int32")
    .Output("row_pointers: int32")
    .Output("sorted_sample_ids: int32")
    .Output("sorted_token_ids: int32")
    .Output("sorted_gains: float32")
    .Output("row_pointers_unpadded_size: int32")
    .Output("ids_unpadded_size: int32")
    .Output("num_minibatches_per_physical_sparse_core: int32")
    .Attr("sample_count: int >= 1")
    .Attr("num_replica: int >= 1")
    .Attr("max_minibatches_per_sc: int >= 1")
    .Attr("max_ids_per_chip_per_sample: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("table_name: string")
    .Attr("mini_batch_in_csr: string")
    .SetIsStateful()
    .SetShapeFn(CsrBuffersShapeFn<false>);

TTE_OP("GetStatsFromListOfSparseCoreCooTensors")
    .Input("row_ids_list: N * int32")
    .Input("col_ids_list: N * int32")
    .Input("gains_list: N * float32")
    .Output("max_ids_per_sparse_core: int32")
    .Output("max_unique_ids_per_sparse_core: int32")
    .Attr("sample_count_list: list(int)")
    .Attr("col_offset_list: list(int)")
    .Attr("num_replica: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("table_name: string")
    .Attr("N: int >= 1")
    .SetShapeFn(ScalarsShapeFn);

TTE_OP("GlobalIterId").Output("iter_id: int64").SetIsStateful().SetShapeFn(ScalarsShapeFn);

TTE_OP("SortListOfSparseCoreCooTensors")
    .Input("row_ids_list: N * int32")
    .Input("col_ids_list: N * int32")
    .Input("gains_list: N * float32")
    .Output("sorted_row_ids: int32")
    .Output("sorted_col_ids: int32")
    .Output("sorted_gains: float32")
    .Output("id_counts: int32")
    .Attr("sample_count_list: list(int)")
    .Attr("col_offset_list: list(int)")
    .Attr("num_replica: int >= 1")
    .Attr("table_vocab_size: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("max_ids_per_sparse_core: int >= 1")
    .Attr("max_unique_ids_per_sparse_core: int >= 1")
    .Attr("table_name: string")
    .Attr("N: int >= 1")
    .SetShapeFn(FeatureListAttrsShapeFn);

TTE_OP("StoreMinibatchStatisticsInFdo")
    .Input("program_key: string")
    .Input("max_ids: int32")
    .Input("max_uniques: int32")
    .Attr("sample_count: int >= 1")
    .Attr("num_replica: int >= 1")
    .Attr("feature_width: int >= 1")
    .Attr("num_sc_per_chip: int >= 1")
    .Attr("table_name: string")
    .Attr("mini_batch_splits: string")
    .SetIsStateful()
    .SetShapeFn(NoOutputs);

TTE_OP("TPUAnnotateTensorsWithDynamicShape")
    .Input("tensors: T")
    .Output("tpu_tensors: T")
    .Attr("T: list(type) >= 1")
    .SetIsStateful()
    .SetShapeFn(DynamicShapeCopyShapeFn);

TTE_OP("TPUCopyWithDynamicShape")
    .Input("tensors: T")
    .Input("unpadded_sizes: N * int32")
    .Output("tpu_tensors: T")
    .Attr("N: int >= 0")
    .Attr("T: list(type) >= 1")
    .SetIsStateful()
    .SetShapeFn(DynamicShapeCopyShapeFn);

TTE_OP("XlaSparseDenseMatmul")
    .Input("row_ids: int32")
    .Input("col_ids: uint32")
    .Input("values: float32")
    .Input("offsets: uint32")
    .Input("embedding_table: float32")
    .Output("activations: float32")
    .Output("row_pointers: int32")
    .Output("sorted_embedding_ids: int32")
    .Output("sorted_sample_ids: int32")
    .Output("sorted_gains: float32")
    .Attr("max_ids_per_partition: int >= 0")
    .Attr("max_unique_ids_per_partition: int >= 0")
    .Attr("input_size: int >= 0")
    .SetShapeFn(CooMatmulShapeFn);

TTE_OP("XlaSparseDenseMatmulCustomCombinerOnTcWithCsrInput")
    .Input("row_pointers: int32")
    .Input("sorted_sample_ids: int32")
    .Input("sorted_token_ids: int32")
    .Input("sorted_pos_ids: int32")
    .Input("sorted_gains: float32")
    .Input("embedding_table: float32")
    .Input("weights: float32")
    .Output("activations: float32")
    .Output("preserved_valencies: int32")
    .Output("preserved_vectors: float32")
    .Attr("input_size: int >= 0")
    .Attr("max_valency: int >= 0")
    .Attr("num_weights: int >= 0")
    .Attr("combiner_computation: func")
    .Attr("quantization_config_low: float")
    .Attr("quantization_config_high: float")
    .Attr("quantization_config_num_buckets: int >= 0")
    .Attr("table_name: string")
    .Attr("num_sparsecores_per_device: int = -1")
    .SetShapeFn(CustomCombinerMatmulShapeFn);

TTE_OP("XlaSparseDenseMatmulWithCsrInput")
    .Input("row_pointers: int32")
    .Input("sorted_sample_ids: int32")
    .Input("sorted_token_ids: int32")
    .Input("sorted_gains: float32")
    .Input("embedding_table: T")
    .Input("num_minibatches_per_physical_sparse_core: int32")
    .Output("activations: T")
    .Attr("input_size: int >= 0")
    .Attr("quantization_config_low: float")
    .Attr("quantization_config_high: float")
    .Attr("quantization_config_num_buckets: int >= 0")
    .Attr("table_name: string")
    .Attr("num_sparsecores_per_device: int = -1")
    .Attr("T: {int32, float32} = DT_FLOAT")
    .SetShapeFn(CsrMatmulShapeFn);

TTE_OP("XlaSparseDenseMatmulWithStaticBufferSize")
    .Input("row_pointers: int32")
    .Input("sorted_sample_ids: int32")
    .Input("sorted_token_ids: int32")
    .Input("sorted_gains: float32")
    .Input("embedding_table: float32")
    .Input("num_minibatches_per_physical_sparse_core: int32")
    .Output("activations: float32")
    .Attr("input_size: int >= 0")
    .Attr("quantization_config_low: float")
    .Attr("quantization_config_high: float")
    .Attr("quantization_config_num_buckets: int >= 0")
    .Attr("max_ids_per_sparse_core: int >= 1")
    .Attr("max_unique_ids_per_sparse_core: int >= 1")
    .Attr("table_name: string")
    .Attr("num_sparsecores_per_device: int = -1")
    .SetShapeFn(CsrMatmulShapeFn);

}  // namespace
}  // namespace tf_tpu_emb
