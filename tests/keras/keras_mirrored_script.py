"""TPUEmbeddingLayer under MirroredStrategy (run by tests/keras/test_keras_layer.py).

TF's logical CPU devices must be configured before its runtime starts, so this
runs as its own process with 2 logical CPUs.  The same functional model (dense
ids + padded dense bags) is trained with an
unmodified ``model.fit``

1. with the default strategy (1 replica, global batch 8), then
2. built and fit inside ``MirroredStrategy(["/cpu:0", "/cpu:1"]).scope()``
   (2 replicas x 4),
3. the same with the bags as SparseTensors (no ``fix_distributed_fit``
   call: the layer applies it),

on the same data; the tables (engine SGD over the global batch, once per step)
and the Dense weights must agree, and so must predict/evaluate (with a
remainder batch).  A direct (cross-replica) inference call uses the stock
lookup.  Exit code 0 = pass.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402

from tf_tpu_emb.keras import TPUEmbeddingLayer, engine_owner  # noqa: E402

E = tf.tpu.experimental.embedding
GLOBAL_BATCH = 8
rng = np.random.default_rng(7)
N = 32
IDS = rng.integers(0, 10, N)
BAGS = rng.integers(-1, 7, (N, 3))   # -1 = padding
BAGS[:, 0] = rng.integers(0, 7, N)    # no empty bag
Y = rng.normal(size=(N, 1)).astype(np.float32)
TA0 = rng.normal(size=(10, 3)).astype(np.float32)
TB0 = rng.normal(size=(7, 2)).astype(np.float32)


def dataset(n=N, drop_remainder=True):
    return tf.data.Dataset.from_tensor_slices(
        ({"a": IDS[:n], "b": BAGS[:n]}, Y[:n])).batch(GLOBAL_BATCH,
                                                     drop_remainder=drop_remainder)


def sparse_bags(n):
    idx = np.argwhere(BAGS[:n] >= 0)
    return tf.SparseTensor(idx.astype(np.int64), BAGS[:n][BAGS[:n] >= 0].astype(np.int64),
                           [n, 3])


def sparse_dataset(n=N, drop_remainder=True):
    return tf.data.Dataset.from_tensor_slices(
        ({"a": IDS[:n], "b": sparse_bags(n)}, Y[:n])).batch(GLOBAL_BATCH,
                                                           drop_remainder=drop_remainder)


def make(sparse=False):
    ta = E.TableConfig(10, 3, name="ta")
    tb = E.TableConfig(7, 2, name="tb", combiner="sum")
    layer = TPUEmbeddingLayer({"a": E.FeatureConfig(ta), "b": E.FeatureConfig(tb)},
                              E.SGD(0.5), batch_size=GLOBAL_BATCH)
    inputs = {"a": keras.Input(shape=(), dtype="int64", name="a"),
              "b": keras.Input(shape=(None,) if sparse else (3,), dtype="int64", name="b",
                               sparse=sparse)}
    act = layer(inputs)
    x = keras.layers.Concatenate()([act["a"], act["b"]])
    out = keras.layers.Dense(1, kernel_initializer="ones", bias_initializer="zeros")(x)
    model = keras.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    tables = layer.table_variables()
    tables["ta"]["parameters"].assign(TA0)   # before the engine exists: the initial tables
    tables["tb"]["parameters"].assign(TB0)
    return model, layer


def run(model, layer, data=dataset):
    history = model.fit(data(), epochs=2, verbose=0)
    tables = {t: s["parameters"].numpy() for t, s in layer.table_variables().items()}
    dense = [w.numpy() for w in model.layers[-1].weights]
    pred = model.predict(data(N - 3, drop_remainder=False), verbose=0)
    loss = model.evaluate(data(N - 3, drop_remainder=False), verbose=0)
    return history.history["loss"], tables, dense, pred, loss


def compare(got, ref, what):
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, err_msg=what + " loss history")
    assert got[0][-1] < got[0][0], got[0]
    for name in ("ta", "tb"):
        assert np.abs(ref[1][name] - (TA0 if name == "ta" else TB0)).max() > 1e-3, name
        np.testing.assert_allclose(got[1][name], ref[1][name], rtol=1e-5, atol=1e-6,
                                   err_msg=what + " table " + name)
    for g, r in zip(got[2], ref[2]):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6, err_msg=what + " dense")
    np.testing.assert_allclose(got[3], ref[3], rtol=1e-5, atol=1e-5, err_msg=what + " predict")
    assert got[3].shape == (N - 3, 1)
    np.testing.assert_allclose(got[4], ref[4], rtol=1e-5, err_msg=what + " evaluate")


def main():
    model1, layer1 = make()
    ref = run(model1, layer1)
    layer1.release()
    assert engine_owner() is None

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        model2, layer2 = make()
    got = run(model2, layer2)
    assert layer2.per_replica_batch_size == GLOBAL_BATCH // 2, layer2.per_replica_batch_size
    assert layer2.embedding.config_proto  # configured with 2 tensor cores
    from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
    cfg = pb.TPUEmbeddingConfiguration.FromString(layer2.embedding.config_proto)
    assert cfg.num_tensor_cores == 2, cfg

    compare(got, ref, "mirrored")
    # The dummy weights stay zero on every replica.
    for v in layer2.dummy_variables:
        for local in strategy.experimental_local_results(v.value):
            assert not np.any(local.numpy()), local
    # Outside strategy.run: inference looks up the weights with stock ops,
    # training refuses.
    features = {"a": tf.constant(IDS[:5]), "b": tf.constant(BAGS[:5])}
    np.testing.assert_allclose(model2(features).numpy(), got[3][:5], rtol=1e-5, atol=1e-5)
    try:
        model2(features, training=True)
    except ValueError as e:
        assert "strategy.run" in str(e), e
    else:
        raise AssertionError("a cross-replica training call did not raise")
    layer2.release()

    # SparseTensor inputs: the layer applies fix_distributed_fit by itself.
    with strategy.scope():
        model3, layer3 = make(sparse=True)
    compare(run(model3, layer3, sparse_dataset), ref, "mirrored sparse")
    layer3.release()
    print("OK")


if __name__ == "__main__":
    try:
        main()
    except Exception:  # pylint: disable=broad-except
        import traceback
        traceback.print_exc()
        sys.exit(1)
