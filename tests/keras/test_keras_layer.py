"""tf_tpu_emb.keras.TPUEmbeddingLayer: Keras 3 (TF backend) models on the engine.

Functional models are trained with an unmodified ``model.fit`` on tf.data
datasets of dict features: the engine applies the tables' TPU-embedding
optimizer through the Activations-gradient -> Send path (checked against a
numpy reference of SGD on the tables + SGD on the Dense part), predict and
evaluate run in inference mode, and the layer round-trips through
get_config/from_config, model.save/keras.models.load_model and
get_weights/set_weights.  MirroredStrategy runs in a subprocess
(tests/keras/keras_mirrored_script.py), the stock-op serving export is loaded in a
subprocess without tf_tpu_emb (tests/common/serving_load_script.py).
"""
import gc
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.util import nest

import tf_tpu_emb
from tf_tpu_emb import engine_registry
from tf_tpu_emb import layout as layout_lib
from tf_tpu_emb import ops as emb_ops
from tf_tpu_emb.keras import (TPUEmbeddingLayer, engine_owner, export_serving,
                              release_engine, stock_lookup)
from tf_tpu_emb.serving import find_non_stock_ops
import harness  # tests/common: the one way to start a child process

# Keras warns that fit(shuffle=True) (its default) does not shuffle a tf.data.Dataset.
pytestmark = [pytest.mark.tf_version,
              pytest.mark.filterwarnings("ignore:`shuffle=True` was passed:UserWarning")]

E = tf.tpu.experimental.embedding
TESTS = os.path.dirname(os.path.abspath(__file__))
B = 4


@pytest.fixture(autouse=True)
def free_engine(lib):
    """Every test starts and ends with the process's engine free."""
    del lib
    release_engine()
    gc.collect()
    assert not engine_registry.engines()
    yield
    release_engine()
    gc.collect()
    if engine_registry.engines():  # pragma: no cover
        emb_ops.shutdown_tpu_embedding()
        pytest.fail("the test left the engine configured")


# ------------------------------------------------------------------ data

RNG = np.random.default_rng(1234)
N = 10  # 3 steps of B = 4: 4, 4 and a remainder batch of 2 (padded on the engine)
A_IDS = RNG.integers(0, 10, N)
B_BAGS = [list(RNG.integers(0, 7, RNG.integers(1, 4))) for _ in range(N)]
B_BAGS[3] = [5, 5]  # a repeated id in a bag
Y = RNG.normal(size=(N, 1)).astype(np.float32)
TA0 = RNG.normal(size=(10, 3)).astype(np.float32)
TB0 = RNG.normal(size=(7, 2)).astype(np.float32)


def bags_to_sparse(bags, width=3):
    idx = [(i, j) for i, bag in enumerate(bags) for j in range(len(bag))]
    vals = [v for bag in bags for v in bag]
    return tf.SparseTensor(np.array(idx, np.int64).reshape(-1, 2), np.array(vals, np.int64),
                           [len(bags), width])


def as_tensors(structure):
    return tf.nest.map_structure(
        lambda x: x if isinstance(x, (tf.SparseTensor, tf.RaggedTensor))
        else tf.convert_to_tensor(x), structure)


def dataset(n=N, batch=B, drop_remainder=False):
    return tf.data.Dataset.from_tensor_slices(
        ({"a": A_IDS[:n], "b": bags_to_sparse(B_BAGS[:n])}, Y[:n])).batch(
            batch, drop_remainder=drop_remainder)


def make_model(optimizer=None, batch_size=B, dense_lr=0.1, seed_tables=True):
    """Two features/tables (dense ids 'a' -> ta mean, sparse bags 'b' -> tb sum) + Dense(1)."""
    ta = E.TableConfig(10, 3, name="ta")
    tb = E.TableConfig(7, 2, name="tb", combiner="sum")
    layer = TPUEmbeddingLayer({"a": E.FeatureConfig(ta), "b": E.FeatureConfig(tb)},
                              optimizer or E.SGD(0.3), batch_size=batch_size, name="emb")
    inputs = {"a": keras.Input(shape=(), dtype="int64", name="a"),
              "b": keras.Input(shape=(None,), dtype="int64", sparse=True, name="b")}
    act = layer(inputs)
    x = keras.layers.Concatenate()([act["a"], act["b"]])
    out = keras.layers.Dense(1, name="dense",
                             kernel_initializer=keras.initializers.GlorotUniform(seed=5))(x)
    model = keras.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.SGD(dense_lr), loss="mse")
    if seed_tables:
        tables = layer.table_variables()
        tables["ta"]["parameters"].assign(TA0)
        tables["tb"]["parameters"].assign(TB0)
    return model, layer


def tables_of(layer):
    return {t: {s: v.numpy() for s, v in states.items()}
            for t, states in layer.table_variables().items()}


def forward(ta, tb, kernel, bias, ids, bags):
    act_a = ta[ids]
    act_b = np.stack([tb[bag].sum(0) for bag in bags])
    x = np.concatenate([act_a, act_b], 1)
    return x, x @ kernel + bias


def reference_fit(ta, tb, kernel, bias, lr_emb, lr_dense, batch=B):
    """numpy: one pass over the data; engine SGD on the tables, Keras SGD on Dense."""
    ta, tb, kernel, bias = ta.copy(), tb.copy(), kernel.copy(), bias.copy()
    losses = []
    for s in range(0, N, batch):
        ids, bags, y = A_IDS[s:s + batch], B_BAGS[s:s + batch], Y[s:s + batch]
        x, pred = forward(ta, tb, kernel, bias, ids, bags)
        losses.append(np.mean((pred - y) ** 2))
        dpred = 2 * (pred - y) / len(y)
        dx = dpred @ kernel.T
        g_ta, g_tb = np.zeros_like(ta), np.zeros_like(tb)
        for i, (a, bag) in enumerate(zip(ids, bags)):
            g_ta[a] += dx[i, :3]          # mean of one id
            for v in bag:
                g_tb[v] += dx[i, 3:]      # sum combiner
        kernel -= lr_dense * (x.T @ dpred)
        bias -= lr_dense * dpred.sum(0)
        ta -= lr_emb * g_ta
        tb -= lr_emb * g_tb
    return ta, tb, kernel, bias, losses


# ------------------------------------------------------------------ training

def test_fit_trains_tables_with_the_engine_optimizer():
    model, layer = make_model()
    kernel, bias = [w.numpy() for w in model.get_layer("dense").weights]
    assert [v.name for v in layer.weights] == ["ta_dummy", "tb_dummy", "ta_parameters",
                                               "tb_parameters"]
    assert not layer.engine_acquired  # building the model does not touch the engine

    history = model.fit(dataset(), epochs=1, verbose=0)
    assert layer.engine_acquired and engine_owner() is layer
    assert layer.per_replica_batch_size == B

    ta, tb, kernel_ref, bias_ref, losses = reference_fit(TA0, TB0, kernel, bias, 0.3, 0.1)
    got = tables_of(layer)
    np.testing.assert_allclose(got["ta"]["parameters"], ta, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["tb"]["parameters"], tb, rtol=1e-5, atol=1e-6)
    assert np.abs(got["tb"]["parameters"] - TB0).max() > 1e-3
    k, b = [w.numpy() for w in model.get_layer("dense").weights]
    np.testing.assert_allclose(k, kernel_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, bias_ref, rtol=1e-5, atol=1e-6)
    # Keras reports the mean of the per-step losses (weighted by batch size).
    sizes = [4, 4, 2]
    np.testing.assert_allclose(history.history["loss"][0],
                               np.dot(losses, sizes) / sum(sizes), rtol=1e-5)
    # The dummy weights got zero gradients from Keras' SGD.
    for v in layer.dummy_variables:
        assert not np.any(v.numpy())

    # More epochs: the loss keeps decreasing.
    losses = model.fit(dataset(), epochs=4, verbose=0).history["loss"]
    assert losses[-1] < history.history["loss"][0] / 2, losses


def test_keras_adam_with_zero_dummy_gradients_and_engine_adagrad():
    # Keras' Adam folds the dummy variables' zero gradient (see
    # gradients.hook_step); the Send must survive that, also in the
    # while loop of steps_per_execution > 1.
    model, layer = make_model(optimizer=E.Adagrad(0.2, initial_accumulator_value=0.5))
    model.compile(optimizer=keras.optimizers.AdamW(0.01, weight_decay=0.1), loss="mse",
                  steps_per_execution=2)
    before = tables_of(layer)
    np.testing.assert_allclose(before["tb"]["accumulators"], 0.5)
    losses = model.fit(dataset(), epochs=3, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    after = tables_of(layer)
    touched = sorted({v for bag in B_BAGS for v in bag})
    assert np.all(after["tb"]["accumulators"][touched] > 0.5)
    untouched = [v for v in range(7) if v not in touched]
    np.testing.assert_allclose(after["tb"]["accumulators"][untouched], 0.5)
    for v in layer.dummy_variables:
        assert not np.any(v.numpy())


def test_predict_and_evaluate_run_inference_without_send():
    model, layer = make_model()
    model.fit(dataset(), epochs=1, verbose=0)
    before = tables_of(layer)
    kernel, bias = [w.numpy() for w in model.get_layer("dense").weights]
    pred = model.predict(dataset(), verbose=0)          # remainder batch padded
    _, ref = forward(before["ta"]["parameters"], before["tb"]["parameters"], kernel, bias,
                     A_IDS, B_BAGS)
    np.testing.assert_allclose(pred, ref, rtol=1e-5, atol=1e-6)
    loss = model.evaluate(dataset(), verbose=0)
    np.testing.assert_allclose(loss, np.mean((ref - Y) ** 2), rtol=1e-5)
    # Direct calls (training=None -> inference) in eager mode and in a tf.function.
    features = {"a": tf.constant(A_IDS[:3]), "b": bags_to_sparse(B_BAGS[:3])}
    np.testing.assert_allclose(model(features).numpy(), ref[:3], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf.function(model)(features).numpy(), ref[:3], rtol=1e-5,
                               atol=1e-6)
    after = tables_of(layer)
    for t in before:
        np.testing.assert_array_equal(after[t]["parameters"], before[t]["parameters"])
    # No Send in the inference graph.
    graph = tf.function(lambda f: model(f, training=False)).get_concrete_function(
        features).graph.as_graph_def()
    ops = {n.op for n in graph.node}
    assert emb_ops.RECV_TPU_EMBEDDING_ACTIVATIONS in ops
    assert emb_ops.SEND_TPU_EMBEDDING_GRADIENTS not in ops
    # Training still works after inference batches, with validation in between.
    history = model.fit(dataset(), validation_data=dataset(), epochs=2, verbose=0)
    assert "val_loss" in history.history
    assert np.abs(tables_of(layer)["ta"]["parameters"] - before["ta"]["parameters"]).max() > 0


def test_frozen_layer_and_dynamic_learning_rate():
    rate = tf.Variable(0.0)
    model, layer = make_model(optimizer=E.SGD(learning_rate=lambda: rate))
    model.fit(dataset(), epochs=1, verbose=0)  # learning rate 0: tables unchanged
    np.testing.assert_allclose(tables_of(layer)["ta"]["parameters"], TA0)
    rate.assign(0.3)
    kernel, bias = [w.numpy() for w in model.get_layer("dense").weights]
    model.fit(dataset(), epochs=1, verbose=0)  # same graph, new rate
    ta, tb, _, _, _ = reference_fit(TA0, TB0, kernel, bias, 0.3, 0.1)
    got = tables_of(layer)
    np.testing.assert_allclose(got["ta"]["parameters"], ta, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["tb"]["parameters"], tb, rtol=1e-5, atol=1e-6)

    layer.trainable = False  # frozen: inference-mode enqueue, no Send; Dense still trains
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    kernel_before = model.get_layer("dense").weights[0].numpy()
    model.fit(dataset(), epochs=1, verbose=0)
    np.testing.assert_array_equal(tables_of(layer)["ta"]["parameters"], got["ta"]["parameters"])
    assert np.abs(model.get_layer("dense").weights[0].numpy() - kernel_before).max() > 0


# ------------------------------------------------------------- input kinds

def _kinds_model(batch_size=B):
    t1 = E.TableConfig(12, 3, name="t1", combiner="mean")
    t2 = E.TableConfig(9, 2, name="t2", combiner="sum")
    t3 = E.TableConfig(8, 4, name="t3", combiner="sqrtn")
    fc = {"d1": E.FeatureConfig(t1),                       # dense [B] (int32)
          "d2": E.FeatureConfig(t2),                       # dense [B, 1]
          "pad": E.FeatureConfig(t1),                      # dense [B, 3], -1 = padding
          "user": {"sp": E.FeatureConfig(t3),              # weighted sparse bags
                   "rg": E.FeatureConfig(t2)},             # ragged bags
          "seq": E.FeatureConfig(t1, max_sequence_length=3)}  # sparse sequence
    layer = TPUEmbeddingLayer(fc, E.SGD(0.1), batch_size=batch_size, name="emb")
    inputs = {"d1": keras.Input(shape=(), dtype="int32", name="d1"),
              "d2": keras.Input(shape=(1,), dtype="int64", name="d2"),
              "pad": keras.Input(shape=(3,), dtype="int64", name="pad"),
              "user": {"sp": keras.Input(shape=(None,), dtype="int64", sparse=True, name="sp"),
                       "rg": keras.Input(shape=(None,), dtype="int64", ragged=True,
                                         name="rg")},
              "seq": keras.Input(shape=(None,), dtype="int64", sparse=True, name="seq"),
              "w": keras.Input(shape=(None,), dtype="float32", sparse=True, name="w"),
              "pw": keras.Input(shape=(3,), dtype="float32", name="pw")}
    weights = {"d1": None, "d2": None, "pad": inputs["pw"],
               "user": {"sp": inputs["w"], "rg": None}, "seq": None}
    features = {k: v for k, v in inputs.items() if k not in ("w", "pw")}
    act = layer(features, weights=weights)
    return keras.Model(inputs, act), layer, inputs


KIND_ROWS = 6
KIND_DATA = {
    "d1": np.array([0, 11, 4, 4, 7, 2], np.int32),
    "d2": np.array([[1], [8], [0], [3], [3], [5]], np.int64),
    "pad": np.array([[1, 2, -1], [-1, -1, -1], [5, 5, 11], [0, -1, 3], [7, -1, -1],
                     [9, 10, 11]], np.int64),
    "sp": [[(0, 1), (1, 7)], [(0, 2)], [], [(0, 3), (2, 3), (3, 0)], [(1, 6)], [(0, 5)]],
    "w": [[0.5, 2.0], [3.0], [], [1.0, 1.0, 0.25], [2.0], [1.5]],
    "pw": np.array([[1.0, 3.0, 9.0], [1.0, 1.0, 1.0], [0.5, 0.25, 2.0], [2.0, 7.0, 1.0],
                    [4.0, 1.0, 1.0], [1.0, 2.0, 3.0]], np.float32),  # at padding: ignored
    "rg": [[1, 2], [], [8], [0, 0, 3], [4], [6, 7]],
    "seq": [[(0, 1), (2, 6)], [], [(1, 0), (4, 3)], [(0, 7), (1, 7), (2, 7)], [(0, 11)],
            [(1, 2)]],   # position 4 is cut (max_sequence_length 3)
}


def _kind_features(n=KIND_ROWS):
    def sparse(rows, values=None):
        idx = [(b, p) for b, r in enumerate(rows[:n]) for p, _ in r]
        vals = [v for r in rows[:n] for _, v in r] if values is None else \
            [w for r in values[:n] for w in r]
        dtype = tf.int64 if values is None else tf.float32
        return tf.SparseTensor(np.array(idx, np.int64).reshape(-1, 2),
                               tf.constant(vals, dtype), [n, 5])
    return {"d1": KIND_DATA["d1"][:n], "d2": KIND_DATA["d2"][:n], "pad": KIND_DATA["pad"][:n],
            "pw": KIND_DATA["pw"][:n],
            "user": {"sp": sparse(KIND_DATA["sp"]),
                     "rg": tf.ragged.constant(KIND_DATA["rg"][:n], dtype=tf.int64)},
            "seq": sparse(KIND_DATA["seq"]), "w": sparse(KIND_DATA["sp"], KIND_DATA["w"])}


def _kind_reference(tables, n=KIND_ROWS):
    t1, t2, t3 = tables["t1"]["parameters"], tables["t2"]["parameters"], \
        tables["t3"]["parameters"]
    pad = []
    for ids, w in zip(KIND_DATA["pad"][:n], KIND_DATA["pw"][:n]):
        keep = ids >= 0   # weighted mean over the non-padding ids
        pad.append((w[keep, None] * t1[ids[keep]]).sum(0) / w[keep].sum() if keep.any()
                   else np.zeros(3))
    ref = {"d1": t1[KIND_DATA["d1"][:n]], "d2": t2[KIND_DATA["d2"][:n, 0]],
           "pad": np.stack(pad)}
    sp = []
    for r, w in zip(KIND_DATA["sp"][:n], KIND_DATA["w"][:n]):
        ids, w = [v for _, v in r], np.array(w, np.float32)
        sp.append((w[:, None] * t3[ids]).sum(0) / np.sqrt((w ** 2).sum()) if ids
                  else np.zeros(4))
    rg = [t2[r].sum(0) if r else np.zeros(2) for r in KIND_DATA["rg"][:n]]
    seq = np.zeros([n, 3, 3], np.float32)
    for b, r in enumerate(KIND_DATA["seq"][:n]):
        for p, v in r:
            if p < 3:
                seq[b, p] = t1[v]
    ref["user"] = {"sp": np.stack(sp), "rg": np.stack(rg)}
    ref["seq"] = seq
    return ref


def test_input_kinds_nested_dicts_and_weights():
    model, layer, inputs = _kinds_model()
    specs = tf.nest.map_structure(lambda t: tuple(t.shape), model.outputs)
    assert sorted(map(tuple, specs)) == sorted([(None, 3), (None, 2), (None, 3), (None, 4),
                                                (None, 2), (None, 3, 3)])
    ds = tf.data.Dataset.from_tensor_slices(_kind_features()).batch(B)  # 4 + 2 (padded)
    got = model.predict(ds, verbose=0)
    ref = _kind_reference(tables_of(layer))
    flat_ref = dict(nest.flatten_with_joined_string_paths(ref))
    for path, value in nest.flatten_with_joined_string_paths(got):
        np.testing.assert_allclose(value, flat_ref[path], rtol=1e-5, atol=1e-6, err_msg=path)
    # The stock-op path (what the serving export traces) gives the same
    # activations, without the engine (a new call: Keras' traced predict
    # function would keep the engine path).
    layer.release()
    with stock_lookup(model):
        stock = model(as_tensors(_kind_features()))
    assert not layer.engine_acquired
    for path, value in nest.flatten_with_joined_string_paths(stock):
        np.testing.assert_allclose(value, flat_ref[path], rtol=1e-5, atol=1e-6,
                                   err_msg="stock " + path)

    # Training through every input kind (remainder batch included).
    x = keras.layers.Concatenate()([keras.layers.Flatten()(t) for t in
                                    tf.nest.flatten(model.outputs)])
    head = keras.layers.Dense(1)(x)
    trainer = keras.Model(inputs, head)
    trainer.compile(optimizer="sgd", loss="mse")
    before = tables_of(layer)
    y = np.ones([KIND_ROWS, 1], np.float32)
    ds = tf.data.Dataset.from_tensor_slices((_kind_features(), y)).batch(B)
    losses = trainer.fit(ds, epochs=3, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
    after = tables_of(layer)
    for t in ("t1", "t2", "t3"):
        assert np.abs(after[t]["parameters"] - before[t]["parameters"]).max() > 1e-4, t
    # Rows that no feature looks up do not move.
    np.testing.assert_array_equal(after["t3"]["parameters"][4], before["t3"]["parameters"][4])


def test_batch_size_errors():
    model, layer = make_model(batch_size=None)
    fn = tf.function(lambda f: model(f), input_signature=[
        {"a": tf.TensorSpec([None], tf.int64), "b": tf.SparseTensorSpec([None, None], tf.int64)}])
    with pytest.raises(ValueError, match="batch_size="):
        fn.get_concrete_function()   # no static batch dimension anywhere
    assert not layer.engine_acquired
    # The first traced batch's static dimension builds the engine.
    model.fit(dataset(8, drop_remainder=True), epochs=1, verbose=0)
    assert layer.per_replica_batch_size == 4
    assert layer.get_config()["batch_size"] == 4
    features = {"a": tf.constant(A_IDS[:6]), "b": bags_to_sparse(B_BAGS[:6])}
    with pytest.raises(tf.errors.InvalidArgumentError, match="per-replica batch size 4"):
        model(features)


# ------------------------------------------------------------------ weights

def test_get_weights_and_set_weights_follow_the_engine():
    model, layer = make_model(optimizer=E.Adagrad(0.2))
    model.fit(dataset(), epochs=1, verbose=0)
    # get_weights reads the engine (checked against the mid-level object's own retrieve).
    engine = {t.name: v.numpy() for t, v in layer.embedding.embedding_tables.items()}
    weights = dict(zip([v.name for v in model.weights], model.get_weights()))
    np.testing.assert_array_equal(weights["ta_parameters"], engine["ta"])
    np.testing.assert_array_equal(weights["tb_parameters"], engine["tb"])
    assert weights["tb_accumulators"].max() > 0.1

    # set_weights writes the engine: predictions use the new tables.
    new = [np.full_like(w, 0.5) if n.startswith(("ta_", "tb_")) else w
           for n, w in zip([v.name for v in model.weights], model.get_weights())]
    model.set_weights(new)
    kernel, bias = [w.numpy() for w in model.get_layer("dense").weights]
    _, ref = forward(np.full((10, 3), 0.5, np.float32), np.full((7, 2), 0.5, np.float32),
                     kernel, bias, A_IDS, B_BAGS)
    np.testing.assert_allclose(model.predict(dataset(), verbose=0), ref, rtol=1e-5)
    engine = {t.name: v.numpy() for t, v in layer.embedding.embedding_tables.items()}
    np.testing.assert_allclose(engine["ta"], 0.5)
    # A single assignment to a slot also reaches the engine (Adagrad's accumulators).
    layer.table_variables()["ta"]["accumulators"].assign(np.full((10, 3), 4.0, np.float32))
    model.fit(dataset(4), epochs=1, verbose=0)
    after = tables_of(layer)["ta"]
    used = A_IDS[0:4]
    assert np.all(after["accumulators"][used] > 4.0)
    np.testing.assert_allclose(np.delete(after["accumulators"], used, 0), 4.0)


def test_save_load_model_and_release(tmp_path):
    tmp = str(tmp_path)
    path = os.path.join(tmp, "model.keras")
    model, layer = make_model(optimizer=E.Adagrad(0.2))
    model.fit(dataset(), epochs=1, verbose=0)
    model.save(path)
    # Continue training the original for one more epoch: the reference.
    expected_pred = model.predict(dataset(), verbose=0)
    model.fit(dataset(), epochs=1, verbose=0)
    expected_after = tables_of(layer)
    expected_dense = [w.numpy() for w in model.get_layer("dense").weights]

    loaded = keras.models.load_model(path)
    new_layer = loaded.get_layer("emb")
    assert isinstance(new_layer, TPUEmbeddingLayer) and not new_layer.engine_acquired
    # The loaded copy runs on an engine of its own while `layer` keeps its engine.
    np.testing.assert_allclose(loaded.predict(dataset(), verbose=0), expected_pred,
                               rtol=1e-6, atol=1e-6)
    assert engine_owner() is new_layer and layer.engine_acquired
    layer.release()
    assert engine_owner() is new_layer and not layer.engine_acquired
    # Slots (Adagrad accumulators) and the Keras optimizer state were restored:
    # one more epoch gives what the original got.
    loaded.fit(dataset(), epochs=1, verbose=0)
    got = tables_of(new_layer)
    for t in expected_after:
        for s in expected_after[t]:
            np.testing.assert_allclose(got[t][s], expected_after[t][s], rtol=1e-5, atol=1e-6,
                                       err_msg=t + "/" + s)
    for g, e in zip([w.numpy() for w in loaded.get_layer("dense").weights], expected_dense):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    # The released layer kept its tables in its weights.
    np.testing.assert_array_equal(tables_of(layer)["ta"]["parameters"],
                                  expected_after["ta"]["parameters"])

    # save_weights / load_weights into the released model (written to the
    # engine when it owns it again).
    wpath = os.path.join(tmp, "loaded.weights.h5")
    loaded.save_weights(wpath)
    new_layer.release()
    model.load_weights(wpath)
    np.testing.assert_allclose(tables_of(layer)["tb"]["accumulators"],
                               got["tb"]["accumulators"])
    # Functions Keras traced before the release do not re-acquire the engine
    # (no Python runs); a new call or trace does.
    with pytest.raises(tf.errors.FailedPreconditionError, match="not configured"):
        model.predict(dataset(), verbose=0)
    model({"a": tf.constant(A_IDS[:4]), "b": bags_to_sparse(B_BAGS[:4])})
    assert engine_owner() is layer
    np.testing.assert_allclose(tables_of(layer)["tb"]["accumulators"],
                               got["tb"]["accumulators"])
    # Garbage collection releases the engine too.
    del model, layer
    gc.collect()
    assert engine_owner() is None
    assert not engine_registry.engines()


# ------------------------------------------------------------------ config

@keras.saving.register_keras_serializable(package="tf_tpu_emb_tests")
def decaying_rate():
    return 0.05


def test_get_config_from_config_round_trip():
    t1 = E.TableConfig(20, 4, name="t1", combiner="sqrtn",
                       optimizer=E.FTRL(0.1, l1_regularization_strength=0.01, beta=0.2))
    t2 = E.TableConfig(15, 2, name="t2", combiner="sum",
                       initializer=keras.initializers.RandomUniform(-0.1, 0.1, seed=3),
                       optimizer=tf_tpu_emb.Momentum(0.1, momentum=0.8, clipvalue=2.0),
                       quantization_config=E.QuantizationConfig(8, -1.0, 1.0))
    t3 = E.TableConfig(9, 3, name="t3", optimizer=E.Adam(decaying_rate, lazy_adam=False,
                                                          clipvalue=(None, 3.0)))
    t4 = E.TableConfig(5, 1, initializer=tf.zeros_initializer())  # unnamed, global optimizer
    fc = {"user": {"id": E.FeatureConfig(t1, name="uid"),
                   "hist": E.FeatureConfig(t2, max_sequence_length=5)},
          "items": [E.FeatureConfig(t1), E.FeatureConfig(t3, output_shape=[8, 2])],
          "pair": (E.FeatureConfig(t4), E.FeatureConfig(t2, validate_weights_and_indices=False))}
    layer = TPUEmbeddingLayer(fc, E.Adagrad(decaying_rate, weight_decay_factor=0.01,
                                            multiply_weight_decay_factor_by_learning_rate=True),
                              pipeline_execution_with_tensor_core=True, batch_size=8,
                              name="emb", trainable=False)
    config = layer.get_config()
    text = json.dumps(config)  # plain JSON
    clone = TPUEmbeddingLayer.from_config(json.loads(text))
    assert clone.get_config() == config
    assert clone.name == "emb" and not clone.trainable
    # Through Keras' own (de)serialization (what model.save uses).
    clone2 = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(layer))))
    assert isinstance(clone2, TPUEmbeddingLayer) and clone2.get_config() == config

    fc2 = clone.feature_config
    assert isinstance(fc2["items"], list) and isinstance(fc2["pair"], tuple)
    assert fc2["user"]["id"].table is fc2["items"][0].table  # shared table
    assert fc2["user"]["hist"].table is fc2["pair"][1].table
    assert fc2["user"]["id"].name == "uid"
    assert fc2["user"]["hist"].max_sequence_length == 5
    assert fc2["items"][1].output_shape.as_list() == [8, 2]
    assert fc2["pair"][1].validate_weights_and_indices is False
    t1b, t2b, t3b, t4b = (fc2["user"]["id"].table, fc2["user"]["hist"].table,
                          fc2["items"][1].table, fc2["pair"][0].table)
    assert isinstance(t1b.optimizer, E.FTRL) and t1b.optimizer.beta == 0.2
    assert isinstance(t2b.optimizer, tf_tpu_emb.Momentum)
    assert t2b.optimizer.momentum == 0.8
    assert (t2b.optimizer.clip_gradient_min, t2b.optimizer.clip_gradient_max) == (-2.0, 2.0)
    assert t2b.quantization_config.num_buckets == 8
    assert isinstance(t2b.initializer, keras.initializers.RandomUniform)
    assert t3b.optimizer.learning_rate is decaying_rate and t3b.optimizer.lazy_adam is False
    assert t3b.optimizer.clip_gradient_max == 3.0 and t3b.optimizer.clip_gradient_min is None
    assert t4b.optimizer is None  # takes the global optimizer when built
    assert t1b.combiner == "sqrtn" and t2b.combiner == "sum"

    # The rebuilt layer builds the same engine configuration.
    protos = []
    for each in (layer, clone):
        each.build()
        emb = each.embedding
        features = emb._features  # pylint: disable=protected-access
        emb._features = layout_lib.merge_output_shapes(  # pylint: disable=protected-access
            features, layout_lib.incoming_output_shapes(features, batch_size=4))
        protos.append(emb._create_config_proto())  # pylint: disable=protected-access
    assert protos[0] == protos[1]
    assert len(protos[0].table_descriptor) == 4
    assert not engine_registry.engines()


# ------------------------------------------------------------------ subprocesses

def _run(args, timeout=240):
    proc = harness.run_python(args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def test_mirrored_strategy_matches_one_replica():
    proc = _run([os.path.join(TESTS, "keras_mirrored_script.py")])
    assert "OK" in proc.stdout


def test_serving_export_of_stock_ops(tmp_path):
    t1 = E.TableConfig(10, 3, name="t1")
    t2 = E.TableConfig(7, 2, name="t2", combiner="sum")
    layer = TPUEmbeddingLayer({"a": E.FeatureConfig(t1), "b": E.FeatureConfig(t2),
                               "c": {"r": E.FeatureConfig(t1)}}, E.SGD(0.2), batch_size=B)
    inputs = {"a": keras.Input(shape=(), dtype="int64", name="a"),
              "b": keras.Input(shape=(None,), dtype="int64", sparse=True, name="b"),
              "c": {"r": keras.Input(shape=(None,), dtype="int64", ragged=True, name="r")},
              "scale": keras.Input(shape=(1,), dtype="float32", name="scale")}
    act = layer({"a": inputs["a"], "b": inputs["b"], "c": inputs["c"]})
    x = keras.layers.Concatenate()([act["a"], act["b"], act["c"]["r"], inputs["scale"]])
    out = keras.layers.Dense(2)(x)
    model = keras.Model(inputs, out)
    model.compile(optimizer="sgd", loss="mse")
    n = 6
    bags = [[1, 2], [0], [], [6, 6, 3], [5], [4, 1]]
    rag = [[3], [], [9, 9], [1, 2, 3], [0], [7]]
    features = {"a": A_IDS[:n], "b": bags_to_sparse(bags),
                "c": {"r": tf.ragged.constant(rag, dtype=tf.int64)},
                "scale": np.linspace(0, 1, n).astype(np.float32)[:, None]}
    ds = tf.data.Dataset.from_tensor_slices((features, np.ones([n, 2], np.float32))).batch(B)
    model.fit(ds, epochs=2, verbose=0)
    expected = model.predict(ds.map(lambda f, y: f), verbose=0)

    export_dir = str(tmp_path / "serving")
    module = export_serving(export_dir, model)
    assert find_non_stock_ops(export_dir) == []
    assert sorted(module.tables) == ["t1", "t2"]
    np.testing.assert_array_equal(module.tables["t2"].numpy(),
                                  tables_of(layer)["t2"]["parameters"])
    with stock_lookup(model):  # the same stock path in process (an eager call)
        eager = model(as_tensors(features))
        np.testing.assert_allclose(eager.numpy(), expected, rtol=1e-5, atol=1e-6)

    sp = bags_to_sparse(bags)
    rt = tf.ragged.constant(rag, dtype=tf.int64)
    flat = {"a": A_IDS[:n].astype(np.int64), "b_indices": sp.indices.numpy(),
            "b_values": sp.values.numpy(), "b_dense_shape": sp.dense_shape.numpy(),
            "c_r_values": rt.values.numpy(), "c_r_row_splits": rt.row_splits.numpy(),
            "scale": features["scale"]}
    np.savez(str(tmp_path / "in.npz"), **flat)
    cases = [{"dir": export_dir, "inputs": str(tmp_path / "in.npz"),
              "output": str(tmp_path / "out.npz"),
              "features": [["a", "dense", False], ["b", "sparse", False],
                           ["c/r", "ragged", False], ["scale", "dense", False]]}]
    with open(tmp_path / "cases.json", "w") as f:
        json.dump(cases, f)
    _run([harness.common_script("serving_load_script.py"), str(tmp_path / "cases.json")])
    with np.load(str(tmp_path / "out.npz")) as z:
        got = dict(z.items())
    np.testing.assert_allclose(got["sig/output_0"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["lookup/output_0"], expected, rtol=1e-5, atol=1e-6)
    assert sorted(got["tables"]) == ["t1", "t2"]


def test_training_none_never_silently_skips_training():
    """training=None: Keras' learning phase decides (fit passes True); a call
    nobody told under a recording GradientTape raises instead of looking up
    in inference mode (which would leave the tables unchanged, silently)."""
    model, layer = make_model()
    features, labels = next(iter(dataset()))
    before = tables_of(layer)["ta"]["parameters"].copy()
    model(features)                                     # no tape: a lookup, nothing to train
    with tf.GradientTape():
        with pytest.raises(ValueError, match="training=None under a recording GradientTape"):
            model(features)
    np.testing.assert_array_equal(tables_of(layer)["ta"]["parameters"], before)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(features, training=True) - labels) ** 2)
    tape.gradient(loss, model.trainable_weights)      # the Send runs with the gradient
    assert np.any(tables_of(layer)["ta"]["parameters"] != before)
    model.fit(dataset(), epochs=1, verbose=0)          # fit says training=True
    layer.release()
