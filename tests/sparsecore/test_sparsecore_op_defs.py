"""The SparseCore op family (ops/sparsecore_ops.cc) mirrors TensorFlow 2.21's op
defs field by field, and our shape functions infer what TF's own infer.

TF registers these 37 op defs (tensorflow/core/tpu/ops/sparse_core_ops.cc,
sparse_core_preprocess_ops.cc, tpu_copy_with_dynamic_shape_op.cc) with no CPU
kernel; ours are registered as ``TfTpuEmb>Name``.  The shape comparison builds
the core op and ours on the same inputs (shapes unknown, typical shapes, and
every input's rank changed in turn) and requires the same inferred shapes, or
both to fail.
"""
import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import op_def_library
from tensorflow.python.framework import op_def_registry

import op_def_compare as odc
import tf_features
from tf_tpu_emb import ops as tte_ops

PREFIX = tte_ops.PREFIX
NAMES = tte_ops.SPARSECORE_OP_NAMES

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


def _defs(bare):
    """TF's op def and ours.  Ours are TF 2.21's: an older TF (the old-TF lane)
    may lack the op or define it with fewer attrs; there the test is skipped."""
    core, ours = odc.registered(bare)
    if core is None:
        pytest.skip("this TensorFlow has no op %s" % bare)
    if tf_features.TF_VERSION < (2, 21) and [a.name for a in core.attr] != [
            a.name for a in ours.attr]:
        pytest.skip("TensorFlow %d.%d defines %s differently from 2.21" % (
            tf_features.TF_VERSION + (bare,)))
    return core, ours


def test_family_is_tf_2_21s_37_ops():
    assert len(NAMES) == len(set(NAMES)) == 37
    assert set(tte_ops.SPARSECORE_KERNEL_OP_NAMES) <= set(NAMES)
    assert not set(NAMES) & set(tte_ops.OP_NAMES)


@pytest.mark.parametrize("bare", NAMES)
def test_op_def_matches_core(bare):
    core, ours = _defs(bare)
    assert odc.args(ours.input_arg) == odc.args(core.input_arg)
    assert odc.args(ours.output_arg) == odc.args(core.output_arg)
    # In order: generated wrappers take the attrs positionally.  No `engine`
    # attr: none of these ops addresses an engine.
    assert [odc.attr(a) for a in ours.attr] == [odc.attr(a) for a in core.attr]
    assert odc.flags(ours) == odc.flags(core)


# ----------------------------------------------------------------- shapes

INT_ATTRS = {"sample_count": 8, "num_sc_per_chip": 2, "num_replica": 3,
             "max_minibatches_per_sc": 4, "max_ids_per_chip_per_sample": 8,
             "sample_count_per_sc": 4, "input_size": 6, "max_valency": 3, "num_weights": 2,
             "table_vocab_size": 32, "feature_width": 4, "N": 2, "M": 1,
             "num_sc_shards": 2, "stacked_table_sample_count": 8}

# Typical input shapes by name (None: unknown dimension).
SHAPES = {"embedding_table": [10, 4], "tables": [10, 4], "accumulator": [10, 4],
          "momenta": [10, 4], "momentum": [10, 4], "velocity": [10, 4], "linear": [10, 4],
          "activation_gradients": [6, 4], "gradient": [5, 4], "indices": [5],
          "learning_rate": [], "combiner_weights_learning_rate": [], "beta": [],
          "beta_1": [], "beta_2": [], "epsilon": [], "learning_rate_power": [],
          "l2_regularization_strength": [], "hyperparameters": [],
          "num_minibatches_per_physical_sparse_core": [], "offsets": [],
          "row_pointers": [16], "weights": [2], "preserved_weights": [2],
          "preserved_valencies": [6], "preserved_vectors": [6, 3, 4],
          "indices_or_row_splits": [9], "values": [8], "program_key": [1],
          "max_ids": [], "max_uniques": [], "splits": [1], "tensors": [3, 2],
          "unpadded_sizes": []}
DEFAULT_SHAPE = [12]  # ids, gains and the like


def _attrs(op_def):
    attrs = {}
    for a in op_def.attr:
        if a.name in INT_ATTRS and a.type == "int":
            attrs[a.name] = INT_ATTRS[a.name]
        elif a.type == "int":
            attrs[a.name] = 1
        elif a.type == "float":
            attrs[a.name] = 0.5
        elif a.type == "bool":
            attrs[a.name] = False
        elif a.type == "string":
            attrs[a.name] = "sum" if a.name == "combiner" else "t"
        elif a.type == "list(int)":
            attrs[a.name] = [4, 4]
        elif a.type == "func":
            attrs[a.name] = attr_value_pb2.NameAttrList(name="f")
        elif a.type == "list(type)":
            attrs[a.name] = [tf.float32, tf.int32]
        elif a.type == "type":
            attrs[a.name] = tf.float32
    return attrs


def _inputs(op_def, attrs, shape_of):
    inputs = {}
    for arg in op_def.input_arg:
        if arg.type_list_attr:
            dtypes = attrs[arg.type_list_attr]
        else:
            dtype = tf.as_dtype(arg.type) if arg.type else attrs[arg.type_attr]
            dtypes = [dtype] * (attrs[arg.number_attr] if arg.number_attr else 1)
        phs = [tf.compat.v1.placeholder(d, shape_of(arg.name)) for d in dtypes]
        inputs[arg.name] = phs if (arg.number_attr or arg.type_list_attr) else phs[0]
    return inputs


def _infer(name, op_def, attrs, shape_of):
    inferred = {n for a in op_def.input_arg
                for n in (a.number_attr, a.type_attr, a.type_list_attr) if n}
    with tf.Graph().as_default():
        try:
            _, _, op, _ = op_def_library._apply_op_helper(
                name, **_inputs(op_def, attrs, shape_of),
                **{k: v for k, v in attrs.items() if k not in inferred})
        except (ValueError, tf.errors.InvalidArgumentError):
            return "error"
        return [o.shape.as_list() if o.shape.rank is not None else None for o in op.outputs]


def _cases(op_def):
    typical = lambda n: SHAPES.get(n, DEFAULT_SHAPE)  # noqa: E731
    yield "unknown", lambda n: None
    yield "typical", typical
    for arg in op_def.input_arg:
        for rank in (0, 3):
            yield ("%s rank %d" % (arg.name, rank),
                   lambda n, a=arg.name, r=rank: [2] * r if n == a else typical(n))
        yield ("%s other length" % arg.name,
               lambda n, a=arg.name: [7] * len(typical(n)) if n == a else typical(n))


def _crashes_tf(bare, case):
    """TF's custom-combiner gradient shape function reads dimension 0 of the
    activation gradients and dimension 1 of the first table without a rank
    check: a scalar or vector there crashes the process.  Ours fails."""
    return "CustomCombinerOnTcGrad" in bare and case in (
        "activation_gradients rank 0", "embedding_table rank 0", "tables rank 0")


@pytest.mark.parametrize("bare", NAMES)
def test_inferred_shapes_match_core(bare):
    core, ours = _defs(bare)
    attrs = _attrs(core)
    for case, shape_of in _cases(core):
        got = _infer(PREFIX + bare, ours, attrs, shape_of)
        if _crashes_tf(bare, case):
            assert got == "error", (bare, case)
            continue
        want = _infer(bare, core, attrs, shape_of)
        assert got == want, (bare, case)


def test_attr_errors_match_core():
    """SortListOfSparseCoreCooTensors checks its per-feature lists against N."""
    bare = "SortListOfSparseCoreCooTensors"
    core, ours = _defs(bare)
    attrs = dict(_attrs(core), sample_count_list=[4])
    assert _infer(bare, core, attrs, lambda n: None) == "error"
    assert _infer(PREFIX + bare, ours, attrs, lambda n: None) == "error"
    attrs = dict(_attrs(core), col_offset_list=[0, 0, 0])
    assert _infer(PREFIX + bare, ours, attrs, lambda n: None) == "error"


@pytest.mark.parametrize("bare", NAMES)
def test_kernel_list_is_true(bare):
    """SPARSECORE_KERNEL_OP_NAMES names exactly the ops with our CPU kernels
    (TF 2.21's wheel registers none for this family)."""
    from tensorflow.python.framework import kernels as tf_kernels

    ours = tf_kernels.get_registered_kernels_for_op(PREFIX + bare).kernel
    assert bool(ours) == (bare in tte_ops.SPARSECORE_KERNEL_OP_NAMES), bare
    if op_def_registry.get(bare) is not None:
        core = tf_kernels.get_registered_kernels_for_op(bare).kernel
        assert bool(core) == (bare in tte_ops.SPARSECORE_KERNEL_OP_NAMES), bare
