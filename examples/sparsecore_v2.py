"""A TPUEmbeddingV2 (SparseCore) training script, as written for a SparseCore TPU
(v5p, v6e).

Run it on CPU, unchanged, on the stand-in SparseCore TPU system
(docs/guides/sparsecore.md):

    python -m tf_tpu_emb.run --embedding v2 --replicas 2 examples/sparsecore_v2.py

TPUClusterResolver, initialize_tpu_system, TPUStrategy and
tf.tpu.experimental.embedding.TPUEmbeddingV2 are TF's public names; under the
runner the class is TF's own, running on the op library's CPU kernels of TF's
SparseCore ops.  Three tables: ``video`` and ``user`` (width 8, Adagrad) are
stacked by TF into one table, ``genre`` (width 4, SGD) is its own; a small
Keras model on top; a custom training loop with ``strategy.run``,
``embedding(features)`` (enqueue + dequeue) and ``apply_gradients``.  It
prints LOSSES and TABLES (every logical table, unstacked from
``embedding_tables`` with TF's own utilities) as JSON lines.
"""
import json

import numpy as np
import tensorflow as tf
import keras
from tensorflow.python.tpu import tpu_embedding_v3_utils

keras.utils.set_random_seed(0)   # the same starting weights on any replica count
resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
strategy = tf.distribute.TPUStrategy(resolver)
feature = strategy.extended.tpu_hardware_feature
assert feature.embedding_feature == feature.embedding_feature.V2, "a SparseCore TPU is needed"

GLOBAL_BATCH = 64
REPLICAS = strategy.num_replicas_in_sync
PER_REPLICA_BATCH = GLOBAL_BATCH // REPLICAS
STEPS = 12
E = tf.tpu.experimental.embedding

# Constant starting tables: the same logical tables on any replica count (TF
# initialises each chip's shard from the initializer separately).
video = E.TableConfig(vocabulary_size=512, dim=8, name="video", combiner="mean",
                      initializer=tf.constant_initializer(0.05),
                      optimizer=E.Adagrad(learning_rate=0.5))
user = E.TableConfig(vocabulary_size=128, dim=8, name="user", combiner="sum",
                     initializer=tf.constant_initializer(-0.02),
                     optimizer=E.Adagrad(learning_rate=0.5))
genre = E.TableConfig(vocabulary_size=32, dim=4, name="genre", combiner="sqrtn",
                      initializer=tf.constant_initializer(0.1),
                      optimizer=E.SGD(learning_rate=0.2))
feature_config = {
    "watched": E.FeatureConfig(video, name="watched", output_shape=[PER_REPLICA_BATCH]),
    "user": E.FeatureConfig(user, name="user", output_shape=[PER_REPLICA_BATCH]),
    "genres": E.FeatureConfig(genre, name="genres", output_shape=[PER_REPLICA_BATCH]),
}


def make_batches():
    """STEPS global batches: multi-hot watched videos and genres (ragged), one
    user id; a label the ids decide."""
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(STEPS):
        lengths = rng.integers(1, 4, GLOBAL_BATCH)
        watched = rng.integers(0, 512, int(lengths.sum()))
        users = rng.integers(0, 128, GLOBAL_BATCH)
        genre_lengths = rng.integers(1, 3, GLOBAL_BATCH)
        genres = rng.integers(0, 32, int(genre_lengths.sum()))
        first = watched[np.concatenate([[0], np.cumsum(lengths)[:-1]])]
        labels = ((users % 3 == 0) | (first % 2 == 1)).astype("float32")[:, None]
        batches.append((lengths, watched, users, genre_lengths, genres, labels))
    return batches


def replica_inputs(batch):
    lengths, watched, users, genre_lengths, genres, labels = batch

    def fn(context):
        k = context.replica_id_in_sync_group
        lo, hi = k * PER_REPLICA_BATCH, (k + 1) * PER_REPLICA_BATCH
        w0, w1 = int(lengths[:lo].sum()), int(lengths[:hi].sum())
        g0, g1 = int(genre_lengths[:lo].sum()), int(genre_lengths[:hi].sum())
        features = {
            "watched": tf.RaggedTensor.from_row_lengths(watched[w0:w1].astype("int32"),
                                                        lengths[lo:hi]),
            "user": tf.constant(users[lo:hi].astype("int32")),
            "genres": tf.RaggedTensor.from_row_lengths(genres[g0:g1].astype("int32"),
                                                       genre_lengths[lo:hi]),
        }
        return features, tf.constant(labels[lo:hi])
    return strategy.experimental_distribute_values_from_function(fn)


with strategy.scope():
    embedding = tf.tpu.experimental.embedding.TPUEmbeddingV2(
        feature_config,
        sparse_core_embedding_config=E.SparseCoreEmbeddingConfig(max_ids_per_chip_per_sample=64))
    embedding.build()
    dense = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    dense.build([None, 8 + 8 + 4])
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(dense.trainable_variables)
print("embedding class: %s.%s, %d replica(s), %d SparseCores per chip, stacked tables %s" % (
    type(embedding).__mro__[1].__module__, type(embedding).__mro__[1].__name__, REPLICAS,
    feature.num_embedding_devices_per_chip, sorted(embedding.embedding_tables)))


@tf.function
def train_step(inputs):
    def replica_step(features, labels):
        activations, preserved = embedding(features)
        with tf.GradientTape() as tape:
            tape.watch(activations)
            logits = dense(tf.concat([activations["watched"], activations["user"],
                                      activations["genres"]], axis=1))
            per_example = keras.losses.binary_crossentropy(labels, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        embedding_gradients, dense_gradients = tape.gradient(
            loss, (activations, dense.trainable_variables))
        embedding.apply_gradients(embedding_gradients, preserved)
        optimizer.apply_gradients(zip(dense_gradients, dense.trainable_variables))
        return loss
    losses = strategy.run(replica_step, args=inputs)
    return strategy.reduce("SUM", losses, axis=None)


def logical_tables():
    """Each logical table, unstacked from the stacked, sharded variables of
    ``embedding_tables`` (TF's layout: ``embedding_layouts``)."""
    tables = {}
    for stacked, variable in embedding.embedding_tables.items():
        full = tf.concat([shard.read_value() for shard in variable.values], axis=0)
        for config in (video, user, genre):
            layout = embedding.embedding_layouts[config.name]
            if layout.stacked_table_name != stacked:
                continue
            table = tpu_embedding_v3_utils.unshuffle_from_sc_to_cpu(
                full, num_sparse_cores=layout.num_sparse_cores,
                offset_in_shard=layout.sparse_core_shard_row_offset,
                size_in_shard=layout.unsharded_padded_shape[0] // layout.num_sparse_cores,
                shard_rotation=layout.sparse_core_shard_rotation)
            tables[config.name] = table[:config.vocabulary_size, :config.dim].numpy().tolist()
    return tables


losses = [float(train_step(replica_inputs(batch))) for batch in make_batches()]
print("loss: first %.4f, last %.4f" % (losses[0], losses[-1]))
print("LOSSES " + json.dumps(losses))
print("TABLES " + json.dumps(logical_tables()))
assert losses[-1] < losses[0]
print("OK")
