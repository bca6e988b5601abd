"""TPUEmbeddingLayer(cluster=...) in an unmodified model.fit on a 2-host loopback cluster.

The same model (a dense-id mean feature and a sparse-bag sum feature, both
tables sharded over the hosts, + Dense) is fitted once with the layer on the
cluster and once on the local engine, from the same initial weights and data
(three steps, the last a remainder batch the layer pads).  Tables, Dense
weights and losses agree: rtol 1e-5 (the hosts' partial activations are
summed in another order than one engine sums a bag).
"""
import numpy as np
import pytest
import tensorflow as tf
import keras

from cluster import connected_hosts
from tf_tpu_emb.keras import TPUEmbeddingLayer

pytestmark = [pytest.mark.system,
              pytest.mark.filterwarnings("ignore:`shuffle=True` was passed:UserWarning")]

E = tf.tpu.experimental.embedding
B, N = 4, 10
RNG = np.random.default_rng(77)
A_IDS = RNG.integers(0, 10, N)
B_BAGS = [list(RNG.integers(0, 7, RNG.integers(1, 4))) for _ in range(N)]
Y = RNG.normal(size=(N, 1)).astype(np.float32)
TABLES = {"ta": RNG.normal(size=(10, 3)).astype(np.float32),
          "tb": RNG.normal(size=(7, 2)).astype(np.float32)}
KERNEL = RNG.normal(size=(5, 1)).astype(np.float32)


@pytest.fixture(scope="module")
def hosts():
    with connected_hosts(2) as h:
        yield h


def dataset():
    idx = [(i, j) for i, bag in enumerate(B_BAGS) for j in range(len(bag))]
    bags = tf.SparseTensor(np.array(idx, np.int64), np.array(sum(B_BAGS, []), np.int64),
                           [N, 3])
    return tf.data.Dataset.from_tensor_slices(({"a": A_IDS, "b": bags}, Y)).batch(B)


def fit(optimizer, **cluster_options):
    ta = E.TableConfig(10, 3, name="ta")
    tb = E.TableConfig(7, 2, name="tb", combiner="sum")
    layer = TPUEmbeddingLayer({"a": E.FeatureConfig(ta), "b": E.FeatureConfig(tb)},
                              optimizer, batch_size=B, name="emb", **cluster_options)
    inputs = {"a": keras.Input(shape=(), dtype="int64", name="a"),
              "b": keras.Input(shape=(None,), dtype="int64", sparse=True, name="b")}
    act = layer(inputs)
    x = keras.layers.Concatenate()([act["a"], act["b"]])
    out = keras.layers.Dense(1, name="dense")(x)
    model = keras.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    for name, value in TABLES.items():
        layer.table_variables()[name]["parameters"].assign(value)
    model.get_layer("dense").set_weights([KERNEL, np.zeros([1], np.float32)])
    losses = model.fit(dataset(), epochs=2, verbose=0).history["loss"]
    tables = {t: {s: v.numpy() for s, v in states.items()}
              for t, states in layer.table_variables().items()}
    weights = [w.numpy() for w in model.get_layer("dense").weights]
    layer.release()
    return losses, tables, weights


@pytest.mark.parametrize("sharding", ["DIV_DEFAULT", "MOD"])
def test_fit_on_a_cluster_equals_the_local_engine(hosts, sharding):
    want = fit(E.Adagrad(0.2))
    got = fit(E.Adagrad(0.2), cluster=hosts, sharding_strategy=sharding)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for t in want[1]:
        assert np.abs(want[1][t]["parameters"] - TABLES[t]).max() > 1e-3  # it trained
        for s in want[1][t]:
            np.testing.assert_allclose(got[1][t][s], want[1][t][s], rtol=1e-5, atol=1e-6,
                                       err_msg="%s/%s" % (t, s))
    for g, w in zip(got[2], want[2]):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
