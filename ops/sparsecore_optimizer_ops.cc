// The SparseCore op families that repeat per optimizer, registered from the
// optimizer source (tf_tpu_emb/optimizer_specs.py's SPARSECORE_OPTIMIZERS,
// generated into core/sparsecore_optimizers.gen.h: each optimizer's slots and
// hyper-parameters), as ops/tpu_embedding_ops.cc registers the per-table
// Load/Retrieve ops from the optimizer table:
//   XlaSparseDenseMatmulGradWith<Opt>And{CsrInput,StaticBufferSize} (and
//   ours, their "...InPlace" forms on resource variables),
//   XlaSparseDenseMatmulCustomCombinerOnTcGradWith<Opt>AndCsrInput,
//   XlaSparseCore<Opt>,
// and their user-function siblings (XlaSparseDenseMatmulGradWithCsrInput,
// XlaSparseDenseMatmulCustomCombinerOnTcGradWithCsrInput), which share their
// inputs.  Under "TfTpuEmb>", with TF 2.21's inputs, outputs, attrs (in TF's
// order), defaults and shape functions: tests/sparsecore/
// test_sparsecore_op_defs.py compares every one with TF's registry.  The
// semantics: docs/sparsecore_semantics.md §6-§8.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sparsecore_optimizers.gen.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_tpu_emb {
namespace {

using ::tensorflow::register_op::OpDefBuilderWrapper;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

constexpr char kPrefix[] = "TfTpuEmb>";

// One SparseCore optimizer's op-definition parts, generated from
// tf_tpu_emb/optimizer_specs.py (core/sparsecore_optimizers.gen.h).
using SparseCoreOptimizerDef = sc_opt::OpDef;

// ------------------------------------------------------------ shape functions

// Output k has the shape of input inputs[k] (the updated tables and slots).
::tensorflow::OpShapeInferenceFn OutputsAsInputs(std::vector<int> inputs) {
  return [inputs](InferenceContext* c) {
    for (size_t k = 0; k < inputs.size(); ++k) c->set_output(k, c->input(inputs[k]));
    return absl::OkStatus();
  };
}

// The user-optimizer gradient: the N updated tables as tables[0] (input 5).
absl::Status GradWithCsrInputShapeFn(InferenceContext* c) {
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  for (int i = 0; i < n; ++i) c->set_output(i, c->input(5));
  return absl::OkStatus();
}

// The custom-combiner gradients: weights and preserved weights [num_weights]
// (when num_weights > 0), preserved valencies [batch] and vectors [batch,
// max_valency, feature_width] with batch from the activation gradients;
// every updated table (embedding and slots) as the first table (input
// `tables_index`), then the updated weights [num_weights].  `num_tables` 0:
// the attr N.
::tensorflow::OpShapeInferenceFn CustomCombinerGradShapeFn(int tables_index, int num_tables) {
  return [tables_index, num_tables](InferenceContext* c) -> absl::Status {
    int n = num_tables;
    if (n == 0) TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
    int num_weights, max_valency;
    TF_RETURN_IF_ERROR(c->GetAttr("num_weights", &num_weights));
    TF_RETURN_IF_ERROR(c->GetAttr("max_valency", &max_valency));
    // TF's function reads dimension 0 of the activation gradients and 1 of
    // the first table unchecked (a scalar there crashes it); ours asks for them.
    ShapeHandle merged, unused;
    TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(9), 1, &unused));
    TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(tables_index), 2, &unused));
    if (num_weights > 0) {
      TF_RETURN_IF_ERROR(c->Merge(c->input(5), c->MakeShape({num_weights}), &merged));
      TF_RETURN_IF_ERROR(c->Merge(c->input(8), c->MakeShape({num_weights}), &merged));
    }
    const DimensionHandle batch = c->Dim(c->input(9), 0);
    TF_RETURN_IF_ERROR(c->Merge(c->input(6), c->MakeShape({batch}), &merged));
    TF_RETURN_IF_ERROR(
        c->Merge(c->input(7),
                 c->MakeShape({batch, c->MakeDim(max_valency), c->Dim(c->input(tables_index), 1)}),
                 &merged));
    for (int i = 0; i < n; ++i) c->set_output(i, c->input(tables_index));
    c->set_output(n, c->MakeShape({num_weights}));
    return absl::OkStatus();
  };
}

// ------------------------------------------------------------ the families

void AddCsrBufferInputs(OpDefBuilderWrapper& op, bool pos_ids) {
  op.Input("row_pointers: int32")
      .Input("sorted_sample_ids: int32")
      .Input("sorted_token_ids: int32");
  if (pos_ids) op.Input("sorted_pos_ids: int32");
  op.Input("sorted_gains: float32");
}

// Inputs 0-9 of the custom-combiner gradients.
void AddCombinerGradInputs(OpDefBuilderWrapper& op) {
  AddCsrBufferInputs(op, /*pos_ids=*/true);
  op.Input("weights: float32")
      .Input("preserved_valencies: int32")
      .Input("preserved_vectors: float32")
      .Input("preserved_weights: float32")
      .Input("activation_gradients: float32");
}

void AddCombinerGradAttrs(OpDefBuilderWrapper& op) {
  op.Attr("max_valency: int >= 0")
      .Attr("num_weights: int >= 0")
      .Attr("combiner_table_vjp_computation: func")
      .Attr("combiner_weights_vjp_computation: func");
}

// "embedding_table" and the slots, as inputs and as "updated_" outputs.
void AddTables(OpDefBuilderWrapper& op, const SparseCoreOptimizerDef& o) {
  std::vector<std::string> tables = {"embedding_table"};
  tables.insert(tables.end(), o.slots.begin(), o.slots.end());
  for (const std::string& t : tables) op.Input(t + ": float32");
  for (const std::string& t : tables) op.Output("updated_" + t + ": float32");
}

void AddHyperAndClipAttrs(OpDefBuilderWrapper& op, const SparseCoreOptimizerDef& o) {
  for (const char* a : o.grad_attrs) op.Attr(a);
  op.Attr("clip_weight_min: float = -inf").Attr("clip_weight_max: float = inf");
}

void AddTableAttrs(OpDefBuilderWrapper& op) {
  op.Attr("table_name: string").Attr("num_sparsecores_per_device: int = -1");
}

std::vector<int> Range(int begin, int count) {
  std::vector<int> out(count);
  for (int i = 0; i < count; ++i) out[i] = begin + i;
  return out;
}

// XlaSparseDenseMatmulGradWith<Opt>And{CsrInput,StaticBufferSize}, and (ours,
// `in_place`) its in-place form "...InPlace": the same inputs and attrs but
// the table and its slots as resource variables, updated where they are,
// and no outputs -- what a TPU's compiler makes of TF's read -> op ->
// assign by aliasing the table's buffer (the stand-in's seam in
// tf_tpu_emb/tpu/embedding_v2.py; docs/sparsecore_semantics.md §10).
void RegisterGradOp(const SparseCoreOptimizerDef& o, bool static_buffer, bool in_place) {
  OpDefBuilderWrapper op(absl::StrCat(kPrefix, "XlaSparseDenseMatmulGradWith", o.name, "And",
                                      static_buffer ? "StaticBufferSize" : "CsrInput",
                                      in_place ? "InPlace" : "")
                             .c_str());
  AddCsrBufferInputs(op, /*pos_ids=*/false);
  op.Input("activation_gradients: float32").Input("learning_rate: float32");
  if (in_place) {
    op.Input("embedding_table: resource");
    for (const char* slot : o.slots) op.Input(absl::StrCat(slot, ": resource"));
    op.SetIsStateful();
  } else {
    AddTables(op, o);
  }
  op.Input("num_minibatches_per_physical_sparse_core: int32");
  AddHyperAndClipAttrs(op, o);
  if (static_buffer) {
    op.Attr("max_ids_per_sparse_core: int >= 1").Attr("max_unique_ids_per_sparse_core: int >= 1");
  }
  AddTableAttrs(op);
  if (in_place) {
    op.SetShapeFn(::tensorflow::shape_inference::NoOutputs);
  } else {
    op.SetShapeFn(OutputsAsInputs(Range(6, 1 + o.slots.size())));
  }
  op();
}

// XlaSparseDenseMatmulCustomCombinerOnTcGradWith<Opt>AndCsrInput.
void RegisterCombinerGradOp(const SparseCoreOptimizerDef& o) {
  OpDefBuilderWrapper op(
      absl::StrCat(kPrefix, "XlaSparseDenseMatmulCustomCombinerOnTcGradWith", o.name, "AndCsrInput")
          .c_str());
  AddCombinerGradInputs(op);
  op.Input("learning_rate: float32").Input("combiner_weights_learning_rate: float32");
  AddTables(op, o);
  op.Output("updated_weights: float32");
  AddHyperAndClipAttrs(op, o);
  AddCombinerGradAttrs(op);
  AddTableAttrs(op);
  op.SetShapeFn(CustomCombinerGradShapeFn(12, 1 + o.slots.size()));
  op();
}

// XlaSparseCore<Opt>.
void RegisterStandaloneOp(const SparseCoreOptimizerDef& o) {
  OpDefBuilderWrapper op(absl::StrCat(kPrefix, "XlaSparseCore", o.name).c_str());
  for (const char* in : o.standalone_inputs) {
    op.Input(absl::StrCat(in, std::string(in) == "indices" ? ": int32" : ": float32"));
  }
  std::vector<int> shapes;
  for (const char* out : o.standalone_outputs) {
    op.Output(absl::StrCat("updated_", out, ": float32"));
    for (size_t i = 0; i < o.standalone_inputs.size(); ++i) {
      if (std::string(out) == o.standalone_inputs[i]) shapes.push_back(static_cast<int>(i));
    }
  }
  for (const char* a : o.standalone_attrs) op.Attr(a);
  op.SetIsStateful().SetShapeFn(OutputsAsInputs(shapes));
  op();
}

// The two user-optimizer gradients (custom_computation /
// optimizer_custom_computation: the optimizer is a function).
void RegisterUserOptimizerOps() {
  OpDefBuilderWrapper grad(absl::StrCat(kPrefix, "XlaSparseDenseMatmulGradWithCsrInput").c_str());
  AddCsrBufferInputs(grad, /*pos_ids=*/false);
  grad.Input("activation_gradients: float32")
      .Input("tables: N * T")
      .Input("hyperparameters: M * float32")
      .Input("num_minibatches_per_physical_sparse_core: int32")
      .Output("updated_tables: N * T")
      .Attr("N: int >= 1")
      .Attr("M: int >= 1")
      .Attr("custom_computation: func");
  AddTableAttrs(grad);
  grad.Attr("T: {int32, float32} = DT_FLOAT").SetShapeFn(GradWithCsrInputShapeFn);
  grad();

  OpDefBuilderWrapper combiner(
      absl::StrCat(kPrefix, "XlaSparseDenseMatmulCustomCombinerOnTcGradWithCsrInput").c_str());
  AddCombinerGradInputs(combiner);
  combiner.Input("tables: N * float32")
      .Input("hyperparameters: M * float32")
      .Input("combiner_weights_learning_rate: float32")
      .Output("updated_tables: N * float32")
      .Output("updated_weights: float32")
      .Attr("N: int >= 1")
      .Attr("M: int >= 1");
  AddCombinerGradAttrs(combiner);
  combiner.Attr("optimizer_custom_computation: func");
  AddTableAttrs(combiner);
  combiner.SetShapeFn(CustomCombinerGradShapeFn(10, 0));
  combiner();
}

bool RegisterOptimizerOps() {
  for (const SparseCoreOptimizerDef& o : sc_opt::OpDefs()) {
    for (bool static_buffer : {false, true}) {
      for (bool in_place : {false, true}) RegisterGradOp(o, static_buffer, in_place);
    }
    RegisterCombinerGradOp(o);
    RegisterStandaloneOp(o);
  }
  RegisterUserOptimizerOps();
  return true;
}

[[maybe_unused]] const bool kOptimizerOpsRegistered = RegisterOptimizerOps();

}  // namespace
}  // namespace tf_tpu_emb
