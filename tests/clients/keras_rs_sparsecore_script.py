"""Keras-RS 0.4.0's DistributedEmbedding on the SparseCore path of the
stand-in (run by tests/clients/test_keras_rs_sparsecore.py in the client
venv, under ``python -m tf_tpu_emb.run --embedding v2 --replicas R``).

``python keras_rs_sparsecore_script.py OPTIMIZER R LOOP PLACEMENT``:
Keras-RS sees embedding feature V2 and builds TF's ``TPUEmbeddingV2`` (its
SparseCore path); the model trains the table through TF's SparseCore ops,
checked after every step against the numpy formula of a global-batch step
(tests/common/optimizer_reference.py; the table read through Keras-RS's
own ``get_embedding_tables``, which unshards TF's layout).  Then the model
is saved with ``tf.train.Checkpoint``, restored into a fresh model (its own
DistributedEmbedding and TPUEmbeddingV2), and both train one more step: the
tables must stay equal (the slots came back too).

* OPTIMIZER: ``sgd``, ``adagrad``, ``adam``, ``ftrl`` (Keras optimizers,
  which Keras-RS translates) or ``adagrad_momentum`` (Keras has none: a
  ``tf.tpu.experimental.embedding`` config with TF's AdagradMomentum, which
  Keras-RS 0.4.0 itself refuses -- its ``to_tf_tpu_optimizer`` knows SGD,
  Adagrad, Adam and FTRL only -- before any TPU op runs).
* LOOP: ``fit`` (``model.fit``) or ``custom`` (``strategy.run`` of a
  GradientTape step in a ``tf.function``, over a distributed dataset).
* PLACEMENT: ``sparsecore`` or ``auto`` (Keras-RS picks the SparseCore when
  the TPU has one).
* optional ``pipelined``: ``pipeline_execution_with_tensor_core=True``, so
  step k's lookup sees the table before step k-1's update (the reference
  too); the checkpoint is then checked restored, not trained on (the
  original's next lookup is one step old, the fresh one's is not).

Prints ``LOSSES`` and ``TABLES``, the checks it passed, then OK.
"""
import json
import os
import sys
import tempfile

import keras
import keras_rs
import numpy as np
import tensorflow as tf

import client_strategy
import optimizer_reference as ref

OPT, R, LOOP, PLACEMENT = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
PIPELINED = len(sys.argv) > 5 and sys.argv[5] == "pipelined"
# 64 rows: a multiple of R * 4 SparseCores for R up to 8, so TF's layout has
# no padding rows for Keras-RS's reader to strip.
VOCAB, DIM, PER_REPLICA, STEPS, LR = 64, 8, 8, 4, 0.3
GLOBAL = PER_REPLICA * R
rng = np.random.default_rng(5)
C = rng.normal(size=(DIM, 1)).astype(np.float32)
IDS = rng.integers(0, VOCAB, ((STEPS + 1) * GLOBAL,)).astype(np.int32)
IDS[: STEPS * GLOBAL // 3] %= 6  # repeated ids within and across replicas
Y = rng.normal(size=((STEPS + 1) * GLOBAL, 1)).astype(np.float32)

# Each optimizer's arguments, as Keras (or TF) takes them and as the numpy
# reference (optimizer_reference: optimization_parameters.proto's names) does.
# Adam's epsilon: its update of a row whose summed gradient nearly cancels
# moves by (lr / epsilon) times the sum's rounding, which differs by order of
# summation; 0.1 keeps that factor near 1 and the comparison meaningful.
KERAS = {"sgd": (keras.optimizers.SGD, {}),
         "adagrad": (keras.optimizers.Adagrad, {"initial_accumulator_value": 0.1}),
         "adam": (keras.optimizers.Adam, {"beta_1": 0.9, "beta_2": 0.99, "epsilon": 0.1}),
         "ftrl": (keras.optimizers.Ftrl, {"learning_rate_power": -0.5,
                                          "initial_accumulator_value": 0.1,
                                          "l1_regularization_strength": 0.01,
                                          "l2_regularization_strength": 0.02, "beta": 0.1})}
MOMENTUM = {"momentum": 0.5, "beta2": 1.0, "epsilon": 1e-3, "exponent": 2.0,
            "use_nesterov": False}
REFERENCE = {  # name in the reference, hyperparameters, initial slots
    "sgd": ("stochastic_gradient_descent", {}, []),
    "adagrad": ("adagrad", {}, [0.1]),
    # Keras-RS gives TF's Adam its defaults: lazy, sum_inside_sqrt.
    "adam": ("adam", {"beta1": 0.9, "beta2": 0.99, "epsilon": 0.1,
                      "use_sum_inside_sqrt": True}, [0.0, 0.0]),
    "ftrl": ("ftrl", {"lr_power": -0.5, "l1": 0.01, "l2": 0.02, "beta": 0.1}, [0.1, 0.0]),
    "adagrad_momentum": ("adagrad_momentum", MOMENTUM, [0.0, 0.0]),
}

strategy = client_strategy.make("tpu", R)
feature = strategy.extended.tpu_hardware_feature
assert feature.embedding_feature == feature.embedding_feature.V2, feature.embedding_feature


def feature_configs():
    if OPT == "adagrad_momentum":
        E = tf.tpu.experimental.embedding
        table = E.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t", combiner="sum",
                              initializer=tf.keras.initializers.RandomNormal(seed=3),
                              optimizer=E.AdagradMomentum(learning_rate=LR, **MOMENTUM))
        return {"f": E.FeatureConfig(table, name="f", output_shape=[PER_REPLICA])}
    cls, kwargs = KERAS[OPT]
    table = keras_rs.layers.TableConfig(
        name="t", vocabulary_size=VOCAB, embedding_dim=DIM,
        initializer=keras.initializers.RandomNormal(seed=3),
        optimizer=cls(learning_rate=LR, **kwargs), combiner="sum", placement=PLACEMENT)
    return {"f": keras_rs.layers.FeatureConfig(name="f", table=table, input_shape=(GLOBAL,),
                                               output_shape=(GLOBAL, DIM))}


def make_model():
    with strategy.scope():
        embedding = keras_rs.layers.DistributedEmbedding(
            feature_configs(), pipeline_execution_with_tensor_core=PIPELINED)
        inputs = {"f": keras.Input(shape=(), dtype="int32", name="f")}
        out = keras.layers.Dense(1, use_bias=False, trainable=False,
                                 kernel_initializer=keras.initializers.Constant(C))(
                                     embedding(inputs)["f"])
        model = keras.Model(inputs, out)
        model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    return model, embedding


def tables(embedding):
    with strategy.scope():
        return np.asarray(embedding.get_embedding_tables()["t"])


def dataset(first, count):
    lo, hi = first * GLOBAL, (first + count) * GLOBAL
    return tf.data.Dataset.from_tensor_slices(({"f": IDS[lo:hi]}, Y[lo:hi])).batch(
        GLOBAL, drop_remainder=True)


def train(model, embedding, first, count):
    """`count` steps from batch `first`; the table after each step, losses."""
    snapshots = []
    if LOOP == "fit":
        history = model.fit(dataset(first, count), epochs=1, verbose=0,
                            callbacks=[keras.callbacks.LambdaCallback(
                                on_train_batch_end=lambda b, logs: snapshots.append(
                                    tables(embedding)))])
        return snapshots, [float(v) for v in history.history["loss"]]

    @tf.function
    def step(x, y):
        def fn(x, y):
            with tf.GradientTape() as tape:
                # The replica's share of the global batch's mean squared error:
                # summed over replicas, the loss `fit` minimises.
                loss = tf.reduce_sum(tf.square(model(x) - y)) / GLOBAL
            variables = model.trainable_variables
            model.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
            return loss
        return strategy.reduce("SUM", strategy.run(fn, args=(x, y)), axis=None)
    losses = []
    for x, y in strategy.experimental_distribute_dataset(dataset(first, count)):
        losses.append(float(step(x, y)))
        snapshots.append(tables(embedding))
    return snapshots, losses


model, embedding = make_model()
start = tables(embedding)
snapshots, losses = train(model, embedding, 0, STEPS)
assert len(snapshots) == STEPS, len(snapshots)
print("embedding class: %s.%s" % (type(embedding._tpu_embedding).__mro__[1].__module__,
                                  type(embedding._tpu_embedding).__mro__[1].__name__))
print("LOSSES " + json.dumps(losses))
print("TABLES " + json.dumps({"t": snapshots[-1].tolist()}))

# TF initialises each chip's shard from the initializer (a full-table
# constant does not fit a shard, on a TPU as here), so the model starts from
# the table Keras-RS reads before the first step.
assert np.abs(start).max() > 0
name, hyper, slots0 = REFERENCE[OPT]
params = ref.TableParams(name, hp=hyper, lr=LR)
state = [start.astype(np.float64)] + [np.full((VOCAB, DIM), v) for v in slots0]
worst = 0.0
before = []  # the table before each update
for k, got in enumerate(snapshots):
    ids, y = (a[k * GLOBAL:(k + 1) * GLOBAL] for a in (IDS, Y))
    before.append(state[0].copy())
    looked_up = before[max(k - 1, 0)] if PIPELINED else state[0]
    grads = 2.0 * (looked_up[ids] @ C - y) / GLOBAL * C.T
    ref.step(params, state, ref.contributions([([[(int(i), 1.0)] for i in ids], "sum", grads)]))
    worst = max(worst, float(np.max(np.abs(got - state[0]))))
    np.testing.assert_allclose(got, state[0], rtol=2e-5, atol=2e-6,
                               err_msg="%s step %d" % (LOOP, k))
assert np.abs(snapshots[-1] - start).max() > 1e-2
print("%s: %d steps ok" % (LOOP, len(snapshots)))

# Checkpoint round trip.  Keras-RS 0.4.0's TF backend creates its
# TPUEmbeddingV2 without dependency tracking, so a checkpoint of the model
# alone holds no table (on a TPU as here; printed, not relied on); the
# embedding object goes into the checkpoint beside the model.  A fresh model
# restored from it has the table, and one more step on each keeps them equal
# (which needs the optimizer's slots restored as well).
directory = tempfile.mkdtemp()
model_only = tf.train.Checkpoint(model=model).save(os.path.join(directory, "model_only"))
print("model checkpoint holds the table: %s" % any(
    len(shape) == 2 and shape[0] >= VOCAB and shape[1] >= DIM
    for _, shape in tf.train.list_variables(model_only)))


def checkpoint(model, embedding):
    return tf.train.Checkpoint(model=model, embedding=embedding._tpu_embedding)


path = checkpoint(model, embedding).save(os.path.join(directory, "ckpt"))
fresh, fresh_embedding = make_model()
assert np.abs(tables(fresh_embedding) - snapshots[-1]).max() > 1e-3
checkpoint(fresh, fresh_embedding).restore(path).assert_existing_objects_matched()
np.testing.assert_array_equal(tables(fresh_embedding), snapshots[-1])
if PIPELINED:
    print("checkpoint: restored ok")
    print("MAXDEV %.3g" % worst)
    print("OK")
    sys.exit(0)
more, _ = train(model, embedding, STEPS, 1)
more_fresh, _ = train(fresh, fresh_embedding, STEPS, 1)
np.testing.assert_allclose(more_fresh[-1], more[-1], rtol=1e-6, atol=1e-7)
ids, y = IDS[STEPS * GLOBAL:(STEPS + 1) * GLOBAL], Y[STEPS * GLOBAL:(STEPS + 1) * GLOBAL]
grads = 2.0 * (state[0][ids] @ C - y) / GLOBAL * C.T
ref.step(params, state, ref.contributions([([[(int(i), 1.0)] for i in ids], "sum", grads)]))
np.testing.assert_allclose(more[-1], state[0], rtol=2e-5, atol=2e-6, err_msg="after restore")
print("checkpoint: restored and trained on ok")
print("MAXDEV %.3g" % worst)
print("OK")
