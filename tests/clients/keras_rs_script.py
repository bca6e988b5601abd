"""Keras-RS 0.4.0's DistributedEmbedding (Keras 3, TF backend) on the stand-in
(run by tests/clients/test_keras_rs.py in the client venv).

``python keras_rs_script.py tpu R`` (under ``python -m tf_tpu_emb.run
--replicas R``): Keras-RS configs with placement "auto" go to its TPU path
(``tf.tpu.experimental.embedding.TPUEmbedding``, here the engine); fit trains
the table with the translated Keras SGD, checked after every step against the
numpy formula (the tables read through Keras-RS's own
``get_embedding_tables``, i.e. the per-shard ``.values`` view); the trained
tables move into the CPU fallback (EmbedReduce) model, whose predictions
(the serving path) equal the TPU model's.  Prints ``LOSSES <json>`` and
``TABLES <json>`` (the trained table).
``python keras_rs_script.py mirrored R``: the same fit under MirroredStrategy
(Keras-RS's CPU fallback, the table trained by Keras SGD); the same two lines.
"""
import json
import sys

import keras
import keras_rs
import numpy as np
import tensorflow as tf

import client_strategy
import optimizer_reference as ref

MODE, R = sys.argv[1], int(sys.argv[2])
VOCAB, DIM, PER_REPLICA, STEPS, LR = 12, 4, 4, 4, 0.3
GLOBAL = PER_REPLICA * R
rng = np.random.default_rng(5)
TABLE0 = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
C = rng.normal(size=(DIM, 1)).astype(np.float32)
IDS = rng.integers(0, VOCAB, (STEPS * GLOBAL,)).astype(np.int32)
Y = rng.normal(size=(STEPS * GLOBAL, 1)).astype(np.float32)

strategy = client_strategy.make(MODE, R)


def make(strategy_or_none):
    table = keras_rs.layers.TableConfig(
        name="t", vocabulary_size=VOCAB, embedding_dim=DIM,
        initializer=keras.initializers.Constant(TABLE0),
        optimizer=keras.optimizers.SGD(learning_rate=LR), combiner="sum", placement="auto")
    features = {"f": keras_rs.layers.FeatureConfig(name="f", table=table,
                                                   input_shape=(GLOBAL,),
                                                   output_shape=(GLOBAL, DIM))}
    scope = strategy_or_none.scope() if strategy_or_none else keras.name_scope("cpu")
    with scope:
        embedding = keras_rs.layers.DistributedEmbedding(features)
        inputs = {"f": keras.Input(shape=(), dtype="int32", name="f")}
        out = keras.layers.Dense(1, use_bias=False, trainable=False,
                                 kernel_initializer=keras.initializers.Constant(C))(
                                     embedding(inputs)["f"])
        model = keras.Model(inputs, out)
        model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    return model, embedding


def dataset():
    return tf.data.Dataset.from_tensor_slices(({"f": IDS}, Y)).batch(GLOBAL, drop_remainder=True)


model, embedding = make(strategy)
snapshots = []


def tables():
    with strategy.scope():
        return np.asarray(embedding.get_embedding_tables()["t"])


losses = []
for _ in range(2):
    history = model.fit(dataset(), epochs=1, verbose=0, callbacks=[keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: snapshots.append(tables()))])
    losses += [float(v) for v in history.history["loss"]]
print("LOSSES " + json.dumps(losses))
print("TABLES " + json.dumps({"t": tables().tolist()}))
if MODE == "mirrored":
    sys.exit(0)

assert type(embedding._tpu_embedding).__module__ == "tf_tpu_emb.mid_level"  # the engine
params = ref.TableParams("stochastic_gradient_descent", lr=LR)
state = [TABLE0.astype(np.float64)]
worst = 0.0
for k, got in enumerate(snapshots):
    ids, y = (a[(k % STEPS) * GLOBAL:(k % STEPS + 1) * GLOBAL] for a in (IDS, Y))
    grads = 2.0 * (state[0][ids] @ C - y) / GLOBAL * C.T
    ref.step(params, state, ref.contributions([([[(int(i), 1.0)] for i in ids], "sum", grads)]))
    worst = max(worst, float(np.max(np.abs(got - state[0]))))
    np.testing.assert_allclose(got, state[0], rtol=2e-5, atol=2e-6, err_msg="fit step %d" % k)
print("fit: %d steps ok" % len(snapshots))

# The trained table into Keras-RS's CPU fallback; its predictions (serving) match.
trained = tables()
cpu_model, cpu_embedding = make(None)
(cpu_table,) = [w for w in cpu_embedding.weights if tuple(w.shape) == (VOCAB, DIM)]
cpu_table.assign(trained)
np.testing.assert_array_equal(np.asarray(cpu_embedding.get_embedding_tables()["t"]), trained)
features = {"f": IDS[:GLOBAL]}
np.testing.assert_allclose(cpu_model.predict(features, verbose=0), trained[IDS[:GLOBAL]] @ C,
                           rtol=1e-6)
print("TPU tables -> CPU fallback, serving predictions ok")
print("MAXDEV %.3g" % worst)
print("OK")
