"""A TPU embedding training script, exactly as written for a TPU.

Run it on CPU, unchanged, on the stand-in for the TPU system (README
"Running TPU programs unchanged"):

    python -m tf_tpu_emb.run --replicas 2 examples/tpu_unchanged.py [CHECKPOINT_DIR]

TPUClusterResolver, initialize_tpu_system, TPUStrategy and
tf.tpu.experimental.embedding.TPUEmbedding are TF's public names; under the
runner they are the stand-in's and the tables train on the engine with TPU
numerics.  The script is examples/port_from_tpu.py before its port.
"""
import json
import sys
import tempfile

import numpy as np
import tensorflow as tf
import keras

keras.utils.set_random_seed(0)   # the same starting weights on any replica count
TPUEmbedding = tf.tpu.experimental.embedding.TPUEmbedding
resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
strategy = tf.distribute.TPUStrategy(resolver)

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
print("embedding class: %s.%s, %d replica(s)" % (
    type(embedding).__module__, type(embedding).__name__, strategy.num_replicas_in_sync))

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


def table_values(path):
    """The embedding tables a checkpoint holds (on a TPU the tables live in
    the TPU system: a checkpoint retrieves them)."""
    return {name: tf.train.load_variable(path, name) for name, _ in tf.train.list_variables(path)
            if name.startswith("embedding/")}


checkpoint = tf.train.Checkpoint(embedding=embedding, dense=dense, optimizer=optimizer)
directory = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
first = [float(train_step(iterator)) for _ in range(20)]
path = checkpoint.save(directory + "/ckpt")
later = [float(train_step(iterator)) for _ in range(10)]
trained = table_values(checkpoint.save(directory + "/ckpt"))
saved = table_values(path)
assert any(np.any(v != saved[k]) for k, v in trained.items())
checkpoint.restore(path)
for name, values in table_values(checkpoint.save(directory + "/ckpt")).items():
    np.testing.assert_array_equal(values, saved[name])
print("loss: first %.4f, after 20 steps %.4f, after 30 steps %.4f"
      % (first[0], first[-1], later[-1]))
print("LOSSES " + json.dumps(first + later))
assert later[-1] < first[0]
print("OK")
