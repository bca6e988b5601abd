"""Two TPUEmbeddingLayers in one Keras model, each on an engine of its own
(README "Several engines per process"), train with an unmodified
``model.fit``: the same as one layer holding both tables with the same
per-table optimizers (that path is checked against numpy in
test_keras_layer.py), and a layer's release leaves the other's engine alone.
"""
import gc

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_tpu_emb import engine_registry
from tf_tpu_emb.keras import TPUEmbeddingLayer, release_engine

pytestmark = pytest.mark.filterwarnings("ignore:`shuffle=True` was passed:UserWarning")

E = tf.tpu.experimental.embedding
B = 4
N = 12
RNG = np.random.default_rng(77)
A_IDS = RNG.integers(0, 10, N)
B_IDS = RNG.integers(0, 7, (N, 2))
Y = RNG.normal(size=(N, 1)).astype(np.float32)
TA0 = RNG.normal(size=(10, 3)).astype(np.float32)
TB0 = RNG.normal(size=(7, 2)).astype(np.float32)


@pytest.fixture(autouse=True)
def free_engines(lib):
    del lib
    yield
    release_engine()
    gc.collect()
    assert not engine_registry.engines()


def dataset():
    sparse_b = tf.SparseTensor([[i, j] for i in range(N) for j in range(2)],
                               B_IDS.reshape(-1), [N, 2])
    return tf.data.Dataset.from_tensor_slices(({"a": A_IDS, "b": sparse_b}, Y)).batch(B)


def tables():
    ta = E.TableConfig(10, 3, name="ta", optimizer=E.SGD(0.3))
    tb = E.TableConfig(7, 2, name="tb", combiner="sum",
                       optimizer=E.Adagrad(0.2, initial_accumulator_value=0.1))
    return ta, tb


def make_model(two_layers):
    ta, tb = tables()
    inputs = {"a": keras.Input(shape=(), dtype="int64", name="a"),
              "b": keras.Input(shape=(None,), dtype="int64", sparse=True, name="b")}
    if two_layers:
        layers = [TPUEmbeddingLayer({"a": E.FeatureConfig(ta)}, E.SGD(0.3), batch_size=B,
                                    name="emb_a"),
                  TPUEmbeddingLayer({"b": E.FeatureConfig(tb)}, E.Adagrad(0.2), batch_size=B,
                                    name="emb_b")]
        act_a = layers[0]({"a": inputs["a"]})["a"]
        act_b = layers[1]({"b": inputs["b"]})["b"]
    else:
        layers = [TPUEmbeddingLayer({"a": E.FeatureConfig(ta), "b": E.FeatureConfig(tb)},
                                    E.SGD(0.3), batch_size=B, name="emb")]
        act = layers[0](inputs)
        act_a, act_b = act["a"], act["b"]
    x = keras.layers.Concatenate()([act_a, act_b])
    out = keras.layers.Dense(1, name="dense",
                             kernel_initializer=keras.initializers.GlorotUniform(seed=3))(x)
    model = keras.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    for layer in layers:
        for name, states in layer.table_variables().items():
            states["parameters"].assign({"ta": TA0, "tb": TB0}[name])
    return model, layers


def table_values(layers):
    return {t: {s: v.numpy() for s, v in states.items()}
            for layer in layers for t, states in layer.table_variables().items()}


def test_two_layers_fit_like_one_layer_with_both_tables():
    ref_model, ref_layers = make_model(two_layers=False)
    ref_losses = ref_model.fit(dataset(), epochs=2, verbose=0).history["loss"]
    want = table_values(ref_layers)
    want_dense = [w.numpy() for w in ref_model.get_layer("dense").weights]
    ref_layers[0].release()

    model, layers = make_model(two_layers=True)
    losses = model.fit(dataset(), epochs=2, verbose=0).history["loss"]
    assert all(layer.engine_acquired for layer in layers)
    assert len(set(engine_registry.engines())) == 2
    got = table_values(layers)
    assert sorted(got) == sorted(want) == ["ta", "tb"]
    for t in want:
        for s in want[t]:
            np.testing.assert_allclose(got[t][s], want[t][s], rtol=1e-6, atol=1e-7,
                                       err_msg=t + "/" + s)
    assert np.abs(got["tb"]["parameters"] - TB0).max() > 1e-3
    for g, w in zip([w.numpy() for w in model.get_layer("dense").weights], want_dense):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)

    # Releasing one layer leaves the other's engine (and predictions) working.
    layers[0].release()
    assert not layers[0].engine_acquired and layers[1].engine_acquired
    assert len(engine_registry.engines()) == 1
    np.testing.assert_allclose(model.predict(dataset(), verbose=0),
                               ref_model.predict(dataset(), verbose=0), rtol=1e-6, atol=1e-6)
