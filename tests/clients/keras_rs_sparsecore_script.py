"""Keras-RS 0.4.0's DistributedEmbedding with ``placement="sparsecore"`` on the
stand-in SparseCore TPU (run by tests/clients/test_keras_rs_sparsecore.py in
the client venv, under ``python -m tf_tpu_emb.run --embedding v2 --replicas R``).

``python keras_rs_sparsecore_script.py OPTIMIZER R``: Keras-RS sees embedding
feature V2 and builds TF's ``TPUEmbeddingV2`` (its SparseCore path); ``fit``
trains the table through TF's SparseCore ops, checked after every step
against the numpy formula of a global-batch step (the table read through
Keras-RS's own ``get_embedding_tables``, which unshards TF's layout).
OPTIMIZER: ``sgd`` or ``adagrad``.  Prints ``LOSSES`` and ``TABLES``, then OK.
"""
import json
import sys

import keras
import keras_rs
import numpy as np
import tensorflow as tf

import client_strategy
import optimizer_reference as ref

OPT, R = sys.argv[1], int(sys.argv[2])
# 64 rows: a multiple of R * 4 SparseCores for R up to 8, so TF's layout has
# no padding rows for Keras-RS's reader to strip.
VOCAB, DIM, PER_REPLICA, STEPS, LR, ACC0 = 64, 8, 8, 4, 0.3, 0.1
GLOBAL = PER_REPLICA * R
rng = np.random.default_rng(5)
C = rng.normal(size=(DIM, 1)).astype(np.float32)
IDS = rng.integers(0, VOCAB, (STEPS * GLOBAL,)).astype(np.int32)
IDS[: STEPS * GLOBAL // 3] %= 6  # repeated ids within and across replicas
Y = rng.normal(size=(STEPS * GLOBAL, 1)).astype(np.float32)

strategy = client_strategy.make("tpu", R)
feature = strategy.extended.tpu_hardware_feature
assert feature.embedding_feature == feature.embedding_feature.V2, feature.embedding_feature


def optimizer():
    if OPT == "sgd":
        return keras.optimizers.SGD(learning_rate=LR)
    return keras.optimizers.Adagrad(learning_rate=LR, initial_accumulator_value=ACC0)


with strategy.scope():
    table = keras_rs.layers.TableConfig(
        name="t", vocabulary_size=VOCAB, embedding_dim=DIM,
        initializer=keras.initializers.RandomNormal(seed=3), optimizer=optimizer(),
        combiner="sum", placement="sparsecore")
    features = {"f": keras_rs.layers.FeatureConfig(name="f", table=table,
                                                   input_shape=(GLOBAL,),
                                                   output_shape=(GLOBAL, DIM))}
    embedding = keras_rs.layers.DistributedEmbedding(features)
    inputs = {"f": keras.Input(shape=(), dtype="int32", name="f")}
    out = keras.layers.Dense(1, use_bias=False, trainable=False,
                             kernel_initializer=keras.initializers.Constant(C))(
                                 embedding(inputs)["f"])
    model = keras.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")


def tables():
    with strategy.scope():
        return np.asarray(embedding.get_embedding_tables()["t"])


def dataset():
    return tf.data.Dataset.from_tensor_slices(({"f": IDS}, Y)).batch(GLOBAL, drop_remainder=True)


start = tables()
snapshots = []
history = model.fit(dataset(), epochs=1, verbose=0, callbacks=[keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda b, logs: snapshots.append(tables()))])
assert len(snapshots) == STEPS
losses = [float(v) for v in history.history["loss"]]
print("embedding class: %s.%s" % (type(embedding._tpu_embedding).__mro__[1].__module__,
                                  type(embedding._tpu_embedding).__mro__[1].__name__))
print("LOSSES " + json.dumps(losses))
print("TABLES " + json.dumps({"t": tables().tolist()}))

# TF initialises each chip's shard from the initializer (a full-table
# constant does not fit a shard, on a TPU as here), so the model starts from
# the table Keras-RS reads before the first step.
TABLE0 = start
assert np.abs(TABLE0).max() > 0
params = ref.TableParams("stochastic_gradient_descent" if OPT == "sgd" else "adagrad", lr=LR)
state = [TABLE0.astype(np.float64)] + ([np.full((VOCAB, DIM), ACC0)] if OPT == "adagrad" else [])
worst = 0.0
assert len(snapshots) == STEPS
for k, got in enumerate(snapshots):
    ids, y = (a[k * GLOBAL:(k + 1) * GLOBAL] for a in (IDS, Y))
    grads = 2.0 * (state[0][ids] @ C - y) / GLOBAL * C.T
    ref.step(params, state, ref.contributions([([[(int(i), 1.0)] for i in ids], "sum", grads)]))
    worst = max(worst, float(np.max(np.abs(got - state[0]))))
    np.testing.assert_allclose(got, state[0], rtol=2e-5, atol=2e-6, err_msg="fit step %d" % k)
assert np.abs(snapshots[-1] - TABLE0).max() > 1e-2
print("fit: %d steps ok" % len(snapshots))
print("MAXDEV %.3g" % worst)
print("OK")
