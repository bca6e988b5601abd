// Op definitions of tf_tpu_emb: TF's TPU embedding op family under the
// "TfTpuEmb>" namespace, with the same inputs, outputs, attrs, defaults,
// constraints, statefulness and shape functions as TF 2.21's core ops, plus
// one last attr `engine` on the ops that address an engine (kEngineAttr).
//
// TF already registers the bare names; a plugin's REGISTER_OP for those names
// is silently ignored, which is why ours carry a prefix.  The CPU kernels
// (kernels/) are registered under both names.  The ops of the embedding
// hosts (ours, no TF counterpart) are in ops/host_ops.cc.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/optimizers.h"
#include "ops/op_defs.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_tpu_emb {

using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;
using ::tensorflow::shape_inference::UnknownShape;

// The shape functions the hosts' ops (ops/host_ops.cc) share with TF's
// (declared in ops/op_defs.h).
absl::Status RecvShapeFn(InferenceContext* c) {
  std::string bytes;
  TF_RETURN_IF_ERROR(c->GetAttr("config", &bytes));
  TPUEmbeddingConfiguration config;
  TF_RETURN_IF_ERROR(ParseConfig(bytes, &config));
  std::vector<TensorShapeProto> shapes;
  TF_RETURN_IF_ERROR(ComputeOutputShapes(config, &shapes));
  if (c->num_outputs() != static_cast<int>(shapes.size())) {
    return absl::InvalidArgumentError("num outputs != size of output shapes");
  }
  for (int i = 0; i < c->num_outputs(); ++i) {
    ShapeHandle out;
    TF_RETURN_IF_ERROR(c->MakeShapeFromShapeProto(shapes[i], &out));
    c->set_output(i, out);
  }
  return absl::OkStatus();
}

absl::Status CombinersLengthShapeFn(InferenceContext* c) {
  std::vector<std::string> combiners;
  TF_RETURN_IF_ERROR(c->GetAttr("combiners", &combiners));
  int n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  if (!combiners.empty() && static_cast<int>(combiners.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("Invalid length of combiners. Have ",
                                                   combiners.size(), " but expected 0 or ", n));
  }
  return absl::OkStatus();
}

absl::Status TwoScalarsShapeFn(InferenceContext* c) {
  c->set_output(0, c->Scalar());
  c->set_output(1, c->Scalar());
  return absl::OkStatus();
}

namespace {

// ---------------------------------------------------------------- data path

TTE_OP("RecvTPUEmbeddingActivations")
    .Output("outputs: num_outputs * float32")
    .Attr("num_outputs: int >= 1")
    .Attr("config: string")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(RecvShapeFn);

// Ours: fails at once (FailedPrecondition) when a Recv on this device's
// replica would have nothing to wait for -- no batch enqueued for it.  The
// mid-level API runs it before a dequeue() that no enqueue() of the same
// step precedes, so the mistake gets an error instead of a wait.
TTE_OP("AssertTPUEmbeddingEnqueued")
    .Attr("operation: string = 'RecvTPUEmbeddingActivations'")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

TTE_OP("TPUEmbeddingActivations")
    .Input("embedding_variable: float32")
    .Input("sliced_activations: float32")
    .Output("output: float32")
    .Attr("table_id: int >= 0")
    .Attr("lookup_id: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->input(1));
      return absl::OkStatus();
    });

TTE_OP("SendTPUEmbeddingGradients")
    .Input("inputs: N * float32")
    .Input("learning_rates: NN * float32")
    .Attr("N: int >= 1")
    .Attr("NN: int >= 0 = 0")
    .Attr("config: string")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      std::vector<ShapeHandle> rates;
      TF_RETURN_IF_ERROR(c->input("learning_rates", &rates));
      for (const ShapeHandle& rate : rates) {
        ShapeHandle unused;
        TF_RETURN_IF_ERROR(c->WithRank(rate, 0, &unused));
      }
      return absl::OkStatus();
    });

// ------------------------------------------------------------------ enqueue

TTE_OP("EnqueueTPUEmbeddingIntegerBatch")
    .Input("batch: N * int32")
    .Input("mode_override: string")
    .Attr("N: int >= 1")
    .Attr("device_ordinal: int = -1")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(UnknownShape);

TTE_OP("EnqueueTPUEmbeddingSparseBatch")
    .Input("sample_indices: N * T1")
    .Input("embedding_indices: N * T2")
    .Input("aggregation_weights: N * T3")
    .Input("mode_override: string")
    .Attr("T1: {int32,int64} = DT_INT32")
    .Attr("T2: {int32,int64} = DT_INT32")
    .Attr("T3: {float32,float64} = DT_FLOAT")
    .Attr("N: int >= 1")
    .Attr("device_ordinal: int = -1")
    .Attr("combiners: list(string) = []")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(CombinersLengthShapeFn);

using ::tensorflow::register_op::OpDefBuilderWrapper;

// The feature-oriented and arbitrary-tensor enqueue ops come in a static
// (device_ordinal attr) and a Dynamic (device_ordinal int32 input) variant.
void RegisterEnqueueOp(const std::string& name, const char* first_input, bool dynamic,
                       bool has_table_ids) {
  OpDefBuilderWrapper op(name.c_str());
  op.Input(absl::StrCat(first_input, ": N * T1"))
      .Input("embedding_indices: N * T2")
      .Input("aggregation_weights: N * T3")
      .Input("mode_override: string");
  if (dynamic) op.Input("device_ordinal: int32");
  op.Attr("T1: {int32,int64} = DT_INT32")
      .Attr("T2: {int32,int64} = DT_INT32")
      .Attr("T3: {float32,float64} = DT_FLOAT")
      .Attr("N: int >= 1");
  if (!dynamic) op.Attr("device_ordinal: int = -1");
  op.Attr("combiners: list(string) = []");
  if (has_table_ids) {
    op.Attr("table_ids: list(int)")
        .Attr("max_sequence_lengths: list(int) = []")
        .Attr("num_features: list(int) = []");
  }
  op.Attr(kEngineAttr);
  op.SetIsStateful().SetShapeFn(UnknownShape);
  op();
}

// ------------------------------------------------------------------- system

TTE_OP("ConfigureTPUEmbedding")
    .Attr("config: string")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

TTE_OP("IsTPUEmbeddingInitialized")
    .Output("is_tpu_embedding_initialized: bool")
    .Attr("config: string = ''")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

// Ours (TF has no CPU-side counterpart): destroys the engine so that a new
// ConfigureTPUEmbedding can run.  A no-op when nothing is configured.
TTE_OP("ShutdownTPUEmbedding")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

// --------------------------------------------------------- load / retrieve

absl::Status CheckTableSelector(InferenceContext* c) {
  int table_id;
  TF_RETURN_IF_ERROR(c->GetAttr("table_id", &table_id));
  std::string table_name;
  TF_RETURN_IF_ERROR(c->GetAttr("table_name", &table_name));
  if ((table_id >= 0) == !table_name.empty()) {
    return absl::InvalidArgumentError("exactly one of table_id or table_name must be non-default");
  }
  int num_shards, shard_id;
  TF_RETURN_IF_ERROR(c->GetAttr("num_shards", &num_shards));
  TF_RETURN_IF_ERROR(c->GetAttr("shard_id", &shard_id));
  return absl::OkStatus();
}

// Every tensor is [rows_in_shard, dim]: rank 2, all of one shape.
absl::Status LoadTableShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckTableSelector(c));
  ShapeHandle parameters;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &parameters));
  for (int i = 1; i < c->num_inputs(); ++i) {
    ShapeHandle slot, merged;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 2, &slot));
    TF_RETURN_IF_ERROR(c->Merge(parameters, slot, &merged));
  }
  return absl::OkStatus();
}

absl::Status RetrieveTableShapeFn(InferenceContext* c) {
  TF_RETURN_IF_ERROR(CheckTableSelector(c));
  for (int i = 0; i < c->num_outputs(); ++i) {
    c->set_output(i, c->Matrix(c->UnknownDim(), c->UnknownDim()));
  }
  return absl::OkStatus();
}

void AddTableSelectorAttrs(OpDefBuilderWrapper& op) {
  op.Attr("table_id: int = -1")
      .Attr("table_name: string = ''")
      .Attr("num_shards: int")
      .Attr("shard_id: int")
      .Attr("config: string = ''")
      .Attr(kEngineAttr)
      .SetIsStateful();
}

// Load/RetrieveTPUEmbedding<Infix>Parameters for every optimizer of the
// registry: the tensors are "parameters" followed by the optimizer's slots.
void RegisterTableLoadRetrieveOps(const std::string& prefix) {
  for (const OptimizerSpec& spec : AllOptimizers()) {
    if (spec.load_op == nullptr) continue;  // no per-table ops
    std::vector<std::string> tensors = {"parameters"};
    for (const SlotSpec& slot : spec.slots) tensors.push_back(slot.name);

    OpDefBuilderWrapper load(absl::StrCat(prefix, spec.load_op).c_str());
    for (const auto& t : tensors) load.Input(absl::StrCat(t, ": float"));
    AddTableSelectorAttrs(load);
    load.SetShapeFn(LoadTableShapeFn);
    load();

    OpDefBuilderWrapper retrieve(absl::StrCat(prefix, spec.retrieve_op).c_str());
    for (const auto& t : tensors) retrieve.Output(absl::StrCat(t, ": float"));
    AddTableSelectorAttrs(retrieve);
    retrieve.SetShapeFn(RetrieveTableShapeFn);
    retrieve();
  }
}

// LoadAll/RetrieveAll: group i (0 = parameters, i = auxiliary<i>) of table t
// carries the table's i-th state variable, or is empty when it has fewer.
absl::Status AllTablesSetup(InferenceContext* c, TPUEmbeddingConfiguration* config,
                            std::vector<TensorShapeProto>* table_shapes) {
  std::string bytes;
  TF_RETURN_IF_ERROR(c->GetAttr("config", &bytes));
  if (!config->ParseFromString(bytes)) {
    return absl::InvalidArgumentError("Malformed tpu_embedding_config.");
  }
  int num_shards, shard_id, num_tables;
  TF_RETURN_IF_ERROR(c->GetAttr("num_shards", &num_shards));
  TF_RETURN_IF_ERROR(c->GetAttr("shard_id", &shard_id));
  TF_RETURN_IF_ERROR(TableShardShapes(*config, shard_id, num_shards, table_shapes));
  TF_RETURN_IF_ERROR(c->GetAttr("NumTables", &num_tables));
  if (num_tables != config->table_descriptor_size()) {
    return absl::InvalidArgumentError(absl::StrCat("NumTables is ", num_tables,
                                                   " but the config has ",
                                                   config->table_descriptor_size(), " tables"));
  }
  return absl::OkStatus();
}

absl::Status LoadAllShapeFn(InferenceContext* c) {
  TPUEmbeddingConfiguration config;
  std::vector<TensorShapeProto> table_shapes;
  TF_RETURN_IF_ERROR(AllTablesSetup(c, &config, &table_shapes));
  std::array<std::vector<ShapeHandle>, kMaxStateVariables> groups;
  TF_RETURN_IF_ERROR(c->input("parameters", &groups[0]));
  for (int i = 1; i < kMaxStateVariables; ++i) {
    TF_RETURN_IF_ERROR(c->input(absl::StrCat("auxiliary", i), &groups[i]));
  }
  for (int t = 0; t < config.table_descriptor_size(); ++t) {
    ShapeHandle parameters;
    TF_RETURN_IF_ERROR(c->WithRank(groups[0][t], 2, &parameters));
    std::vector<std::string> names;
    TF_RETURN_IF_ERROR(
        StateVariableNames(config.table_descriptor(t).optimization_parameters(), &names));
    for (int i = 1; i < static_cast<int>(names.size()); ++i) {
      ShapeHandle slot, merged, from_config, unused;
      TF_RETURN_IF_ERROR(c->WithRank(groups[i][t], 2, &slot));
      TF_RETURN_IF_ERROR(c->Merge(groups[0][t], slot, &merged));
      TF_RETURN_IF_ERROR(c->MakeShapeFromShapeProto(table_shapes[t], &from_config));
      TF_RETURN_IF_ERROR(c->Merge(merged, from_config, &unused));
    }
    for (int i = names.size(); i < kMaxStateVariables; ++i) {
      ShapeHandle empty;
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(groups[i][t], 1, &empty));
      TF_RETURN_IF_ERROR(c->WithValue(c->NumElements(empty), 0, &unused));
    }
  }
  return absl::OkStatus();
}

absl::Status RetrieveAllShapeFn(InferenceContext* c) {
  TPUEmbeddingConfiguration config;
  std::vector<TensorShapeProto> table_shapes;
  TF_RETURN_IF_ERROR(AllTablesSetup(c, &config, &table_shapes));
  for (int i = 0; i < kMaxStateVariables; ++i) {
    std::vector<ShapeHandle> outputs;
    for (int t = 0; t < config.table_descriptor_size(); ++t) {
      std::vector<std::string> names;
      TF_RETURN_IF_ERROR(
          StateVariableNames(config.table_descriptor(t).optimization_parameters(), &names));
      ShapeHandle shape;
      TF_RETURN_IF_ERROR(c->MakeShapeFromShapeProto(
          i < static_cast<int>(names.size()) ? table_shapes[t] : MakeShapeProto({0, 0}), &shape));
      outputs.push_back(shape);
    }
    TF_RETURN_IF_ERROR(
        c->set_output(i == 0 ? std::string("parameters") : absl::StrCat("auxiliary", i), outputs));
  }
  return absl::OkStatus();
}

void RegisterAllTablesOps(const std::string& prefix) {
  OpDefBuilderWrapper load(absl::StrCat(prefix, "LoadAllTPUEmbeddingParameters").c_str());
  OpDefBuilderWrapper retrieve(absl::StrCat(prefix, "RetrieveAllTPUEmbeddingParameters").c_str());
  for (int i = 0; i < kMaxStateVariables; ++i) {
    const std::string group = i == 0 ? std::string("parameters") : absl::StrCat("auxiliary", i);
    load.Input(absl::StrCat(group, ": NumTables * float"));
    retrieve.Output(absl::StrCat(group, ": NumTables * float"));
  }
  for (OpDefBuilderWrapper* op : {&load, &retrieve}) {
    op->Attr("NumTables: int >= 1")
        .Attr("config: string")
        .Attr("num_shards: int")
        .Attr("shard_id: int")
        .Attr(kEngineAttr)
        .SetIsStateful();
  }
  load.SetShapeFn(LoadAllShapeFn);
  retrieve.SetShapeFn(RetrieveAllShapeFn);
  load();
  retrieve();
}

constexpr char kPrefix[] = TTE_PREFIX;

bool RegisterGeneratedOps() {
  const std::string p = kPrefix;
  RegisterEnqueueOp(p + "EnqueueTPUEmbeddingSparseTensorBatch", "sample_indices", /*dynamic=*/false,
                    /*has_table_ids=*/true);
  RegisterEnqueueOp(p + "EnqueueTPUEmbeddingRaggedTensorBatch", "sample_splits", false, true);
  RegisterEnqueueOp(p + "DynamicEnqueueTPUEmbeddingRaggedTensorBatch", "sample_splits", true, true);
  RegisterEnqueueOp(p + "EnqueueTPUEmbeddingArbitraryTensorBatch", "sample_indices_or_row_splits",
                    false, false);
  RegisterEnqueueOp(p + "DynamicEnqueueTPUEmbeddingArbitraryTensorBatch",
                    "sample_indices_or_row_splits", true, false);
  RegisterTableLoadRetrieveOps(p);
  RegisterAllTablesOps(p);
  return true;
}

[[maybe_unused]] const bool kGeneratedOpsRegistered = RegisterGeneratedOps();

}  // namespace
}  // namespace tf_tpu_emb

// ------------------------------------------------------ fused embedding bag
// Ours (no TF counterpart): the lookup behind tf_tpu_emb.TPUEmbeddingV0.
// Bag b holds ids[row_splits[b] .. row_splits[b+1]) (weights alike, or none
// when `weights` is empty); output[b] = combiner(sum_k w_k * params[id_k]).
// Its registered gradient (tf_tpu_emb/embedding_bag.py) is an IndexedSlices
// whose values come from EmbeddingBagGrad.

namespace tf_tpu_emb {
namespace {

absl::Status BagOutputShape(InferenceContext* c, int params_or_grad, int splits) {
  ShapeHandle table, row_splits, ids, weights;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(params_or_grad), 2, &table));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(splits), 1, &row_splits));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(splits + 1), 1, &ids));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(splits + 2), 1, &weights));
  return absl::OkStatus();
}

TTE_OP("EmbeddingBag")
    .Input("params: float")
    .Input("row_splits: Tsplits")
    .Input("ids: Tids")
    .Input("weights: float")
    .Output("output: float")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'} = 'mean'")
    .Attr("Tids: {int32, int64} = DT_INT64")
    .Attr("Tsplits: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(BagOutputShape(c, 0, 1));
      DimensionHandle bags;
      TF_RETURN_IF_ERROR(c->Subtract(c->Dim(c->input(1), 0), 1, &bags));
      c->set_output(0, c->Matrix(bags, c->Dim(c->input(0), 1)));
      return absl::OkStatus();
    });

// values[k] = (w_k / N_bag) * grad[bag of k]: the rows of d(loss)/d(params)
// as an IndexedSlices with indices = ids.
TTE_OP("EmbeddingBagGrad")
    .Input("grad: float")
    .Input("row_splits: Tsplits")
    .Input("ids: Tids")
    .Input("weights: float")
    .Output("values: float")
    .Attr("combiner: {'sum', 'mean', 'sqrtn'} = 'mean'")
    .Attr("Tids: {int32, int64} = DT_INT64")
    .Attr("Tsplits: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(BagOutputShape(c, 0, 1));
      c->set_output(0, c->Matrix(c->Dim(c->input(2), 0), c->Dim(c->input(0), 1)));
      return absl::OkStatus();
    });

}  // namespace
}  // namespace tf_tpu_emb

// ------------------------------------------------- engine lifecycle (ours)
// The step count that seeds bfloat16 storage's stochastic rounding, moved
// with a checkpoint (Engine::steps_applied); `stochastic_rounding` says
// whether a table of the engine stores bfloat16 (the count matters).

namespace tf_tpu_emb {
namespace {

TTE_OP("RetrieveTPUEmbeddingStepCount")
    .Output("step_count: int64")
    .Output("stochastic_rounding: bool")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(TwoScalarsShapeFn);

TTE_OP("LoadTPUEmbeddingStepCount")
    .Input("step_count: int64")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle scalar;
      return c->WithRank(c->input(0), 0, &scalar);
    });

}  // namespace
}  // namespace tf_tpu_emb
