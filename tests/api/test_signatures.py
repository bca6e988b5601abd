"""tf_tpu_emb.signatures: the one naming rule of flat serving signatures and
building a serving module without saving it."""
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_tpu_emb import serving
from tf_tpu_emb import signatures as S

E = tf.tpu.experimental.embedding


@pytest.mark.parametrize("path,suffix,canonical,v0", [
    ("user", None, "user", "user"),
    ("seq/clicks", "values", "seq_clicks_values", "seq_clicks_values"),
    ("a.b", "dense_shape", "a_b_dense_shape", "a_b_dense_shape"),
    ("0", None, "arg_0", "0"),
    ("", "indices", "arg__indices", "input_indices"),
])
def test_naming_rules(path, suffix, canonical, v0):
    assert S.input_name(path, suffix) == canonical
    assert S.v0_input_name(path, suffix) == v0


def test_output_names():
    t = tf.constant([1.0])
    assert list(S.output_dict(t)) == ["output_0"]
    assert list(S.output_dict([t, t])) == ["output_0", "output_1"]
    assert sorted(S.output_dict({"a": {"b": t}, "c": t})) == ["a/b", "c"]
    with pytest.raises(TypeError, match="dense tensors"):
        S.output_dict({"r": tf.ragged.constant([[1]])})


def test_flat_signature_round_trip():
    sig = {"sp": tf.SparseTensorSpec([None, 3], tf.int64),
           "rg": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1),
           "d": tf.TensorSpec([None], tf.int64)}
    flat = S.FlatSignature(sig, weighted=["sp"])
    assert sorted(flat.specs) == sorted(["sp_indices", "sp_values", "sp_dense_shape",
                                         "sp_weights", "rg_values", "rg_row_splits", "d"])
    sp = tf.sparse.from_dense(tf.constant([[1, 0, 2], [0, 3, 0]], tf.int64))
    rg = tf.ragged.constant([[4], [5, 6]], tf.int64)
    d = tf.constant([7, 8], tf.int64)
    tensors = {"sp_indices": sp.indices, "sp_values": sp.values,
               "sp_dense_shape": sp.dense_shape, "sp_weights": tf.constant([.5, 1., 2.]),
               "rg_values": rg.values, "rg_row_splits": rg.row_splits, "d": d}
    inputs, weights = flat.unflatten(tensors)
    np.testing.assert_array_equal(tf.sparse.to_dense(inputs["sp"]).numpy(),
                                  tf.sparse.to_dense(sp).numpy())
    assert inputs["rg"].to_list() == [[4], [5, 6]]
    np.testing.assert_array_equal(inputs["d"].numpy(), [7, 8])
    np.testing.assert_array_equal(weights["sp"].values.numpy(), [.5, 1., 2.])


def test_colliding_names_are_refused():
    sig = {"a/b": tf.TensorSpec([None], tf.int64), "a_b": tf.TensorSpec([None], tf.int64)}
    with pytest.raises(ValueError, match=r"collide: \['a_b'\]"):
        S.FlatSignature(sig)


def test_serving_module_builds_without_saving(tmp_path, monkeypatch):
    """serving_module gives the module in-process and writes nothing; its flat
    signature and its composite lookup agree; export_serving then saves it."""
    table = E.TableConfig(6, 2, name="t", combiner="sum", initializer=tf.constant_initializer(
        np.arange(12, dtype=np.float32).reshape(6, 2)))
    fc = {"f": E.FeatureConfig(table)}
    emb = E.TPUEmbeddingForServing(fc, E.SGD(0.1))
    emb.build()
    sig = {"f": tf.SparseTensorSpec([None, 2], tf.int64)}
    saved = []
    monkeypatch.setattr(tf.saved_model, "save", lambda *a, **k: saved.append(a))
    module = serving.serving_module(emb, sig)
    assert not saved
    sp = tf.sparse.from_dense(tf.constant([[1, 2], [5, 0]], tf.int64))
    composite = module.lookup({"f": sp})["f"].numpy()
    flat = module.serve({"f_indices": sp.indices, "f_values": sp.values,
                         "f_dense_shape": sp.dense_shape})["f"].numpy()
    np.testing.assert_array_equal(composite, flat)
    # sum combiner: rows 1 + 2, row 5 (the embedding table holds arange)
    np.testing.assert_array_equal(composite, [[2 + 4, 3 + 5], [10, 11]])
    monkeypatch.undo()
    out = os.path.join(str(tmp_path), "export")
    serving.export_serving(out, emb, sig)
    loaded = tf.saved_model.load(out)
    got = loaded.signatures[S.DEFAULT_SIGNATURE](
        f_indices=sp.indices, f_values=sp.values, f_dense_shape=sp.dense_shape)["f"]
    np.testing.assert_array_equal(got.numpy(), composite)
