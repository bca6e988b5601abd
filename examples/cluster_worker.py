"""A complete worker (training script) on embedding hosts (README "Running on several machines").

Start the hosts first, one per machine (the same list everywhere, its own --task):

    python -m tf_tpu_emb.server --cluster hostA:2222,hostB:2222 --task 0
    python -m tf_tpu_emb.server --cluster hostA:2222,hostB:2222 --task 1

then, on the trainer's machine:

    python examples/cluster_worker.py --hosts hostA:2222,hostB:2222 \\
        --client-address trainer:2300 --checkpoint-dir /tmp/worker_ckpt

`--client-address` is where the hosts reach this process (default: a free
port on localhost, right only when everything runs on one machine).  Without
`--hosts` the same script trains on one in-process engine: same seed, same
losses (tests/cluster/test_worker_example.py runs it both ways on a loopback
cluster and compares).

It trains two tables (DIV_DEFAULT or MOD sharding) and a dense head with a
tf.function step run under `hosts.run(step, ..., timeout_s=)`: a host that
dies or hangs gives an error naming it instead of a frozen trainer.  It
checkpoints at the end of each epoch and, started again with the same
`--checkpoint-dir`, resumes from the last checkpoint (also after a host was
restarted: `hosts.connect()` then `checkpoint.restore` reconfigures and
reloads every host).
"""
import argparse

import numpy as np
import tensorflow as tf
import keras

import tf_tpu_emb
from tf_tpu_emb.cluster import EmbeddingHosts

E = tf.tpu.experimental.embedding
BATCH = 64
VIDEOS, USERS = 5000, 300


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", default="",
                        help="HOST:PORT,... of the embedding hosts (tasks 0..S-1 of job "
                             "'embedding'); empty: one in-process engine")
    parser.add_argument("--client-address", default=None,
                        help="HOST:PORT at which the hosts reach this process")
    parser.add_argument("--sharding", default="DIV_DEFAULT", choices=["DIV_DEFAULT", "MOD"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=15)
    parser.add_argument("--step-timeout", type=float, default=120.0,
                        help="seconds a step may take before the hosts are probed")
    parser.add_argument("--checkpoint-dir", default=None)
    return parser.parse_args(argv)


def make_dataset():
    """Watched videos (a ragged bag, up to 5) and the user id; the label is a
    rule on both that the model can learn."""
    rng = np.random.default_rng(0)
    n = 64 * BATCH
    lengths = rng.integers(0, 6, n)
    watched = tf.RaggedTensor.from_row_lengths(
        rng.zipf(1.3, int(lengths.sum())).clip(1, VIDEOS - 1), lengths)
    users = rng.integers(0, USERS, n)
    first = np.array([row[0] if len(row) else 0 for row in watched.to_list()])
    labels = ((users % 3 == 0) | (first % 2 == 1)).astype("float32")[:, None]
    dataset = tf.data.Dataset.from_tensor_slices(({"watched": watched, "user": users}, labels))
    return dataset.repeat().batch(BATCH, drop_remainder=True)


def seeded(seed, stddev=0.1):
    """A table initializer that gives the same values in every process."""
    def initializer(shape, dtype=tf.float32):
        return tf.constant(np.random.default_rng(seed).normal(0.0, stddev, shape), dtype)
    return initializer


def main(argv=None):
    args = parse_args(argv)
    hosts = None
    if args.hosts:
        hosts = EmbeddingHosts({"embedding": args.hosts.split(",")},
                               client_address=args.client_address)
        hosts.connect()  # UnavailableError naming the host when one is down
        print("connected to %s" % hosts)

    keras.utils.set_random_seed(0)  # the dense head's initial weights
    video = E.TableConfig(VIDEOS, 8, name="video", combiner="mean", initializer=seeded(1))
    user = E.TableConfig(USERS, 4, name="user", combiner="sum", initializer=seeded(2))
    feature_config = {"watched": E.FeatureConfig(video), "user": E.FeatureConfig(user)}
    cluster_args = {} if hosts is None else {"cluster": hosts,
                                             "sharding_strategy": args.sharding}
    embedding = tf_tpu_emb.TPUEmbedding(feature_config, E.Adagrad(learning_rate=0.3),
                                        **cluster_args)
    dense = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    dense.build([None, 8 + 4])
    optimizer = keras.optimizers.Adam(0.01)
    optimizer.build(dense.trainable_variables)
    embedding.build(per_replica_input_shapes={"watched": [BATCH, None], "user": [BATCH]})

    @tf.function
    def train_step(features, labels):
        embedding.enqueue(features, training=True)
        with tf.GradientTape() as tape:
            activations = embedding.dequeue()
            tape.watch(activations)
            logits = dense(tf.concat([activations["watched"], activations["user"]], axis=1))
            loss = tf.reduce_mean(
                keras.losses.binary_crossentropy(labels, logits, from_logits=True))
        embedding_gradients, dense_gradients = tape.gradient(
            loss, (activations, dense.trainable_variables))
        embedding.apply_gradients(embedding_gradients)
        optimizer.apply_gradients(zip(dense_gradients, dense.trainable_variables))
        return loss

    def run_step(features, labels):
        if hosts is None:
            return train_step(features, labels)
        # A deadline on the step; errors name the host (and, for a step that
        # failed part-way, which hosts applied it).
        return hosts.run(train_step, features, labels, timeout_s=args.step_timeout)

    epoch = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(embedding=embedding, dense=dense, optimizer=optimizer,
                                     epoch=epoch)
    manager = None
    if args.checkpoint_dir:
        manager = tf.train.CheckpointManager(checkpoint, args.checkpoint_dir, max_to_keep=2)
        if manager.latest_checkpoint:
            checkpoint.restore(manager.latest_checkpoint)
            print("restored %s (epoch %d)" % (manager.latest_checkpoint, int(epoch)))

    iterator = iter(make_dataset().skip(int(epoch) * args.steps_per_epoch))
    try:
        while int(epoch) < args.epochs:
            losses = [float(run_step(*next(iterator))) for _ in range(args.steps_per_epoch)]
            epoch.assign_add(1)
            print("epoch %d: loss first %.6f last %.6f mean %.6f"
                  % (int(epoch), losses[0], losses[-1], float(np.mean(losses))))
            if manager:
                print("saved %s" % manager.save())
    finally:
        embedding.shutdown()  # frees the hosts at once for the next trainer
        if hosts is not None:
            hosts.disconnect()
    print("OK")


if __name__ == "__main__":
    main()
