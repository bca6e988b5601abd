"""tf_tpu_emb.keras.TPUEmbeddingV0Layer: TPUEmbeddingV0 as a Keras layer.

model.fit trains the tables with the model's optimizer exactly as a
reference model built from stock lookups (tf.nn.safe_embedding_lookup_sparse
/ embedding_lookup, dense gradients) does; predict/evaluate; get_config ->
from_config; model.save(.keras) -> load_model predicting identically; the
stock-op serving export, loaded in a process without tf_tpu_emb; model.fit
under MirroredStrategy (tests/common/v0_strategy_script.py, 2 logical CPUs).
"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import keras
from tensorflow.python.util import nest

from tf_tpu_emb.keras import config as config_lib
from tf_tpu_emb.keras.v0_layers import TPUEmbeddingV0Layer, export_serving_v0
import harness  # tests/common: the one way to start a child process

E = tf.tpu.experimental.embedding
B = 8
HERE = os.path.dirname(os.path.abspath(__file__))


def feature_config():
    video = E.TableConfig(20, 4, combiner="sum", name="video",
                          initializer=tf.keras.initializers.RandomUniform(-0.5, 0.5, seed=1))
    user = E.TableConfig(11, 3, combiner="mean", name="user")
    return {"item": {"watched": E.FeatureConfig(video), "liked": E.FeatureConfig(video)},
            "user": {"friends": E.FeatureConfig(user),
                     "history": E.FeatureConfig(user, max_sequence_length=3)}}


def keras_inputs():
    return ({"item": {"watched": keras.Input(shape=(5,), sparse=True, dtype="int64",
                                             name="watched"),
                      "liked": keras.Input(shape=(), dtype="int32", name="liked")},
             "user": {"friends": keras.Input(shape=(None,), ragged=True, dtype="int64",
                                             name="friends"),
                      "history": keras.Input(shape=(6,), sparse=True, dtype="int64",
                                             name="history")}},
            keras.Input(shape=(5,), sparse=True, dtype="float32", name="watched_weights"))


def head(acts, seed=7):
    x = keras.layers.Concatenate()([acts["item"]["watched"], acts["item"]["liked"],
                                    acts["user"]["friends"],
                                    keras.layers.Flatten()(acts["user"]["history"])])
    x = keras.layers.Dense(5, activation="relu",
                           kernel_initializer=keras.initializers.GlorotUniform(seed=seed))(x)
    return keras.layers.Dense(
        1, kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 1))(x)


def make_model(layer_cls=TPUEmbeddingV0Layer):
    features, watched_w = keras_inputs()
    weights = {"item": {"watched": watched_w, "liked": None},
               "user": {"friends": None, "history": None}}
    acts = layer_cls(feature_config(), name="embedding")(features, weights)
    return keras.Model({"features": features, "watched_weights": watched_w}, head(acts))


class ReferenceEmbedding(keras.layers.Layer):
    """The same lookups from stock ops; ``table * 1.0`` makes the tables'
    gradients dense (the dense-gradient reference)."""

    def __init__(self, fc, **kwargs):
        super().__init__(**kwargs)
        self.fc = fc

    def build(self, *args, **kwargs):
        self.video = self.add_weight(name="video", shape=(20, 4))
        self.user = self.add_weight(name="user", shape=(11, 3))

    def compute_output_spec(self, features, weights=None):
        return {"item": {"watched": keras.KerasTensor((None, 4)),
                         "liked": keras.KerasTensor((None, 4))},
                "user": {"friends": keras.KerasTensor((None, 3)),
                         "history": keras.KerasTensor((None, 3, 3))}}

    def call(self, features, weights=None):
        video = tf.convert_to_tensor(self.video) * 1.0
        user = tf.convert_to_tensor(self.user) * 1.0
        hist = features["user"]["history"]
        hist = tf.sparse.slice(hist, [0, 0], tf.stack([hist.dense_shape[0], 3]))
        history = tf.scatter_nd(hist.indices, tf.gather(user, hist.values),
                                tf.stack([hist.dense_shape[0], 3, 3]))
        return {"item": {"watched": tf.nn.safe_embedding_lookup_sparse(
                             video, features["item"]["watched"], weights["item"]["watched"],
                             combiner="sum"),
                         "liked": tf.nn.embedding_lookup(video, features["item"]["liked"])},
                "user": {"friends": tf.nn.safe_embedding_lookup_sparse(
                             user, features["user"]["friends"].to_sparse(), None,
                             combiner="mean"),
                         "history": history}}


def make_data(seed=0, batches=3):
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(batches):
        lens = rng.integers(0, 6, B)
        idx = np.array([[b, j] for b in range(B) for j in range(lens[b])], np.int64).reshape(-1, 2)
        watched = tf.SparseTensor(idx, rng.integers(0, 20, len(idx)).astype(np.int64), [B, 5])
        watched_w = tf.SparseTensor(idx, rng.uniform(0.5, 2, len(idx)).astype(np.float32), [B, 5])
        hl = rng.integers(0, 7, B)
        hidx = np.array([[b, j] for b in range(B) for j in range(hl[b])], np.int64).reshape(-1, 2)
        history = tf.SparseTensor(hidx, rng.integers(0, 11, len(hidx)).astype(np.int64), [B, 6])
        fl = rng.integers(0, 4, B).astype(np.int64)
        friends = tf.RaggedTensor.from_row_lengths(
            rng.integers(0, 11, int(fl.sum())).astype(np.int64), fl)
        x = {"features": {"item": {"watched": watched,
                                   "liked": tf.constant(rng.integers(0, 20, B), tf.int32)},
                          "user": {"friends": friends, "history": history}},
             "watched_weights": watched_w}
        data.append((x, tf.constant(rng.normal(size=(B, 1)), tf.float32)))
    return data


SPEC = ({"features": {"item": {"watched": tf.SparseTensorSpec([None, 5], tf.int64),
                               "liked": tf.TensorSpec([None], tf.int32)},
                      "user": {"friends": tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64),
                               "history": tf.SparseTensorSpec([None, 6], tf.int64)}},
         "watched_weights": tf.SparseTensorSpec([None, 5], tf.float32)},
        tf.TensorSpec([None, 1], tf.float32))


def dataset(data):
    return tf.data.Dataset.from_generator(lambda: iter(data), output_signature=SPEC)


@pytest.fixture(scope="module")
def trained():
    """A model fitted (Adagrad) next to the stock-op reference model."""
    model, ref = make_model(), make_model(ReferenceEmbedding)
    ref.set_weights(model.get_weights())
    data = make_data()
    for m in (model, ref):
        m.compile(optimizer=keras.optimizers.Adagrad(0.2), loss="mse")
    h = model.fit(dataset(data), epochs=2, verbose=0).history["loss"]
    h_ref = ref.fit(dataset(data), epochs=2, verbose=0).history["loss"]
    return model, ref, data, h, h_ref


def test_fit_matches_stock_op_reference(trained):
    model, ref, data, h, h_ref = trained
    layer = model.get_layer("embedding")
    assert [w.path for w in layer.trainable_weights] == ["embedding/video", "embedding/user"]
    assert all(any(w is t for t in model.trainable_weights) for w in layer.trainable_weights)
    np.testing.assert_allclose(h, h_ref, rtol=1e-5)
    for a, b in zip(model.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    init = make_model().get_weights()
    assert not np.allclose(model.get_weights()[0], init[0])  # the tables did train
    np.testing.assert_allclose(model.predict(dataset(data), verbose=0),
                               ref.predict(dataset(data), verbose=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.evaluate(dataset(data), verbose=0),
                               ref.evaluate(dataset(data), verbose=0), rtol=1e-5)
    # The table gradients inside fit's step are IndexedSlices (unique rows).
    x, y = data[0]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    grads = tape.gradient(loss, layer.trainable_weights)
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)


def test_save_load_predict_identical(trained, tmp_path):
    model, _, data, _, _ = trained
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.get_layer("embedding"), TPUEmbeddingV0Layer)
    np.testing.assert_array_equal(model.predict(dataset(data), verbose=0),
                                  loaded.predict(dataset(data), verbose=0))
    assert model.evaluate(dataset(data), verbose=0) == loaded.evaluate(dataset(data), verbose=0)
    for a, b in zip(model.get_weights(), loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The loaded model trains on.
    loaded.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    loaded.fit(dataset(data), epochs=1, verbose=0)


def test_get_config_round_trip():
    video = E.TableConfig(20, 4, combiner="sqrtn", name="video",
                          optimizer=E.Adam(0.01, beta_1=0.8, lazy_adam=False,
                                           clipvalue=(None, 2.0)),
                          quantization_config=E.QuantizationConfig(4, -1.0, 1.0),
                          initializer=tf.keras.initializers.Constant(0.25))
    user = E.TableConfig(11, 3, name="user")
    fc = (E.FeatureConfig(video, name="a"), [E.FeatureConfig(user, output_shape=[2, 4]),
                                            E.FeatureConfig(video, max_sequence_length=5,
                                                            validate_weights_and_indices=False)])
    layer = TPUEmbeddingV0Layer(fc, optimizer=E.Adagrad(0.3, initial_accumulator_value=0.2),
                                name="emb")
    config = layer.get_config()
    json.dumps(config)  # plain values only
    again = TPUEmbeddingV0Layer.from_config(json.loads(json.dumps(config)))
    assert again.get_config() == config
    f = again.feature_config
    assert isinstance(f, tuple) and isinstance(f[1], list)
    assert f[0].table is f[1][1].table and f[0].table is not f[1][0].table  # shared table
    t = f[0].table
    assert (t.vocabulary_size, t.dim, t.combiner, t.name) == (20, 4, "sqrtn", "video")
    assert type(t.optimizer) is E.Adam and t.optimizer.beta_1 == 0.8
    assert not t.optimizer.lazy_adam and t.optimizer.clip_gradient_max == 2.0
    assert t.quantization_config.num_buckets == 4
    assert f[1][0].output_shape.as_list() == [2, 4] and f[1][1].max_sequence_length == 5
    assert f[1][1].validate_weights_and_indices is False
    assert f[1][0].table.optimizer.initial_accumulator_value == 0.2  # the layer's optimizer
    np.testing.assert_array_equal(t.initializer((2, 2)), np.full((2, 2), 0.25))
    # The embedding optimizer's slots are non-trainable weights.
    again.build()
    assert sorted(w.name for w in again.non_trainable_weights) == [
        "user_accumulators", "video_momenta", "video_velocities"]
    assert sorted(w.name for w in again.trainable_weights) == ["user", "video"]
    with pytest.raises(ValueError, match="Unknown"):  # only TF's / tf_tpu_emb's optimizers
        config_lib.deserialize_optimizer({"module": "os", "class_name": "system", "config": {}})


@pytest.mark.system
def test_serving_export_runs_without_tf_tpu_emb(trained, tmp_path):
    model, _, data, _, _ = trained
    path = str(tmp_path / "served")
    serve = export_serving_v0(path, model)  # export_serving's order
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        assert b"TfTpuEmb" not in f.read()  # stock ops only
    x, _ = data[1]
    expected = model.predict(x, verbose=0)
    np.testing.assert_allclose(serve(x), expected, rtol=1e-5, atol=1e-6)

    components = {}
    for key, value in nest.flatten_with_joined_string_paths(x):
        name = key.replace("/", "_")
        if isinstance(value, tf.SparseTensor):
            components.update({name + "_indices": value.indices, name + "_values": value.values,
                               name + "_dense_shape": value.dense_shape})
        elif isinstance(value, tf.RaggedTensor):
            components.update({name + "_values": value.values,
                               name + "_row_splits": value.row_splits})
        else:
            components[name] = value
    npz = str(tmp_path / "inputs.npz")
    np.savez(npz, __expected__=expected, **{k: v.numpy() for k, v in components.items()})
    proc = harness.run_python([harness.script(__file__, "v0_serving_load_script.py"), path, npz],
                              timeout=180)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)


@pytest.mark.system
def test_fit_under_mirrored_strategy_two_cpus():
    proc = harness.run_python([harness.common_script("v0_strategy_script.py"), "keras"],
                              timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)


@pytest.mark.system
def test_serving_export_old_argument_order_warns(trained, tmp_path):
    """export_serving_v0(model, filepath), the order of earlier releases, and
    filepath= by keyword still export, with a DeprecationWarning; a path that
    is no path is a TypeError."""
    model = trained[0]
    with pytest.warns(DeprecationWarning, match="pass the path first"):
        export_serving_v0(model, str(tmp_path / "old"))
    assert os.path.exists(os.path.join(str(tmp_path / "old"), "saved_model.pb"))
    with pytest.warns(DeprecationWarning, match="pass the path first"):
        export_serving_v0(model, filepath=str(tmp_path / "kw"))
    assert os.path.exists(os.path.join(str(tmp_path / "kw"), "saved_model.pb"))
    with pytest.raises(TypeError, match="path must be a str"):
        export_serving_v0(model, model)
