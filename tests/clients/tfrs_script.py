"""TensorFlow Recommenders' TPU embedding layer on the stand-in (run by
tests/clients/test_tfrs.py in the client venv, TF_USE_LEGACY_KERAS=1).

``python tfrs_script.py tpu R`` (under ``python -m tf_tpu_emb.run --replicas R``):
a tfrs.models.Model with tfrs.layers.embedding.TPUEmbedding trains, in a
custom loop (eager and tf.function) and in fit, with the tables checked after
every step against the numpy formula of the table optimizer
(tests/common/optimizer_reference.py); the Keras-optimizer form (legacy
Adagrad behind a learning-rate schedule: slots through add_slot, the
optimizer's lazily created ``iterations``) trains in fit; the checkpoint
restores into the CPU fallback (TPUEmbeddingForServing) and back; the serving
lookup matches.  Prints ``LOSSES <json>`` and ``TABLES <json>`` of the SGD fit.
``python tfrs_script.py mirrored R``: the same SGD fit under MirroredStrategy
(the CPU fallback, tables trained by Keras SGD), prints ``LOSSES`` and ``TABLES``.
"""
import json
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

import client_strategy
import optimizer_reference as ref

MODE, R = sys.argv[1], int(sys.argv[2])
E = tf.tpu.experimental.embedding
VOCAB, DIM, PER_REPLICA, STEPS, LR = 13, 4, 4, 4, 0.3
GLOBAL = PER_REPLICA * R
rng = np.random.default_rng(11)
TABLE0 = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
C = rng.normal(size=(DIM, 1)).astype(np.float32)
IDS = rng.integers(0, VOCAB, (STEPS * GLOBAL,))
Y = rng.normal(size=(STEPS * GLOBAL, 1)).astype(np.float32)

strategy = client_strategy.make(MODE, R)
resolver = strategy.cluster_resolver if MODE == "tpu" else None  # to re-initialize


def feature_config():
    table = E.TableConfig(VOCAB, DIM, name="t", combiner="sum",
                          initializer=tf.constant_initializer(TABLE0))
    return {"f": E.FeatureConfig(table, name="f")}


class Model(tfrs.models.Model):
    def __init__(self, embedding_optimizer):
        super().__init__()
        self.config = feature_config()
        self.embedding = tfrs.layers.embedding.TPUEmbedding(self.config, embedding_optimizer)
        self.head = tf.keras.layers.Dense(1, use_bias=False, trainable=False,
                                          kernel_initializer=tf.constant_initializer(C))
        self.task = tfrs.tasks.Ranking(loss=tf.keras.losses.MeanSquaredError(
            reduction=tf.keras.losses.Reduction.SUM))

    def call(self, features):
        return self.head(self.embedding(features)["f"])

    def compute_loss(self, inputs, training=False):
        features, labels = inputs
        # Each replica's share of the global batch's mean (TFRS's distributed form).
        return self.task(labels=labels, predictions=self(features)) / GLOBAL


def make(embedding_optimizer, keras_optimizer):
    with strategy.scope():
        model = Model(embedding_optimizer)
        model.compile(optimizer=keras_optimizer)
    return model


def dataset():
    return tf.data.Dataset.from_tensor_slices(({"f": IDS}, Y)).batch(GLOBAL, drop_remainder=True)


def table_of(model):
    return model.embedding.embedding_tables[model.config["f"].table].numpy()


class Reference:
    """numpy: the tables after each step (the loss is MSE over the global batch)."""

    def __init__(self, optimizer, lr, slot_init=()):
        self.params = ref.TableParams(optimizer, lr=lr)
        self.state = [TABLE0.astype(np.float64)] + [np.full((VOCAB, DIM), v) for v in slot_init]

    def step(self, k):
        ids, y = IDS[k * GLOBAL:(k + 1) * GLOBAL], Y[k * GLOBAL:(k + 1) * GLOBAL]
        pred = self.state[0][ids] @ C
        grads = 2.0 * (pred - y) / GLOBAL * C.T
        ref.step(self.params, self.state, ref.contributions(
            [([[(int(i), 1.0)] for i in ids], "sum", grads)]))
        return self.state[0]


WORST = [0.0]


def check(got, want, what):
    WORST[0] = max(WORST[0], float(np.max(np.abs(got - want))))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=what)


def fit_losses(model, snapshots=None):
    callbacks = [] if snapshots is None else [tf.keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda b, logs: snapshots.append(table_of(model)))]
    history = model.fit(dataset(), epochs=1, verbose=0, callbacks=callbacks)
    return [float(v) for v in history.history["loss"]]


def sgd_fit():
    model = make(E.SGD(LR), tf.keras.optimizers.legacy.SGD(LR))
    snapshots = []
    losses = []
    for _ in range(2):  # two epochs: the loss the second epoch reports, too
        losses += fit_losses(model, snapshots)
    return model, losses, snapshots


if MODE == "mirrored":
    model, losses, _ = sgd_fit()
    print("LOSSES " + json.dumps(losses))
    print("TABLES " + json.dumps({"t": table_of(model).tolist()}))
    sys.exit(0)

# ------------------------------------------------------------------- TPU path
assert type(make(E.SGD(LR), "sgd").embedding._tpu_embedding).__module__ == "tf_tpu_emb.mid_level"
tf.tpu.experimental.initialize_tpu_system(resolver)

# 1. Custom loop, eager and tf.function steps, Adagrad.
model = make(E.Adagrad(LR), tf.keras.optimizers.legacy.SGD(0.0))
reference = Reference("adagrad", LR, slot_init=(0.1,))
iterator = iter(strategy.experimental_distribute_dataset(
    dataset(), options=tf.distribute.InputOptions(experimental_fetch_to_device=False)))


def replica_step(features, labels):
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(
            tf.reduce_sum((model(features) - labels) ** 2, axis=1), global_batch_size=GLOBAL)
    grads = tape.gradient(loss, model.trainable_variables)
    model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


function_step = tf.function(lambda inputs: strategy.run(replica_step, args=inputs))
for k in range(STEPS):
    inputs = next(iterator)
    if k % 2 == 0:
        strategy.run(replica_step, args=inputs)
    else:
        function_step(inputs)
    check(table_of(model), reference.step(k), "custom loop step %d" % k)
print("custom loop: %d steps ok" % STEPS)

# 2. fit with the TPU SGD optimizer (and the losses it reports).
tf.tpu.experimental.initialize_tpu_system(resolver)
model, losses, snapshots = sgd_fit()
reference = Reference("stochastic_gradient_descent", LR)
for k, got in enumerate(snapshots):
    check(got, reference.step(k % STEPS), "fit step %d" % k)
print("LOSSES " + json.dumps(losses))
print("TABLES " + json.dumps({"t": table_of(model).tolist()}))

# 3. Checkpoints: TPU path -> CPU fallback (TPUEmbeddingForServing) -> TPU path.
directory = tempfile.mkdtemp()
path = tf.train.Checkpoint(model=model).save(os.path.join(directory, "tpu"))
trained = table_of(model)
cpu_model = Model(E.SGD(LR))       # the default strategy: TFRS's CPU fallback
assert "ForServing" in type(cpu_model.embedding._tpu_embedding).__name__
cpu_model({"f": tf.constant(IDS[:GLOBAL])})
tf.train.Checkpoint(model=cpu_model).restore(path).expect_partial()
np.testing.assert_array_equal(table_of(cpu_model), trained)
# The serving lookup of the CPU model (TFRS's serving_config path).
served = cpu_model.embedding({"f": tf.constant([3, 5])}, serving_config=cpu_model.config)
np.testing.assert_array_equal(served["f"].numpy(), trained[[3, 5]])
cpu_model.embedding.embedding_tables[cpu_model.config["f"].table].assign(trained + 1.0)
back = tf.train.Checkpoint(model=cpu_model).save(os.path.join(directory, "cpu"))
tf.tpu.experimental.initialize_tpu_system(resolver)
model = make(E.SGD(LR), tf.keras.optimizers.legacy.SGD(LR))
tf.train.Checkpoint(model=model).restore(back).expect_partial()
model.fit(dataset().take(1), epochs=1, verbose=0)   # builds on the TPU path: loads the restore
reference = Reference("stochastic_gradient_descent", LR)
reference.state[0] = (trained + 1.0).astype(np.float64)
check(table_of(model), reference.step(0), "after restoring the CPU checkpoint")
print("checkpoints: TPU -> CPU fallback -> TPU ok")

# 4. A Keras optimizer translated by TFRS: legacy Adagrad behind a schedule
#    that reads the optimizer's lazily created `iterations` (Model Garden's form).
tf.tpu.experimental.initialize_tpu_system(resolver)
schedule = tf.keras.optimizers.schedules.PolynomialDecay(LR, 100, LR / 10)
with strategy.scope():
    keras_adagrad = tf.keras.optimizers.legacy.Adagrad(schedule, initial_accumulator_value=0.1)
model = make(keras_adagrad, tf.keras.optimizers.legacy.SGD(0.0))
snapshots = []
fit_losses(model, snapshots)
reference = Reference("adagrad", float(schedule(0)), slot_init=(0.1,))
for k, got in enumerate(snapshots):
    check(got, reference.step(k), "Keras Adagrad fit step %d" % k)
print("keras optimizer with a schedule: %d steps ok" % len(snapshots))
print("MAXDEV %.3g" % WORST[0])
print("OK")
