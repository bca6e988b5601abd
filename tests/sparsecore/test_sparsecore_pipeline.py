"""The lookup and gradient kernels under TF's pipelining mark, one chip, no
stand-in system (docs/sparsecore_semantics.md "Pipelining",
kernels/sparsecore/pipeline.h): a lookup marked "forward" does not see the
last update marked "backward", the lookup after it does; an unmarked or
"..._sequential" op runs in program order; a row assigned since the update
is read as it is; a bad mark is no crash.  TF's own TPUEmbeddingV2 with the
flag: test_sparsecore_v2_standin.py."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import op_def_library

import sparsecore_reference as ref
from tf_tpu_emb import ops as tte_ops

pytestmark = [pytest.mark.usefixtures("lib")]

MARK = "_embedding_pipelining"
T0 = np.arange(8, dtype=np.float32).reshape(4, 2)
N = 8  # ids, padded: sample 0 -> row 0, sample 1 -> row 2


def _csr():
    return dict(row_pointers=np.array([2] + [8] * 7, np.int32),
                sorted_sample_ids=np.array([0, 1] + [ref.PAD] * 6, np.int32),
                sorted_token_ids=np.array([0, 2] + [ref.PAD] * 6, np.int32),
                sorted_gains=np.ones(N, np.float32),
                num_minibatches_per_physical_sparse_core=np.int32(1),
                num_sparsecores_per_device=1)


def _op(name, mark, **kwargs):
    _, _, op, _ = op_def_library._apply_op_helper(name, **kwargs)  # pylint: disable=protected-access
    if mark is not None:
        value = mark if isinstance(mark, attr_value_pb2.AttrValue) else \
            attr_value_pb2.AttrValue(s=mark.encode())
        op._set_attr(MARK, value)  # pylint: disable=protected-access
    return op


def lookup(table, mark="forward", name="pipelined"):
    @tf.function(autograph=False)
    def fn():
        op = _op("XlaSparseDenseMatmulWithCsrInput", mark, embedding_table=table.read_value(),
                 input_size=2, quantization_config_low=0.0, quantization_config_high=0.0,
                 quantization_config_num_buckets=0, table_name=name, **_csr())
        return op.outputs[0]
    return fn().numpy()


def update(table, mark="backward", in_place=True, name="pipelined"):
    """SGD at learning rate 1 with activation gradients of ones: rows 0 and 2 - 1."""
    grad = "XlaSparseDenseMatmulGradWithSgdAndCsrInput"

    @tf.function(autograph=False)
    def fn():
        args = dict(_csr(), activation_gradients=np.ones((2, 2), np.float32),
                    learning_rate=np.float32(1.0), clip_weight_min=-np.inf,
                    clip_weight_max=np.inf, table_name=name)
        if in_place:
            _op(tte_ops.PREFIX + grad + "InPlace", mark, embedding_table=table.handle, **args)
        else:  # TF's functional path: the output assigned (its only consumer)
            op = _op(grad, mark, embedding_table=table.read_value(), **args)
            table.assign(op.outputs[0])
    fn()
    return table.numpy()


@pytest.mark.parametrize("in_place", [True, False])
def test_a_marked_lookup_does_not_see_the_last_marked_update(in_place):
    table = tf.Variable(T0)
    np.testing.assert_array_equal(lookup(table), T0[[0, 2]])
    t1 = update(table, in_place=in_place)
    np.testing.assert_array_equal(t1[[0, 2]], T0[[0, 2]] - 1)  # the table is up to date
    np.testing.assert_array_equal(lookup(table), T0[[0, 2]])   # the next lookup: before it
    np.testing.assert_array_equal(lookup(table), t1[[0, 2]])   # the one after: with it
    t2 = update(table, in_place=in_place)
    t3 = update(table, in_place=in_place)  # two updates, no lookup between
    np.testing.assert_array_equal(lookup(table), t2[[0, 2]])
    np.testing.assert_array_equal(lookup(table), t3[[0, 2]])


def test_unmarked_and_sequential_ops_run_in_program_order():
    table = tf.Variable(T0)
    t1 = update(table)
    # An unmarked (or sequential) lookup sees the update and leaves the log
    # to the next marked lookup.
    np.testing.assert_array_equal(lookup(table, mark=None), t1[[0, 2]])
    np.testing.assert_array_equal(lookup(table, mark="forward_sequential"), t1[[0, 2]])
    np.testing.assert_array_equal(lookup(table), T0[[0, 2]])
    update(table)
    t3 = update(table, mark="backward_sequential")  # not pipelined: drops the log
    np.testing.assert_array_equal(lookup(table), t3[[0, 2]])
    t4 = update(table, mark=None)
    np.testing.assert_array_equal(lookup(table), t4[[0, 2]])


def test_rows_assigned_since_the_update_and_other_variables_are_read_as_they_are():
    table = tf.Variable(T0)
    t1 = update(table)
    changed = t1.copy()
    changed[0] += 100  # row 0 assigned since the update, row 2 as it left it
    table.assign(changed)
    # Row 0 is read as assigned.  (Row 2 is the update's "before" where the
    # assign wrote into the variable's buffer, else -- a new buffer, as here
    # eagerly -- the whole shard is read as it is.)
    np.testing.assert_array_equal(lookup(table)[0], changed[0])
    update(table)
    other = tf.Variable(T0 + 50)  # another variable, same table name
    np.testing.assert_array_equal(lookup(other), (T0 + 50)[[0, 2]])


@pytest.mark.parametrize("mark", [attr_value_pb2.AttrValue(i=3), "sideways", ""])
def test_a_bad_mark_runs_in_program_order(mark):
    table = tf.Variable(T0)
    update(table)
    t2 = update(table, mark=mark)
    np.testing.assert_array_equal(lookup(table, mark=mark), t2[[0, 2]])


def test_a_marked_user_function_optimizer_is_unimplemented():
    @tf.function(autograph=False)
    def sgd(grad, w, lr):
        return (w - lr * grad,)

    spec = tf.TensorSpec([1, 2], tf.float32)
    fn = sgd.get_concrete_function(spec, spec, spec)

    @tf.function(autograph=False)
    def run():
        fn.add_to_graph()
        args = dict(_csr(), activation_gradients=np.ones((2, 2), np.float32),
                    tables=[T0], hyperparameters=[np.float32(0.1)], table_name="pipelined",
                    custom_computation=attr_value_pb2.NameAttrList(name=fn.name))
        return _op("XlaSparseDenseMatmulGradWithCsrInput", "backward", **args).outputs[0]
    with pytest.raises(tf.errors.UnimplementedError, match="pipeline_execution_with_tensor_core"):
        run()
