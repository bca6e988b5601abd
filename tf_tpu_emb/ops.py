"""Python wrappers for every op of the tf_tpu_emb library.

Every op is registered as ``TfTpuEmb>Name`` (TF owns the bare names); the CPU
kernels are also attached to TF's core op names, so ``tf.raw_ops`` graphs run
once the library is loaded.  The op names are exported as constants, e.g.
``RECV_TPU_EMBEDDING_ACTIVATIONS == "TfTpuEmb>RecvTPUEmbeddingActivations"``
(what non-Python bindings need to build the ops by name).

The wrappers load the library on first call (see :func:`tf_tpu_emb.load_library`).
"""
import collections
import re

from tf_tpu_emb import _loader
from tf_tpu_emb.optimizer_specs import BY_PROTO_FIELD, OPTIMIZERS, SPARSECORE_OPTIMIZERS

PREFIX = _loader.PREFIX


def _snake(name):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _table_op_names(kind):
    return tuple(o.load_op if kind == "Load" else o.retrieve_op for o in OPTIMIZERS)


#: Ops of TF's TPU embedding family that this library mirrors (bare TF names).
CORE_OP_NAMES = (
    "TPUEmbeddingActivations",
    "RecvTPUEmbeddingActivations",
    "SendTPUEmbeddingGradients",
    "EnqueueTPUEmbeddingIntegerBatch",
    "EnqueueTPUEmbeddingSparseBatch",
    "EnqueueTPUEmbeddingSparseTensorBatch",
    "EnqueueTPUEmbeddingRaggedTensorBatch",
    "EnqueueTPUEmbeddingArbitraryTensorBatch",
    "DynamicEnqueueTPUEmbeddingRaggedTensorBatch",
    "DynamicEnqueueTPUEmbeddingArbitraryTensorBatch",
    "ConfigureTPUEmbedding",
    "IsTPUEmbeddingInitialized",
    "LoadAllTPUEmbeddingParameters",
    "RetrieveAllTPUEmbeddingParameters",
) + tuple(n for o, n in zip(OPTIMIZERS, _table_op_names("Load")) if o.core_has_table_ops) \
  + tuple(n for o, n in zip(OPTIMIZERS, _table_op_names("Retrieve")) if o.core_has_table_ops)

#: The sharded data path's ops (engine/routing.h): the worker's Route /
#: Combine / Split and router shutdown, the hosts' routed Enqueue / Recv / Send.
SHARDED_OP_NAMES = ("RouteTPUEmbeddingArbitraryTensorBatch",
                    "CombineTPUEmbeddingRoutedActivations", "SplitTPUEmbeddingRoutedGradients",
                    "ShutdownTPUEmbeddingRouter", "EnqueueTPUEmbeddingRoutedBatch",
                    "RecvTPUEmbeddingRoutedActivations", "SendTPUEmbeddingRoutedGradients")

#: Ops that exist only in this library: the engine shutdown, host sharding,
#: the embedding bag, and per-table Load/Retrieve ops for optimizers TF
#: moves only with the *All* ops.
EXTRA_OP_NAMES = ("ShutdownTPUEmbedding", "ConfigureTPUEmbeddingHostShard", "EmbeddingBag",
                  "EmbeddingBagGrad", "AssertTPUEmbeddingEnqueued", "RetrieveTPUEmbeddingStepCount",
                  "LoadTPUEmbeddingStepCount", "RenewTPUEmbeddingLease",
                  "LeasedTPUEmbeddingEngine", "ClaimTPUEmbeddingHost",
                  "TPUEmbeddingHostSession") + SHARDED_OP_NAMES + tuple(
    n for o, n in zip(OPTIMIZERS * 2, _table_op_names("Load") + _table_op_names("Retrieve"))
    if not o.core_has_table_ops)

#: TF's SparseCore op family (TPUEmbeddingV2; ops/sparsecore_ops.cc), registered
#: as ``TfTpuEmb>Name`` with TF 2.21's signatures; none addresses an engine (each
#: is a function of its inputs).  Not in OP_NAMES: they have no wrappers here yet
#: (``tf.raw_ops`` or the prefixed name by ``op_def_library``).  Which of them
#: have CPU kernels: ``SPARSECORE_KERNEL_OP_NAMES``.
SPARSECORE_OP_NAMES = tuple(sorted((
    "ConvertToCooTensor", "ConvertToListOfSparseCoreCooTensors",
    "ConvertToSparseCoreCsrWrappedCooTensor", "GetMinibatchSplitsWithPhysicalReplica",
    "GetMinibatchesInCsrWithPhysicalReplica", "GetStatsFromListOfSparseCoreCooTensors",
    "GlobalIterId", "SortListOfSparseCoreCooTensors", "StoreMinibatchStatisticsInFdo",
    "TPUAnnotateTensorsWithDynamicShape", "TPUCopyWithDynamicShape",
    "XlaSparseDenseMatmul",
    "XlaSparseDenseMatmulCustomCombinerOnTcGradWithCsrInput",
    "XlaSparseDenseMatmulCustomCombinerOnTcWithCsrInput",
    "XlaSparseDenseMatmulGradWithCsrInput",
    "XlaSparseDenseMatmulWithCsrInput", "XlaSparseDenseMatmulWithStaticBufferSize",
) + tuple(n for o in SPARSECORE_OPTIMIZERS for n in o.op_names)))

#: Ours, not TF's: the in-place forms of the SparseCore gradient ops
#: (``TfTpuEmb>XlaSparseDenseMatmulGradWith<Opt>And<Form>InPlace``: the table
#: and slots as resource variables, updated where they are; no outputs).  The
#: stand-in SparseCore TPU uses them for TF's read -> gradient op -> assign
#: (tf_tpu_emb/tpu/embedding_v2.py, docs/sparsecore_semantics.md §10).
SPARSECORE_IN_PLACE_OP_NAMES = tuple(
    n for o in SPARSECORE_OPTIMIZERS for n in o.in_place_op_names)

#: The SparseCore ops with CPU kernels (under both names; docs/sparsecore_semantics.md):
#: every one of the family.
SPARSECORE_KERNEL_OP_NAMES = SPARSECORE_OP_NAMES

#: Bare name -> registered (prefixed) name, for every op of the library.
OP_NAMES = {n: PREFIX + n for n in CORE_OP_NAMES + EXTRA_OP_NAMES}

# Constants such as RECV_TPU_EMBEDDING_ACTIVATIONS = "TfTpuEmb>RecvTPUEmbeddingActivations".
for _bare, _full in OP_NAMES.items():
    globals()[_snake(_bare).upper()] = _full


def _gen(bare_name):
    """The generated wrapper of the library for op `bare_name`."""
    return getattr(_loader.load_library(), "tf_tpu_emb_" + _snake(bare_name))


def raw_op(bare_name):
    """The generated wrapper (keyword arguments: the op def's inputs and
    attrs) of ``TfTpuEmb>`` + ``bare_name``, for ops without a function here
    (the SparseCore family: ``SPARSECORE_OP_NAMES``,
    ``SPARSECORE_IN_PLACE_OP_NAMES``)."""
    return _gen(bare_name)


# ------------------------------------------------------------------ data path

def tpu_embedding_activations(embedding_variable, sliced_activations, table_id,
                              lookup_id, name=None):
    """Identity on ``sliced_activations`` whose gradient feeds the engine.

    ``embedding_variable`` is the table's dummy (trainable) variable; taking the
    gradient of a loss with respect to it routes dL/d(activations) to
    ``SendTPUEmbeddingGradients`` (see ``tf_tpu_emb.gradients``).
    ``table_id``/``lookup_id`` identify the table and the lookup (feature).
    """
    return _gen("TPUEmbeddingActivations")(
        embedding_variable=embedding_variable, sliced_activations=sliced_activations,
        table_id=table_id, lookup_id=lookup_id, name=name)


def recv_tpu_embedding_activations(num_outputs, config, engine="", name=None):
    """Pops this replica's enqueued batch and returns its activations.

    One float32 tensor per table (``[batch * num_features, dim]``) or, when the
    config has feature descriptors, per feature (``input_shape + [dim]``).
    """
    return _gen("RecvTPUEmbeddingActivations")(num_outputs=num_outputs,
                                                config=config, engine=engine, name=name)


def send_tpu_embedding_gradients(inputs, config, learning_rates=None, engine="", name=None):
    """Sends dL/d(activations) (same list and shapes as Recv) to the engine,
    which applies each table's optimizer. ``learning_rates[tag]`` are the
    dynamic learning rates (float32 scalars), empty when all are constant."""
    return _gen("SendTPUEmbeddingGradients")(
        inputs=inputs, learning_rates=list(learning_rates or []), config=config,
        engine=engine, name=name)


# -------------------------------------------------------------------- enqueue

def enqueue_tpu_embedding_integer_batch(batch, device_ordinal=-1,
                                        mode_override="unspecified", engine="", name=None):
    """Enqueues one int32 id per sample for each output (table or feature)."""
    return _gen("EnqueueTPUEmbeddingIntegerBatch")(
        batch=batch, mode_override=mode_override, device_ordinal=device_ordinal,
        engine=engine, name=name)


def enqueue_tpu_embedding_sparse_batch(sample_indices, embedding_indices,
                                       aggregation_weights, device_ordinal=-1,
                                       combiners=None, mode_override="unspecified",
                                       engine="", name=None):
    """Table-oriented COO enqueue: ``sample_indices[t]`` addresses rows of table
    t's ``[batch * num_features, dim]`` output directly."""
    return _gen("EnqueueTPUEmbeddingSparseBatch")(
        sample_indices=sample_indices, embedding_indices=embedding_indices,
        aggregation_weights=aggregation_weights, mode_override=mode_override,
        device_ordinal=device_ordinal, combiners=list(combiners or []), engine=engine, name=name)


def enqueue_tpu_embedding_sparse_tensor_batch(
        sample_indices, embedding_indices, aggregation_weights, table_ids,
        device_ordinal=-1, max_sequence_lengths=None, num_features=None,
        combiners=None, mode_override="unspecified", engine="", name=None):
    """Feature-oriented enqueue of ``tf.SparseTensor`` parts (indices, values,
    weight values); ``table_ids[i]`` is the table of feature i."""
    return _gen("EnqueueTPUEmbeddingSparseTensorBatch")(
        sample_indices=sample_indices, embedding_indices=embedding_indices,
        aggregation_weights=aggregation_weights, mode_override=mode_override,
        device_ordinal=device_ordinal, combiners=list(combiners or []),
        table_ids=list(table_ids), max_sequence_lengths=list(max_sequence_lengths or []),
        num_features=list(num_features or []), engine=engine, name=name)


def enqueue_tpu_embedding_ragged_tensor_batch(
        sample_splits, embedding_indices, aggregation_weights, table_ids,
        device_ordinal=-1, max_sequence_lengths=None, num_features=None,
        combiners=None, mode_override="unspecified", engine="", name=None):
    """Feature-oriented enqueue of ``tf.RaggedTensor`` parts (row splits,
    values, weight values); ``table_ids[i]`` is the table of feature i."""
    return _gen("EnqueueTPUEmbeddingRaggedTensorBatch")(
        sample_splits=sample_splits, embedding_indices=embedding_indices,
        aggregation_weights=aggregation_weights, mode_override=mode_override,
        device_ordinal=device_ordinal, combiners=list(combiners or []),
        table_ids=list(table_ids), max_sequence_lengths=list(max_sequence_lengths or []),
        num_features=list(num_features or []), engine=engine, name=name)


def enqueue_tpu_embedding_arbitrary_tensor_batch(
        sample_indices_or_row_splits, embedding_indices, aggregation_weights,
        device_ordinal=-1, combiners=None, mode_override="unspecified", engine="", name=None):
    """Enqueue positional to the config's feature descriptors: input i is COO
    indices (rank 2), row splits (rank 1) or empty (dense ids)."""
    return _gen("EnqueueTPUEmbeddingArbitraryTensorBatch")(
        sample_indices_or_row_splits=sample_indices_or_row_splits,
        embedding_indices=embedding_indices, aggregation_weights=aggregation_weights,
        mode_override=mode_override, device_ordinal=device_ordinal,
        combiners=list(combiners or []), engine=engine, name=name)


def dynamic_enqueue_tpu_embedding_ragged_tensor_batch(
        sample_splits, embedding_indices, aggregation_weights, device_ordinal,
        table_ids, max_sequence_lengths=None, num_features=None, combiners=None,
        mode_override="unspecified", engine="", name=None):
    """As :func:`enqueue_tpu_embedding_ragged_tensor_batch`, with the replica
    given by an int32 tensor."""
    return _gen("DynamicEnqueueTPUEmbeddingRaggedTensorBatch")(
        sample_splits=sample_splits, embedding_indices=embedding_indices,
        aggregation_weights=aggregation_weights, mode_override=mode_override,
        device_ordinal=device_ordinal, combiners=list(combiners or []),
        table_ids=list(table_ids), max_sequence_lengths=list(max_sequence_lengths or []),
        num_features=list(num_features or []), engine=engine, name=name)


def dynamic_enqueue_tpu_embedding_arbitrary_tensor_batch(
        sample_indices_or_row_splits, embedding_indices, aggregation_weights,
        device_ordinal, combiners=None, mode_override="unspecified", engine="", name=None):
    """As :func:`enqueue_tpu_embedding_arbitrary_tensor_batch`, with the replica
    given by an int32 tensor."""
    return _gen("DynamicEnqueueTPUEmbeddingArbitraryTensorBatch")(
        sample_indices_or_row_splits=sample_indices_or_row_splits,
        embedding_indices=embedding_indices, aggregation_weights=aggregation_weights,
        mode_override=mode_override, device_ordinal=device_ordinal,
        combiners=list(combiners or []), engine=engine, name=name)


# --------------------------------------------------------------------- system

def configure_tpu_embedding(config, engine="", name=None):
    """Validates and completes ``config`` (a serialized TPUEmbeddingConfiguration)
    and creates the embedding engine called ``engine`` with its tables and
    slots.  Every op of this module that addresses an engine takes
    ``engine=``: "" is the process's default engine, the one TF's core-named
    ops address; other names are independent engines (docs/engine.md
    "Several engines per process")."""
    return _gen("ConfigureTPUEmbedding")(config=config, engine=engine, name=name)


def is_tpu_embedding_initialized(config="", engine="", name=None):
    """True when the embedding engine called ``engine`` is configured."""
    return _gen("IsTPUEmbeddingInitialized")(config=config, engine=engine, name=name)


def configure_tpu_embedding_host_shard(config, host_id, lease_seconds=0.0, takeover=False,
                                       engine="", session=0, name=None):
    """ConfigureTPUEmbedding for host ``host_id`` of the config's ``num_hosts``:
    the engine holds only that host's shard of every table and slot (the rows
    Load/Retrieve with ``num_shards=num_hosts, shard_id=host_id`` address).
    ``lease_seconds > 0``: the engine is a trainer's host lease, refused while
    another one runs unless ``takeover``, kept by
    :func:`renew_tpu_embedding_lease`.  ``session``: the sharded model's
    session id (a signed 64-bit int): the host takes only routed packets
    stamped with it (:func:`route_tpu_embedding_arbitrary_tensor_batch`), and
    refuses a replayed one; 0 (an engine fed by hand) checks no replay."""
    return _gen("ConfigureTPUEmbeddingHostShard")(
        config=config, host_id=host_id, lease_seconds=float(lease_seconds),
        takeover=bool(takeover), session=int(session), engine=engine, name=name)


def renew_tpu_embedding_lease(engine="", name=None):
    """Renews the host lease of ``engine`` (a trainer's heartbeat):
    ``(lost, step_count)``, lost = "" when renewed, else why the engine is
    gone (step_count -1).  Never fails: a remote op that fails taints the
    host's executor for the trainer's other ops."""
    return _gen("RenewTPUEmbeddingLease")(engine=engine, name=name)


def claim_tpu_embedding_host(takeover=False, engine="", name=None):
    """Before a leased configure of ``engine``: evicts leases that ended
    (with ``takeover``, also one that runs); returns "" when the host may be
    configured, else the refusal naming the holder.  Never fails."""
    return _gen("ClaimTPUEmbeddingHost")(takeover=bool(takeover), engine=engine, name=name)


def leased_tpu_embedding_engine(name=None):
    """The name of the engine holding this process's host lease, or ""."""
    return _gen("LeasedTPUEmbeddingEngine")(name=name)


def tpu_embedding_host_session(engine="", name=None):
    """The session id of the host engine ``engine`` (0 when there is none;
    never fails)."""
    return _gen("TPUEmbeddingHostSession")(engine=engine, name=name)


def retrieve_tpu_embedding_step_count(engine="", name=None):
    """``(step_count, stochastic_rounding)``: the training steps the engine
    applied (the count that seeds bfloat16 storage's stochastic rounding) and
    whether any of its tables stores bfloat16."""
    return _gen("RetrieveTPUEmbeddingStepCount")(engine=engine, name=name)


def load_tpu_embedding_step_count(step_count, engine="", name=None):
    """Sets the engine's step count (a checkpoint's, see
    :func:`retrieve_tpu_embedding_step_count`)."""
    return _gen("LoadTPUEmbeddingStepCount")(step_count=step_count, engine=engine, name=name)


def shutdown_tpu_embedding(engine="", name=None):
    """Destroys the embedding engine called ``engine`` (its tables are lost:
    retrieve them first); its memory goes with the last op using it."""
    return _gen("ShutdownTPUEmbedding")(engine=engine, name=name)


def assert_tpu_embedding_enqueued(operation="RecvTPUEmbeddingActivations", engine="",
                                  name=None):
    """Fails at once (``FailedPrecondition`` naming ``operation``) unless a
    Recv on this device's replica has a batch to take: what a ``dequeue()``
    that no ``enqueue()`` of its step precedes runs first, instead of
    waiting for a batch that never comes."""
    return _gen("AssertTPUEmbeddingEnqueued")(operation=operation, engine=engine, name=name)


# ---------------------------------------------------------- sharded data path

def route_tpu_embedding_arbitrary_tensor_batch(
        sample_indices_or_row_splits, embedding_indices, aggregation_weights, mode_override,
        *, num_hosts, device_ordinal, config, router, combiners=None, form="auto", session=0,
        name=None):
    """On the worker: one replica's ArbitraryTensorBatch inputs checked and
    split over the config's ``num_hosts`` embedding hosts.  Returns
    ``(host_batches, host_floats, sequence)``: one packed uint8 batch per host
    (for its :func:`enqueue_tpu_embedding_routed_batch`), per host the floats
    its Recv will return (before the two carrying the sequence), and the
    batch's sequence number (it travels with the batch, the hosts' Recv
    outputs and the gradients).  The routed batch waits in the worker's router
    ``router`` (replica ``device_ordinal``) for
    :func:`combine_tpu_embedding_routed_activations`.  ``form``: "auto" (per
    output and step, whichever of "bags" and "rows" moves fewer bytes), one
    of them, or "host_filter" (every host gets the whole batch).  ``session``:
    the hosts' session id (their :func:`configure_tpu_embedding_host_shard`'s),
    stamped on every packet."""
    out = _gen("RouteTPUEmbeddingArbitraryTensorBatch")(
        sample_indices_or_row_splits=sample_indices_or_row_splits,
        embedding_indices=embedding_indices, aggregation_weights=aggregation_weights,
        mode_override=mode_override, num_hosts=num_hosts, device_ordinal=device_ordinal,
        combiners=list(combiners or []), config=config, router=router,
        form=form, session=int(session), name=name)
    return list(out[0]), out[1], out[2]


def combine_tpu_embedding_routed_activations(host_activations, *, num_outputs, device_ordinal,
                                             config, router, name=None):
    """On the worker: the replica's activations (Recv's outputs) from every
    host's :func:`recv_tpu_embedding_routed_activations` output."""
    return _gen("CombineTPUEmbeddingRoutedActivations")(
        host_activations=host_activations, num_outputs=num_outputs,
        device_ordinal=device_ordinal, config=config, router=router, name=name)


def split_tpu_embedding_routed_gradients(inputs, learning_rates, *, num_hosts, device_ordinal,
                                         config, router, name=None):
    """On the worker: the replica's activation gradients (Recv's shapes) and
    dynamic learning rates as one vector per host, for its
    :func:`send_tpu_embedding_routed_gradients`."""
    return _gen("SplitTPUEmbeddingRoutedGradients")(
        inputs=inputs, learning_rates=list(learning_rates or []), num_hosts=num_hosts,
        device_ordinal=device_ordinal, config=config, router=router, name=name)


def shutdown_tpu_embedding_router(router, name=None):
    """Forgets the worker's router ``router`` (its queued batches too)."""
    return _gen("ShutdownTPUEmbeddingRouter")(router=router, name=name)


def enqueue_tpu_embedding_routed_batch(batch, device_ordinal=-1, engine="", name=None):
    """On a host: its packed part of a routed batch, queued for the replica."""
    return _gen("EnqueueTPUEmbeddingRoutedBatch")(batch=batch, device_ordinal=device_ordinal,
                                                  engine=engine, name=name)


def recv_tpu_embedding_routed_activations(engine="", name=None):
    """On a host: its part of the replica's activations (one float vector)."""
    return _gen("RecvTPUEmbeddingRoutedActivations")(engine=engine, name=name)


def send_tpu_embedding_routed_gradients(gradients, background=True, engine="", name=None):
    """On a host: its gradients (one float vector from the worker's Split).
    ``background``: the step's update runs after the op returns (the next
    Recv and Load/Retrieve wait for it); False: within the op."""
    return _gen("SendTPUEmbeddingRoutedGradients")(gradients=gradients, background=background,
                                                   engine=engine, name=name)


# ------------------------------------------------------- fused embedding bag

def embedding_bag(params, row_splits, ids, weights, combiner="mean", name=None):
    """``output[b] = combiner(sum_k w_k * params[ids[k]])`` over the bag
    ``k in [row_splits[b], row_splits[b+1])`` (``weights`` empty = all 1):
    ``[num_bags, dim]``.  Use :func:`tf_tpu_emb.embedding_bag.embedding_bag`
    for SparseTensor/RaggedTensor/dense ids and the IndexedSlices gradient."""
    return _gen("EmbeddingBag")(params=params, row_splits=row_splits, ids=ids,
                                weights=weights, combiner=combiner, name=name)


def embedding_bag_grad(grad, row_splits, ids, weights, combiner="mean", name=None):
    """Per-id rows of d(loss)/d(params) for :func:`embedding_bag`:
    ``values[k] = (w_k / N_bag) * grad[bag of k]``, ``[num_ids, dim]``."""
    return _gen("EmbeddingBagGrad")(grad=grad, row_splits=row_splits, ids=ids,
                                    weights=weights, combiner=combiner, name=name)


# ------------------------------------------------------------ load / retrieve

def load_all_tpu_embedding_parameters(parameters, auxiliary1, auxiliary2, auxiliary3,
                                      auxiliary4, auxiliary5, auxiliary6, auxiliary7,
                                      config, num_shards, shard_id, engine="", name=None):
    """Loads every table's state variables (parameters, then up to 7 slots;
    unused groups are empty tensors) for one shard."""
    return _gen("LoadAllTPUEmbeddingParameters")(
        parameters=parameters, auxiliary1=auxiliary1, auxiliary2=auxiliary2,
        auxiliary3=auxiliary3, auxiliary4=auxiliary4, auxiliary5=auxiliary5,
        auxiliary6=auxiliary6, auxiliary7=auxiliary7, config=config,
        num_shards=num_shards, shard_id=shard_id, engine=engine, name=name)


def retrieve_all_tpu_embedding_parameters(NumTables, config, num_shards, shard_id,
                                          engine="", name=None):
    """Returns 8 lists (parameters, auxiliary1..7) of one tensor per table."""
    return _gen("RetrieveAllTPUEmbeddingParameters")(
        NumTables=NumTables, config=config, num_shards=num_shards,
        shard_id=shard_id, engine=engine, name=name)


TableOps = collections.namedtuple("TableOps", ["info", "tensors", "load", "retrieve"])
TableOps.__doc__ = """The per-table Load/Retrieve ops of one optimizer."""
TableOps.info.__doc__ = "The optimizer's :class:`tf_tpu_emb.optimizer_specs.OptimizerInfo`."
TableOps.tensors.__doc__ = """``("parameters", slot names...)``: Load's inputs, Retrieve's
outputs."""
TableOps.load.__doc__ = """The Load op: ``load(*tensors, num_shards, shard_id, table_id=-1,
table_name="", ...)``."""
TableOps.retrieve.__doc__ = """The Retrieve op: ``retrieve(*, num_shards, shard_id,
table_id=-1, table_name="", ...)``."""


def _make_table_ops(info):
    load_name, retrieve_name = info.load_op, info.retrieve_op
    tensors = ("parameters",) + info.slots

    def load(*args, num_shards, shard_id, table_id=-1, table_name="", config="",
             engine="", name=None, **kwargs):
        kwargs.update(zip(tensors, args))
        return _gen(load_name)(num_shards=num_shards, shard_id=shard_id,
                               table_id=table_id, table_name=table_name,
                               config=config, engine=engine, name=name, **kwargs)

    def retrieve(*, num_shards, shard_id, table_id=-1, table_name="", config="",
                 engine="", name=None):
        return _gen(retrieve_name)(num_shards=num_shards, shard_id=shard_id,
                                   table_id=table_id, table_name=table_name,
                                   config=config, engine=engine, name=name)

    load.__name__ = load.__qualname__ = _snake(load_name)
    retrieve.__name__ = retrieve.__qualname__ = _snake(retrieve_name)
    load.__doc__ = ("Loads shard `shard_id` of `num_shards` of a %s table: %s "
                    "(each [rows_in_shard, dim]). Select the table with exactly "
                    "one of table_id / table_name." % (info.proto_field, ", ".join(tensors)))
    retrieve.__doc__ = ("Returns shard `shard_id` of `num_shards` of a %s table: %s."
                        % (info.proto_field, ", ".join(tensors)))
    return load, retrieve


_TABLE_OPS = {}
for _info in OPTIMIZERS:
    _load, _retrieve = _make_table_ops(_info)
    globals()[_load.__name__] = _load
    globals()[_retrieve.__name__] = _retrieve
    _TABLE_OPS[_info.proto_field] = TableOps(
        _info, ("parameters",) + tuple(_info.slots), _load, _retrieve)
del _info, _load, _retrieve, _bare, _full


def table_ops(proto_field):
    """The :class:`TableOps` of the optimizer whose ``OptimizationParameters``
    oneof field is `proto_field` ("adagrad", ...).

    Raises:
      ValueError: `proto_field` names no optimizer.
    """
    try:
        return _TABLE_OPS[proto_field]
    except KeyError:
        raise ValueError("No TPU embedding optimizer %r; known: %s"
                         % (proto_field, ", ".join(BY_PROTO_FIELD))) from None
