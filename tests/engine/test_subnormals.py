"""float32 subnormals (issue 24 item 8; semantics §4.2 "Subnormals").

Decided: the engine's arithmetic flushes subnormals to zero, as a TPU does
(its float32 units flush denormals) and as TF's own CPU kernels do (TF's
executors run every kernel with flush-to-zero and denormals-are-zero set, so
``tf.nn.embedding_lookup_sparse`` flushes too); only copies keep them: Load
and Retrieve move table values bit for bit, as ``tf.gather`` does.  The
lookup and the row update set the mode themselves (engine/lookup.cc,
engine/apply.cc), so the result does not depend on the thread that runs them
(an immediate Recv, one resumed by a later enqueue, the intra-op pool).
"""
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from tf_tpu_emb import ops as tte_ops

SUB = np.float32(1e-40)          # subnormal (smallest normal is 1.18e-38)
TABLE = np.array([[SUB, -SUB, 1.0, 3e-39],
                  [2e-39, 0.5, SUB, -1.0],
                  [1.5e-38, 2.0, 4.0, 1.2e-38]], np.float32)
CONFIG = eu.feature_mode_config([TableSpec("t", 3, 4, optimizer="stochastic_gradient_descent")],
                                [FeatureSpec("f", 0, [3])])


def _flushed(x):
    x = np.array(x, np.float32)
    x[np.abs(x) < np.finfo(np.float32).tiny] = 0
    return x


@pytest.fixture
def engine(engine_released):
    del engine_released
    with eu.engine(CONFIG):
        tf.raw_ops.LoadTPUEmbeddingStochasticGradientDescentParameters(
            parameters=TABLE, table_name="t", num_shards=1, shard_id=0)
        yield


def _enqueue(combiner="sum", bags=((0,), (1,), (0, 1)), weights=None):
    splits = np.cumsum([0] + [len(b) for b in bags]).astype(np.int32)
    ids = np.array([i for b in bags for i in b], np.int64)
    w = np.array(weights, np.float32) if weights is not None else eu.empty(tf.float32)
    tte_ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
        [splits], [ids], [w], combiners=[combiner])


def _recv():
    return tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=1,
                                                  config=eu.serialize(CONFIG))[0].numpy()


def test_load_and_retrieve_keep_subnormals(engine):
    got = tf.raw_ops.RetrieveTPUEmbeddingStochasticGradientDescentParameters(
        table_name="t", num_shards=1, shard_id=0).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), TABLE.view(np.uint32))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_lookups_flush_subnormals_like_tfs_cpu_kernels(engine, combiner):
    _enqueue(combiner)
    got = _recv()
    want = _flushed(np.stack([TABLE[0], TABLE[1], TABLE[0] + TABLE[1]]))
    if combiner == "mean":
        want[2] = _flushed(want[2] / 2)
    elif combiner == "sqrtn":
        want[2] = _flushed(want[2] / np.sqrt(np.float32(2)))
    np.testing.assert_array_equal(got, want)
    assert not np.any((got != 0) & (np.abs(got) < np.finfo(np.float32).tiny))
    # TF's own CPU lookup with arithmetic flushes too (a 2-id bag), where a
    # pure copy (tf.gather) keeps the subnormals.
    sp = tf.sparse.SparseTensor([[0, 0], [0, 1]], tf.constant([0, 1], tf.int64), [1, 2])
    tf_bag = tf.nn.embedding_lookup_sparse(tf.constant(TABLE), sp, None, combiner=combiner)
    np.testing.assert_array_equal(tf_bag.numpy()[0], want[2])
    assert tf.gather(tf.constant(TABLE), [0]).numpy()[0, 0] == SUB


def test_a_product_that_becomes_subnormal_is_flushed(engine):
    _enqueue("sum", bags=((2,), (2,), (2,)), weights=[0.01, 1.0, 1e-38])
    got = _recv()
    np.testing.assert_array_equal(got[0], _flushed(TABLE[2] * np.float32(0.01)))
    np.testing.assert_array_equal(got[2], [0, 0, 0, 0])


def test_a_recv_resumed_by_a_later_enqueue_flushes_the_same(engine):
    out = []
    waiter = threading.Thread(target=lambda: out.append(_recv()))
    waiter.start()
    time.sleep(0.5)  # the Recv waits on the barrier; the enqueue resumes it
    _enqueue("sum")
    waiter.join()
    np.testing.assert_array_equal(out[0], _flushed(np.stack([TABLE[0], TABLE[1],
                                                             TABLE[0] + TABLE[1]])))


def test_row_updates_flush_subnormal_results(engine):
    # SGD with engine_util's learning rate 0.1: w - 0.1 * g for a normal w
    # just above the smallest normal lands below it, and becomes 0.
    _enqueue("sum", bags=((2,), (), ()))
    _recv()
    grad = np.zeros([3, 4], np.float32)
    grad[0] = [2e-37, 0, 0, 2e-37]  # lr * g = 2e-38: normal; w - 2e-38 is not
    tf.raw_ops.SendTPUEmbeddingGradients(inputs=[grad], learning_rates=[],
                                         config=eu.serialize(CONFIG))
    got = tf.raw_ops.RetrieveTPUEmbeddingStochasticGradientDescentParameters(
        table_name="t", num_shards=1, shard_id=0).numpy()
    assert got[2, 0] == 0 and got[2, 3] == 0, got[2]
    np.testing.assert_array_equal(got[2, 1:3], TABLE[2, 1:3])
