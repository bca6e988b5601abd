"""Our op registrations mirror TensorFlow 2.21's, and the Python side agrees with them.

Every op of TF's TPU-embedding family that we mirror is registered again as
``TfTpuEmb>Name`` (TF owns the bare names).  Graph authors, SavedModels and the
generated wrappers only see the OpDef, so any drift from TF's signature
(an input renamed, a default changed, a constraint dropped, statefulness lost)
is a compatibility bug.  These tests compare the two OpDefs field by field.
They also check that the Python optimizer table (tf_tpu_emb/optimizers.py)
matches the C++ registry (core/optimizers.h), which is only observable
through the OpDefs and shapes the library registers.
"""
import inspect

import pytest
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2
from tensorflow.python.framework import op_def_library
from tensorflow.python.framework import op_def_registry
import tensorflow as tf

import op_def_compare as odc
import tf_features
from tf_tpu_emb import ops as tte_ops
from tf_tpu_emb.optimizers import BY_PROTO_FIELD, OPTIMIZERS

PREFIX = tte_ops.PREFIX

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


def _op_defs(bare):
    core, ours = odc.registered(bare)
    assert core is not None, "TF 2.21 has no op %r" % bare
    return core, ours


def test_prefix():
    assert PREFIX == "TfTpuEmb>"
    assert all(v == PREFIX + k for k, v in tte_ops.OP_NAMES.items())
    assert set(tte_ops.OP_NAMES) == set(tte_ops.CORE_OP_NAMES) | set(tte_ops.EXTRA_OP_NAMES)
    assert not set(tte_ops.CORE_OP_NAMES) & set(tte_ops.EXTRA_OP_NAMES)


@pytest.mark.parametrize("bare", tte_ops.CORE_OP_NAMES)
def test_inputs_match_core(bare):
    core, ours = _op_defs(bare)
    assert odc.args(ours.input_arg) == odc.args(core.input_arg)


@pytest.mark.parametrize("bare", tte_ops.CORE_OP_NAMES)
def test_outputs_match_core(bare):
    core, ours = _op_defs(bare)
    assert odc.args(ours.output_arg) == odc.args(core.output_arg)


# The ops that address no engine; every other op of ours has one more attr
# than TF's, last: `engine` (string, default "", the process's default engine).
NO_ENGINE_ATTR = {"TPUEmbeddingActivations", "EmbeddingBag", "EmbeddingBagGrad"}


def _engine_attr_popped(bare, attrs):
    attrs = list(attrs)
    if bare not in NO_ENGINE_ATTR:
        last = attrs.pop()
        assert (last.name, last.type, last.default_value.s) == ("engine", "string", b""), bare
    assert "engine" not in [a.name for a in attrs], bare
    return attrs


@pytest.mark.parametrize("bare", tte_ops.CORE_OP_NAMES)
def test_attrs_match_core(bare):
    core, ours = _op_defs(bare)
    ours_attrs = _engine_attr_popped(bare, ours.attr)
    # In order: generated wrappers take the attrs positionally in this order.
    assert [a.name for a in ours_attrs] == [a.name for a in core.attr]
    for ours_attr, core_attr in zip(ours_attrs, core.attr):
        assert odc.attr(ours_attr) == odc.attr(core_attr), (bare, core_attr.name)


@pytest.mark.parametrize("bare", tte_ops.CORE_OP_NAMES)
def test_flags_match_core(bare):
    core, ours = _op_defs(bare)
    assert odc.flags(ours) == odc.flags(core)


def test_core_op_list_covers_tf_family():
    """Every per-table Load/Retrieve op TF registers for an optimizer is mirrored."""
    for info in OPTIMIZERS:
        for kind in ("Load", "Retrieve"):
            bare = "%sTPUEmbedding%sParameters" % (kind, info.op_infix)
            in_tf = op_def_registry.get(bare) is not None
            assert in_tf == info.core_has_table_ops, bare
            assert (bare in tte_ops.CORE_OP_NAMES) == in_tf, bare


@pytest.mark.parametrize("bare", tte_ops.EXTRA_OP_NAMES)
def test_extra_op_registered(bare):
    ours = op_def_registry.get(PREFIX + bare)
    assert ours is not None, PREFIX + bare
    # Engine ops touch the engine; the embedding bag is a pure function.
    assert ours.is_stateful == (bare not in ("EmbeddingBag", "EmbeddingBagGrad")), bare
    # "Extra" means TF has no such op; if TF grows one it belongs in CORE_OP_NAMES.
    assert op_def_registry.get(bare) is None, bare


def test_optimizer_table_covers_proto_oneof():
    oneof = optimization_parameters_pb2.OptimizationParameters.DESCRIPTOR.oneofs_by_name[
        "parameters"]
    fields = {f.name for f in oneof.fields} - {"user_defined_program"}
    assert [o.proto_field for o in OPTIMIZERS] == list(BY_PROTO_FIELD)
    # An older TF lacks the fields of the optimizers with a later min_tf.
    missing = set(tf_features.MISSING_OPTIMIZERS)
    assert all(tf_features.TF_VERSION < BY_PROTO_FIELD[f].min_tf for f in missing)
    assert set(BY_PROTO_FIELD) - missing == fields
    assert len({o.op_infix for o in OPTIMIZERS}) == len(OPTIMIZERS)


@pytest.mark.parametrize("info", OPTIMIZERS, ids=lambda o: o.proto_field)
def test_optimizer_table_matches_registry(info):
    tensors = ("parameters",) + tuple(info.slots)
    load = "LoadTPUEmbedding%sParameters" % info.op_infix
    retrieve = "RetrieveTPUEmbedding%sParameters" % info.op_infix
    ours_load = op_def_registry.get(PREFIX + load)
    ours_retrieve = op_def_registry.get(PREFIX + retrieve)
    assert ours_load is not None and ours_retrieve is not None
    assert tuple(a.name for a in ours_load.input_arg) == tensors
    assert not ours_load.output_arg
    assert tuple(a.name for a in ours_retrieve.output_arg) == tensors
    assert not ours_retrieve.input_arg
    assert all(a.type == tf.float32.as_datatype_enum
               for a in list(ours_load.input_arg) + list(ours_retrieve.output_arg))
    if info.core_has_table_ops:
        assert tuple(a.name for a in op_def_registry.get(load).input_arg) == tensors
        assert tuple(a.name for a in op_def_registry.get(retrieve).output_arg) == tensors


@pytest.mark.parametrize("info", OPTIMIZERS, ids=lambda o: o.proto_field)
def test_optimizer_slot_count_matches_all_tables_layout(info):
    """The C++ state-variable list (seen through RetrieveAll's shapes) has
    1 + len(slots) entries, plus the hidden gradient accumulator unless disabled."""
    GA = optimization_parameters_pb2.GradientAccumulationStatus
    config = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration()
    statuses = (GA.UNSPECIFIED, GA.ENABLED, GA.DISABLED)
    for status in statuses:
        table = config.table_descriptor.add(name="t%d" % status, vocabulary_size=6,
                                            dimension=3)
        getattr(table.optimization_parameters, info.proto_field).SetInParent()
        table.optimization_parameters.gradient_accumulation_status = status
    with tf.Graph().as_default():
        _, _, op, _ = op_def_library._apply_op_helper(
            PREFIX + "RetrieveAllTPUEmbeddingParameters", NumTables=len(statuses),
            config=config.SerializeToString(), num_shards=2, shard_id=0, engine="")
    for t, status in enumerate(statuses):
        shapes = [op.outputs[g * len(statuses) + t].shape.as_list() for g in range(8)]
        n_vars = 1 + len(info.slots) + (status != GA.DISABLED)
        assert shapes == [[3, 3]] * n_vars + [[0, 0]] * (8 - n_vars), (status, shapes)


def test_op_name_constants():
    assert tte_ops.RECV_TPU_EMBEDDING_ACTIVATIONS == "TfTpuEmb>RecvTPUEmbeddingActivations"
    assert tte_ops.TPU_EMBEDDING_ACTIVATIONS == "TfTpuEmb>TPUEmbeddingActivations"
    assert tte_ops.SEND_TPU_EMBEDDING_GRADIENTS == "TfTpuEmb>SendTPUEmbeddingGradients"
    assert tte_ops.LOAD_ALL_TPU_EMBEDDING_PARAMETERS == "TfTpuEmb>LoadAllTPUEmbeddingParameters"
    assert tte_ops.LOAD_TPU_EMBEDDING_ADAM_PARAMETERS == "TfTpuEmb>LoadTPUEmbeddingADAMParameters"
    assert (tte_ops.RETRIEVE_TPU_EMBEDDING_MDL_ADAGRAD_LIGHT_PARAMETERS
            == "TfTpuEmb>RetrieveTPUEmbeddingMDLAdagradLightParameters")
    assert (tte_ops.DYNAMIC_ENQUEUE_TPU_EMBEDDING_RAGGED_TENSOR_BATCH
            == "TfTpuEmb>DynamicEnqueueTPUEmbeddingRaggedTensorBatch")
    assert tte_ops.SHUTDOWN_TPU_EMBEDDING == "TfTpuEmb>ShutdownTPUEmbedding"
    constants = {k: v for k, v in vars(tte_ops).items()
                 if k.isupper() and isinstance(v, str) and v.startswith(PREFIX) and v != PREFIX}
    assert sorted(constants.values()) == sorted(tte_ops.OP_NAMES.values())
    missing_ops = {PREFIX + op for i in tf_features.MISSING_OPTIMIZERS.values()
                   for op in (i.load_op, i.retrieve_op)}
    for const_name, full in constants.items():
        # Each constant names a registered op (unless its optimizer is missing
        # from this TF's protos) and has a wrapper of the same name.
        assert (op_def_registry.get(full) is None) == (full in missing_ops), const_name
        assert callable(getattr(tte_ops, const_name.lower(), None)), const_name


def test_public_wrappers_have_docstrings():
    wrappers = [(name, fn) for name, fn in vars(tte_ops).items()
                if inspect.isfunction(fn) and not name.startswith("_")
                and fn.__module__ == tte_ops.__name__]
    assert len(wrappers) >= len(tte_ops.OP_NAMES)
    missing = [name for name, fn in wrappers if not (fn.__doc__ or "").strip()]
    assert not missing, missing
