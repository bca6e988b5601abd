"""A TPU embedding training script, ported to CPU (README: "Porting a TPU script").

Written as a TPU user writes it: TF's TableConfig / FeatureConfig / optimizer,
the mid-level TPUEmbedding, a distributed dataset whose embedding features
stay on the host, a tf.function train step that enqueues and then runs the
dense part with ``strategy.run`` (dequeue, loss, gradients, apply_gradients),
and a checkpoint saved and restored.  Only the lines marked ``# ported`` differ
from the TPU version (the strategy, and where TPUEmbedding comes from).
"""
import sys
import tempfile

import numpy as np
import tensorflow as tf
import keras

from tf_tpu_emb import TPUEmbedding  # ported
cpu = tf.config.list_physical_devices("CPU")[0]  # ported
logical_cpus = [tf.config.LogicalDeviceConfiguration()] * 2  # ported
tf.config.set_logical_device_configuration(cpu, logical_cpus)  # ported
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])  # ported

GLOBAL_BATCH = 32
PER_REPLICA_BATCH = GLOBAL_BATCH // strategy.num_replicas_in_sync
E = tf.tpu.experimental.embedding

video = E.TableConfig(vocabulary_size=1000, dim=8, name="video", combiner="mean")
user = E.TableConfig(vocabulary_size=200, dim=4, name="user", combiner="sum")
feature_config = {"watched": E.FeatureConfig(video, name="watched"),
                  "user": E.FeatureConfig(user, name="user")}


def make_dataset():
    rng = np.random.default_rng(0)
    n = 8 * GLOBAL_BATCH
    watched = tf.sparse.from_dense(rng.integers(1, 1000, (n, 3)) * (rng.random((n, 3)) < 0.7))
    users = rng.integers(0, 200, (n,))
    labels = ((users % 3 == 0) | (tf.sparse.to_dense(watched).numpy()[:, 0] % 2 == 1))
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"watched": watched, "user": users}, labels.astype("float32")[:, None]))
    return dataset.repeat().batch(GLOBAL_BATCH, drop_remainder=True)


with strategy.scope():
    embedding = TPUEmbedding(feature_config=feature_config,
                             optimizer=E.Adagrad(learning_rate=0.5),
                             pipeline_execution_with_tensor_core=False)
    dense = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    dense.build([None, 8 + 4])
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(dense.trainable_variables)

distributed = strategy.experimental_distribute_dataset(
    make_dataset(), options=tf.distribute.InputOptions(experimental_fetch_to_device=False))
iterator = iter(distributed)
embedding.build(per_replica_input_shapes={"watched": [PER_REPLICA_BATCH, 3],
                                          "user": [PER_REPLICA_BATCH]})


@tf.function
def train_step(iterator):
    def replica_step(labels):
        with tf.GradientTape() as tape:
            activations = embedding.dequeue()
            tape.watch(activations)
            logits = dense(tf.concat([activations["watched"], activations["user"]], axis=1))
            per_example = keras.losses.binary_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        embedding_gradients, dense_gradients = tape.gradient(
            loss, (activations, dense.trainable_variables))
        embedding.apply_gradients(embedding_gradients)
        optimizer.apply_gradients(zip(dense_gradients, dense.trainable_variables))
        return loss

    features, labels = next(iterator)
    embedding.enqueue(features, training=True)
    losses = strategy.run(replica_step, args=(labels,))
    return strategy.reduce("SUM", losses, axis=None)


def table_values():
    return {t.name: v.numpy().copy() for t, v in embedding.embedding_tables.items()}


checkpoint = tf.train.Checkpoint(embedding=embedding, dense=dense, optimizer=optimizer)
first = [float(train_step(iterator)) for _ in range(20)]
saved_tables = table_values()
path = checkpoint.save((sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()) + "/ckpt")
later = [float(train_step(iterator)) for _ in range(10)]
assert any(np.any(v != saved_tables[k]) for k, v in table_values().items())
checkpoint.restore(path)
for name, values in table_values().items():
    np.testing.assert_array_equal(values, saved_tables[name])
print("loss: first %.4f, after 20 steps %.4f, after 30 steps %.4f"
      % (first[0], first[-1], later[-1]))
assert later[-1] < first[0]
print("OK")
