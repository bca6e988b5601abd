"""tf_tpu_emb.layout: the one Python home of config -> output shapes.

The layout the mid-level API builds from what it knows (no proto round trip)
must equal the layout parsed back from the configuration it sends the
engine, and both shape rules must agree with the activations the engine and
TPUEmbeddingV0 actually produce."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
from tensorflow.python.util import nest

import tf_tpu_emb
from tf_tpu_emb import layout as L
from tf_tpu_emb import ops as tte_ops

import mid_level_common as mc  # noqa: E402

E = tf.tpu.experimental.embedding


@pytest.fixture(autouse=True)
def release_engine():
    tf_tpu_emb.load_library()
    tte_ops.shutdown_tpu_embedding()
    try:
        yield
    finally:
        tte_ops.shutdown_tpu_embedding()


def _without_names(layout):
    return (layout.config, layout.feature_mode, layout.table_names, layout.table_dims,
            layout.output_tables, layout.output_shapes, layout.num_dynamic_inputs,
            [(f.table_id, f.lookup_id, f.output, f.shape) for f in layout.features])


def test_mid_level_layout_equals_the_parsed_config():
    fc, _ = mc.make_feature_config(mc.GLOBAL_BATCH)
    lr = tf.Variable(0.1)
    emb = tf_tpu_emb.TPUEmbedding(fc, E.Adagrad(lambda: lr))
    emb.build(per_replica_batch_size=mc.GLOBAL_BATCH)
    built = emb.layout
    parsed = L.Layout.from_config(emb.config_proto)
    assert _without_names(built) == _without_names(parsed)
    assert built.num_dynamic_inputs == 1
    paths = [p for p, _ in nest.flatten_with_joined_string_paths(fc)]
    assert list(built.feature_names) == paths
    emb.shutdown()


def test_output_shapes_match_the_engine_activations():
    """The rule's shapes for real inputs are the engine's Recv shapes."""
    fc, _ = mc.make_feature_config(mc.GLOBAL_BATCH)
    raw = mc.make_batch(np.random.default_rng(0))
    features, weights = mc.to_tensors(raw)
    emb = tf_tpu_emb.TPUEmbedding(fc, E.SGD(0.1))
    emb.enqueue(features, weights, training=False)
    act = tf.nest.flatten(emb.dequeue())
    for (path, feature), x, a in zip(nest.flatten_with_joined_string_paths(fc),
                                     tf.nest.flatten(features), act):
        if feature.output_shape:
            want = feature.output_shape.as_list()
        else:
            want = L.output_shape(feature, x.shape.as_list())
        assert a.shape.as_list() == want + [feature.table.dim], path
    emb.shutdown()


@pytest.mark.parametrize("shape,seq,want", [
    ([8], 0, [8]), ([8, 1], 0, [8]), ([8, 5], 0, [8]), ([8, 5], 3, [8, 3]),
    ([8, 1], 3, [8]), ([2, 4, 5], 3, [2, 4]), ([8, None], 0, [8]), ([8, None], 4, [8, 4])])
def test_output_shape_rule(shape, seq, want):
    """TF's mid-level rule (tpu_embedding_v2: a rank-2 sequence input gains
    max_sequence_length, the last dimension is reduced)."""
    table = E.TableConfig(10, 3, name="t")
    assert L.output_shape(E.FeatureConfig(table, max_sequence_length=seq), shape) == want


@pytest.mark.parametrize("kind", ["dense", "sparse", "ragged"])
def test_v0_output_shape_matches_tpu_embedding_v0(kind):
    """The V0 rule is what TPUEmbeddingV0 returns."""
    table = E.TableConfig(10, 3, name="t", initializer=tf.zeros_initializer())
    feature = E.FeatureConfig(table)
    ids = tf.constant([[1, 2], [3, 4]], tf.int64)
    x = {"dense": ids, "sparse": tf.sparse.from_dense(ids),
         "ragged": tf.RaggedTensor.from_tensor(ids)}[kind]
    v0 = tf_tpu_emb.TPUEmbeddingV0(feature, E.SGD(0.1))
    v0.build()
    got = v0.embedding_lookup(x)
    assert tuple(got.shape.as_list()) == L.v0_output_shape(feature, x.shape.as_list(), kind)


def test_send_inputs_invert_slicing_in_table_mode():
    c = pb.TPUEmbeddingConfiguration(batch_size_per_tensor_core=2)
    t = c.table_descriptor.add(name="t", vocabulary_size=5, dimension=3, num_features=4)
    t.optimization_parameters.stochastic_gradient_descent.SetInParent()
    layout = L.Layout.from_config(c, table_features=[["a", ("s", 2), "b"]])
    recv = [tf.reshape(tf.range(2 * 4 * 3, dtype=tf.float32), [8, 3])]
    sliced = L.slice_activations(layout, recv)
    assert [v.shape.as_list() for v in sliced.values()] == [[2, 3], [2, 2, 3], [2, 3]]
    back = L.send_inputs(layout, list(sliced.values()))
    np.testing.assert_array_equal(back[0].numpy(), recv[0].numpy())
