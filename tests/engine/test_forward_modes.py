"""Forward path of the engine: simulated quantization (on and disabled), the
inference/training mode and its override, and the activation queue (FIFO
order, Recv inside tf.function, initialization state, shutdown dropping
queued batches); checked against the numpy reference of spec §4.2.
"""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from forward_common import B, FEATURES, _feature_config, _tables
from tf_tpu_emb import ops as tte_ops

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


# ============================================== quantization, modes, queue

def test_simulated_quantization():
    q = (-0.5, 0.75, 6)
    config = eu.feature_mode_config(
        [TableSpec("q", 10, 4, quantization=q), TableSpec("plain", 10, 4)],
        [FeatureSpec("a", 0, [B]), FeatureSpec("b", 1, [B])])
    rng = np.random.default_rng(51)
    bags = [eu.random_bags(rng, B, 10, weighted=True) for _ in range(2)]
    with eu.engine(config):
        tables = eu.load_random_tables(config, 51)
        eu.enqueue_arbitrary([eu.sparse_to_enqueue(*eu.bags_to_sparse(b)) for b in bags],
                             combiners=["mean", "mean"])
        a, b = eu.recv(config)
    eu.assert_close(a, eu.reference_lookup(tables["q"][0], bags[0], "mean", quant=q))
    eu.assert_close(b, eu.reference_lookup(tables["plain"][0], bags[1], "mean"))
    # sanity: the quantized result is really different from the plain one
    assert not np.allclose(a, eu.reference_lookup(tables["q"][0], bags[0], "mean"))


def test_quantize_reference_hand_values():
    # lo=-1, hi=1, 5 buckets: step 0.5 -> grid {-1,-0.5,0,0.5,1}
    got = eu.quantize([-3.0, -0.76, -0.74, 0.1, 0.26, 0.9, 7.0], -1.0, 1.0, 5)
    np.testing.assert_array_equal(got, np.float32([-1, -1, -0.5, 0, 0.5, 1, 1]))


@pytest.mark.parametrize("config_mode,override", [
    (eu.INFERENCE, "unspecified"), (eu.TRAINING, "inference"), (eu.INFERENCE, "train")])
def test_inference_mode_lookup(config_mode, override):
    config = eu.feature_mode_config(_tables(), [FeatureSpec(n, t, [B]) for n, t in FEATURES],
                                    mode=config_mode)
    rng = np.random.default_rng(61)
    bags = [eu.random_bags(rng, B, 10 if t == 0 else 16) for _, t in FEATURES]
    with eu.engine(config):
        tables = eu.load_random_tables(config, 61)
        eu.enqueue_arbitrary([eu.sparse_to_enqueue(eu.bags_to_sparse(b)[0]) for b in bags],
                             combiners=["mean", "mean"], mode=override)
        got = eu.recv(config)
    for o, (_, t) in enumerate(FEATURES):
        eu.assert_close(got[o], eu.reference_lookup(tables[["video", "user"][t]][0], bags[o],
                                                    "mean"))


def test_queue_is_fifo():
    config = _feature_config()
    with eu.engine(config):
        tables = eu.load_random_tables(config, 71)
        batches = []
        for k in range(3):
            ids = [np.array([k, k + 1, k + 2, k + 3], np.int32) for _ in FEATURES]
            batches.append(ids)
            eu.enqueue_arbitrary([(eu.empty(tf.int32), i, eu.empty(tf.float32)) for i in ids])
        outs = [eu.recv(config) for _ in range(3)]
    for k in range(3):
        for o, (_, t) in enumerate(FEATURES):
            np.testing.assert_array_equal(outs[k][o],
                                          tables[["video", "user"][t]][0][batches[k][o]])


def test_recv_inside_tf_function():
    config = _feature_config()
    cfg = config.SerializeToString()

    @tf.function
    def step(ids0, ids1, ids2):
        e32, ef = tf.zeros([0], tf.int32), tf.zeros([0], tf.float32)
        enqueue = tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
            sample_indices_or_row_splits=[e32, e32, e32], embedding_indices=[ids0, ids1, ids2],
            aggregation_weights=[ef, ef, ef], mode_override="train")
        # TF's automatic control dependencies do not order stateful ops that
        # have no resource inputs, so the Recv must be ordered explicitly.
        with tf.control_dependencies([enqueue]):
            return tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=3, config=cfg)

    @tf.function
    def recv_only():  # our prefixed op inside a tf.function
        return tte_ops.recv_tpu_embedding_activations(num_outputs=3, config=cfg)

    with eu.engine(config):
        tables = eu.load_random_tables(config, 81)
        ids = [np.array([1, 2, 3, 4], np.int64), np.array([5, 6, 7, 15], np.int64),
               np.array([0, 9, 0, 9], np.int64)]
        outs = step(*ids)
        assert [o.shape.as_list() for o in outs] == eu.output_shapes(config)
        outs2 = step(*[i[::-1].copy() for i in ids])  # retrace-free second step
        eu.enqueue_arbitrary([(eu.empty(tf.int32), i, eu.empty(tf.float32)) for i in ids])
        outs3 = recv_only()
    names = ["video", "user", "video"]
    for o in range(3):
        t = tables[names[o]][0]
        np.testing.assert_array_equal(outs[o].numpy(), t[ids[o]])
        np.testing.assert_array_equal(outs2[o].numpy(), t[ids[o][::-1]])
        np.testing.assert_array_equal(outs3[o].numpy(), t[ids[o]])


def test_is_initialized_and_shutdown():
    assert not eu.is_initialized()
    config = _feature_config()
    with eu.engine(config):
        assert eu.is_initialized()
        assert bool(tte_ops.is_tpu_embedding_initialized().numpy())
    assert not eu.is_initialized()
    # reconfigure after shutdown works and starts from zero tables
    with eu.engine(config):
        eu.enqueue_arbitrary([(eu.empty(tf.int32), np.array([1, 2, 3, 4]), eu.empty(tf.float32))]
                             * 3)
        for o in eu.recv(config):
            assert not o.any()


def test_shutdown_drops_queued_batches():
    config = _feature_config()
    ids = [(eu.empty(tf.int32), np.array([1, 2, 3, 4], np.int32), eu.empty(tf.float32))] * 3
    with eu.engine(config):
        eu.enqueue_arbitrary(ids)
    with eu.engine(config):
        eu.assert_nothing_enqueued(config)


def test_quantization_disabled_is_plain_lookup():
    config = eu.feature_mode_config([TableSpec("q", 10, 4, quantization=(-0.1, 0.1, 3))],
                                    [FeatureSpec("a", 0, [B])])
    config.table_descriptor[0].optimization_parameters.simulated_quantization.enabled = False
    ids = np.array([0, 3, 5, 9], np.int32)
    with eu.engine(config):
        e = eu.load_random_tables(config, 96)["q"][0]
        eu.enqueue_arbitrary([(eu.empty(tf.int32), ids, eu.empty(tf.float32))])
        (got,) = eu.recv(config)
    np.testing.assert_array_equal(got, e[ids])
