"""tf_tpu_emb.gradients' Layout (features, lookup ids, output shapes, in
feature-descriptor and table mode, v1 table slicing) and the Send it builds:
send_gradients_op(slice_activations(x)) hands the Send exactly x, and its
arguments are checked."""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from gradients_common import B, L, SGD, _feature_config
from tf_tpu_emb import gradients as G
from tf_tpu_emb import ops as tte_ops

pytestmark = pytest.mark.usefixtures("lib")


# ================================================================== layout

def test_layout_feature_mode_lookup_ids_and_shapes():
    config = eu.feature_mode_config(
        [TableSpec("a", 5, 2, SGD), TableSpec("b", 5, 3, SGD, lr_tag=0)],
        [FeatureSpec("x", 0, [4]), FeatureSpec("y", 1, [4, 3]), FeatureSpec("z", 0, [2, 2])])
    layout = G.Layout.from_config(config)
    assert layout.feature_mode and layout.num_dynamic_inputs == 1
    assert [(f.name, f.table_id, f.lookup_id, f.output, f.shape) for f in layout.features] == [
        ("x", 0, 0, 0, (4, 2)), ("y", 1, 0, 1, (4, 3, 3)), ("z", 0, 1, 2, (2, 2, 2))]
    assert layout.output_tables == (0, 1, 0)
    assert [list(s) for s in layout.output_shapes] == eu.output_shapes(config)
    assert layout.config == config.SerializeToString()
    assert G.Layout.from_config(config.SerializeToString()) == layout
    with pytest.raises(ValueError, match="table_features is only for"):
        G.Layout.from_config(config, [["x"]])


def test_layout_table_mode():
    config = eu.table_mode_config([TableSpec("a", 5, 2, SGD, num_features=L + 1),
                                   TableSpec("b", 5, 3, SGD, num_features=1)], B)
    layout = G.Layout.from_config(config, {"a": [("s", L), "p"], "b": ["q"]})
    assert not layout.feature_mode and layout.batch_size == B
    assert [(f.name, f.table_id, f.lookup_id, f.offset, f.width, f.shape)
            for f in layout.features] == [("s", 0, 0, 0, L, (B, L, 2)),
                                          ("p", 0, 1, L, 1, (B, 2)),
                                          ("q", 1, 0, 0, 1, (B, 3))]
    assert layout.output_shapes == ((B * (L + 1), 2), (B, 3))
    assert G.Layout.from_config(config, [[("s", L), "p"], ["q"]]) == layout
    with pytest.raises(ValueError, match="needs table_features"):
        G.Layout.from_config(config)
    with pytest.raises(ValueError, match="num_features 3 but .* take 2 rows"):
        G.Layout.from_config(config, [["s", "p"], ["q"]])
    with pytest.raises(ValueError, match="unique"):
        G.Layout.from_config(config, [[("s", L), "q"], ["q"]])
    with pytest.raises(ValueError, match="unknown table"):
        G.Layout.from_config(config, {"a": [("s", L), "p"], "c": ["q"]})


def test_send_inputs_are_the_inverse_of_slicing():
    """send_gradients_op(slice_activations(x)) hands the Send exactly x, in
    both modes (checked on the built op's inputs; the Send is not run)."""
    table_config = eu.table_mode_config([TableSpec("a", 5, 2, SGD, num_features=L + 2),
                                         TableSpec("b", 5, 3, SGD, num_features=1)], B)
    layouts = [G.Layout.from_config(table_config, [["p0", ("s", L), "p1"], ["q"]]),
               G.Layout.from_config(_feature_config())]
    rng = np.random.default_rng(0)
    for layout in layouts:
        x = [rng.standard_normal(s).astype(np.float32) for s in layout.output_shapes]
        with tf.Graph().as_default() as g:
            acts = G.slice_activations(layout, [tf.constant(a) for a in x])
            for f in layout.features:
                assert acts[f.name].shape == f.shape
            send = G.send_gradients_op(layout, acts)
            assert send.type == tte_ops.SEND_TPU_EMBEDDING_GRADIENTS
            assert send.get_attr("config") == layout.config
            with tf.compat.v1.Session(graph=g) as sess:
                got = sess.run(list(send.inputs))
        for a, b in zip(got, x):
            np.testing.assert_array_equal(a, b)


def test_send_gradients_op_checks_arguments():
    layout = G.Layout.from_config(_feature_config(video_lr_tag=0))
    with tf.Graph().as_default():
        grads = {f.name: tf.zeros(f.shape) for f in layout.features}
        with pytest.raises(ValueError, match="1 dynamic learning rate tag.*0 learning rates"):
            G.send_gradients_op(layout, grads)
        with pytest.raises(ValueError, match="unknown feature"):
            G.send_gradients_op(layout, dict(grads, nope=tf.zeros([1])), [0.1])
        with pytest.raises(ValueError, match="Found gradient of shape .* 'friends'"):
            G.send_gradients_op(layout, dict(grads, friends=tf.zeros([B, 4])), [0.1])
        send = G.send_gradients_op(layout, grads, [0.5])
        assert len(send.inputs) == 3 + 1
