// The ops of the embedding hosts (README "Running on several machines"):
// ours, with no TF counterpart, under the same "TfTpuEmb>" namespace as TF's
// family (ops/op_defs.h).  A host's engine holds one shard of every table
// (ConfigureTPUEmbeddingHostShard) under a trainer's lease (the lease ops);
// the sharded data path moves one packed tensor per host and phase
// (engine/routing.h; tf_tpu_emb/cluster/sharded.py builds the ops).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "ops/op_defs.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tf_tpu_emb {
namespace {

using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// ------------------------------------------------------ host shard, leases

// Ours: ConfigureTPUEmbedding for host `host_id` of the config's num_hosts
// (TF's core op configures one host holding every table whole).  The engine
// holds only shard host_id of num_hosts of every table and slot, in the
// config's sharding_strategy (docs/tpu_embedding_semantics.md §2.7): the rows
// Load/Retrieve(num_shards=num_hosts, shard_id=host_id) address.
// With lease_seconds > 0 the engine is a trainer's host lease (README
// "Running on several machines"; Engine::EvictLeases): refused while another
// lease runs unless `takeover`, kept by RenewTPUEmbeddingLease.  `session`:
// the sharded model's session id; the host takes only routed packets
// stamped with it, and refuses replays unless it is 0 (engine/routing.h,
// "Packet integrity").
TTE_OP("ConfigureTPUEmbeddingHostShard")
    .Attr("config: string")
    .Attr("host_id: int >= 0")
    .Attr("lease_seconds: float = 0")
    .Attr("takeover: bool = false")
    .Attr("session: int = 0")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

// A trainer's heartbeat: renews the host lease of the engine it names and
// reads its step count; `lost` says why when the engine is gone ("" when
// renewed; step_count is then -1).  Never fails: a failing remote op taints
// the host's executor for the trainer's other ops.
TTE_OP("RenewTPUEmbeddingLease")
    .Output("lost: string")
    .Output("step_count: int64")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(TwoScalarsShapeFn);

// Before a leased configure of `engine`: evicts leases that ended (and, with
// `takeover`, one that runs) and returns "" when the host may be configured,
// else the refusal naming the holder and when its lease ends (never fails).
TTE_OP("ClaimTPUEmbeddingHost")
    .Output("refusal: string")
    .Attr("takeover: bool = false")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

// The name of the engine whose host lease runs in this process, or "" (what
// workers other than 0 attach to).
TTE_OP("LeasedTPUEmbeddingEngine")
    .Output("engine: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

// The session id of the host engine `engine` (what the other workers'
// routers stamp on their packets), 0 when there is none (never fails, as
// the lease ops).
TTE_OP("TPUEmbeddingHostSession")
    .Output("session: int64")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

// ------------------------------------------------------ sharded data path
// The enqueue/Recv/Send of a model whose tables
// are sharded over embedding hosts (engine/routing.h; tf_tpu_emb/cluster/
// sharded.py builds them).  On the worker: Route (the replica's
// ArbitraryTensorBatch inputs -> one packed batch per host), Combine (the
// hosts' Recv outputs -> the replica's activations), Split (activation
// gradients -> one vector per host), all for the router named `router`
// (per replica `device_ordinal`), which ShutdownTPUEmbeddingRouter forgets.
// Route's `form`: "auto" (per output and step the form that moves fewer
// bytes), "bags" or "rows" (forced), "host_filter" (the whole batch to every
// host); see engine/routing.h.  Route's `session` is stamped on every
// packet: the hosts' (ConfigureTPUEmbeddingHostShard's) session.
// On host k: EnqueueTPUEmbeddingRoutedBatch, RecvTPUEmbeddingRoutedActivations,
// SendTPUEmbeddingRoutedGradients on the engine of ConfigureTPUEmbeddingHostShard.

absl::Status RouterConfig(InferenceContext* c, TPUEmbeddingConfiguration* config) {
  std::string bytes;
  TF_RETURN_IF_ERROR(c->GetAttr("config", &bytes));
  TF_RETURN_IF_ERROR(ParseConfig(bytes, config));
  int num_hosts;
  TF_RETURN_IF_ERROR(c->GetAttr("num_hosts", &num_hosts));
  if (num_hosts != std::max(1, config->num_hosts())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_hosts is ", num_hosts, " but the config's num_hosts is ", config->num_hosts()));
  }
  return absl::OkStatus();
}

// "feature 'watched'" (or "input 2" of a table-mode config).
std::string FeatureLabel(const TPUEmbeddingConfiguration& config, int i) {
  if (i < config.feature_descriptor_size()) {
    return absl::StrCat("feature '", config.feature_descriptor(i).name(), "'");
  }
  return absl::StrCat("input ", i);
}

TTE_OP("RouteTPUEmbeddingArbitraryTensorBatch")
    .Input("sample_indices_or_row_splits: N * T1")
    .Input("embedding_indices: N * T2")
    .Input("aggregation_weights: N * T3")
    .Input("mode_override: string")
    .Output("host_batches: num_hosts * uint8")
    .Output("host_floats: int64")
    .Output("sequence: int64")
    .Attr("T1: {int32,int64} = DT_INT32")
    .Attr("T2: {int32,int64} = DT_INT32")
    .Attr("T3: {float32,float64} = DT_FLOAT")
    .Attr("N: int >= 1")
    .Attr("num_hosts: int >= 1")
    .Attr("device_ordinal: int >= 0")
    .Attr("combiners: list(string) = []")
    .Attr("config: string")
    .Attr("router: string")
    .Attr("form: {'auto', 'bags', 'rows', 'host_filter'} = 'auto'")
    .Attr("session: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TF_RETURN_IF_ERROR(CombinersLengthShapeFn(c));
      TPUEmbeddingConfiguration config;
      TF_RETURN_IF_ERROR(RouterConfig(c, &config));
      int n, num_hosts;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("num_hosts", &num_hosts));
      const int features = config.feature_descriptor_size() > 0 ? config.feature_descriptor_size()
                                                                : config.table_descriptor_size();
      if (n != features) {
        return absl::InvalidArgumentError(absl::StrCat("got ", n, " inputs but the config has ",
                                                       features, " feature descriptors"));
      }
      for (int i = 0; i < n; ++i) {
        ShapeHandle unused;
        const absl::Status ranks = [&]() -> absl::Status {
          TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(i), 1, &unused));
          TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(i), 2, &unused));
          TF_RETURN_IF_ERROR(c->WithRank(c->input(n + i), 1, &unused));
          return c->WithRank(c->input(2 * n + i), 1, &unused);
        }();
        if (!ranks.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(FeatureLabel(config, i), ": ",
                                                         ranks.message(),
                                                         " (indices or splits of rank 1 "
                                                         "or 2, ids and weights of rank 1)"));
        }
      }
      for (int k = 0; k < num_hosts; ++k) c->set_output(k, c->Vector(c->UnknownDim()));
      c->set_output(num_hosts, c->Vector(num_hosts));
      c->set_output(num_hosts + 1, c->Scalar());
      return absl::OkStatus();
    });

TTE_OP("CombineTPUEmbeddingRoutedActivations")
    .Input("host_activations: num_hosts * float32")
    .Output("outputs: num_outputs * float32")
    .Attr("num_hosts: int >= 1")
    .Attr("num_outputs: int >= 1")
    .Attr("device_ordinal: int >= 0")
    .Attr("config: string")
    .Attr("router: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TPUEmbeddingConfiguration config;
      TF_RETURN_IF_ERROR(RouterConfig(c, &config));
      for (int k = 0; k < c->num_inputs(); ++k) {
        ShapeHandle unused;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(k), 1, &unused));
      }
      return RecvShapeFn(c);
    });

TTE_OP("SplitTPUEmbeddingRoutedGradients")
    .Input("inputs: N * float32")
    .Input("learning_rates: NN * float32")
    .Output("host_gradients: num_hosts * float32")
    .Attr("N: int >= 1")
    .Attr("NN: int >= 0 = 0")
    .Attr("num_hosts: int >= 1")
    .Attr("device_ordinal: int >= 0")
    .Attr("config: string")
    .Attr("router: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      TPUEmbeddingConfiguration config;
      TF_RETURN_IF_ERROR(RouterConfig(c, &config));
      std::vector<TensorShapeProto> shapes;
      TF_RETURN_IF_ERROR(ComputeOutputShapes(config, &shapes));
      int n, nn, num_hosts;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      TF_RETURN_IF_ERROR(c->GetAttr("NN", &nn));
      TF_RETURN_IF_ERROR(c->GetAttr("num_hosts", &num_hosts));
      if (n != static_cast<int>(shapes.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("got ", n, " gradients but Recv produces ", shapes.size(), " outputs"));
      }
      for (int i = 0; i < n; ++i) {
        ShapeHandle want, unused;
        TF_RETURN_IF_ERROR(c->MakeShapeFromShapeProto(shapes[i], &want));
        if (!c->Merge(c->input(i), want, &unused).ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "gradient ", i, " (", FeatureLabel(config, i), ") has shape ",
              c->DebugString(c->input(i)), " but Recv's output is ", c->DebugString(want)));
        }
      }
      for (int i = 0; i < nn; ++i) {
        ShapeHandle unused;
        TF_RETURN_IF_ERROR(c->WithRank(c->input(n + i), 0, &unused));
      }
      for (int k = 0; k < num_hosts; ++k) c->set_output(k, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

TTE_OP("ShutdownTPUEmbeddingRouter")
    .Attr("router: string")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::NoOutputs);

TTE_OP("EnqueueTPUEmbeddingRoutedBatch")
    .Input("batch: uint8")
    .Attr("device_ordinal: int = -1")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle unused;
      return c->WithRank(c->input(0), 1, &unused);
    });

TTE_OP("RecvTPUEmbeddingRoutedActivations")
    .Output("activations: float32")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

// `background`: the update the step's last Send completes runs after the
// Send returns (the next Recv and Load/Retrieve wait for it); false: within
// the Send, as SendTPUEmbeddingGradients.
TTE_OP("SendTPUEmbeddingRoutedGradients")
    .Input("gradients: float32")
    .Attr("background: bool = true")
    .Attr(kEngineAttr)
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle unused;
      return c->WithRank(c->input(0), 1, &unused);
    });

}  // namespace
}  // namespace tf_tpu_emb
