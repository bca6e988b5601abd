"""The model, data and step of the sharded-vs-one-engine tests, shared by
test_sharded_mid_level.py and the second worker process it starts.

``python sharded_case.py CLUSTER_JSON SHARDING OPTIMIZER SEED OUT.npz``: worker 1
of 2 -- connects to the embedding hosts, attaches to the engines worker 0
built (``workers=(1, 2)``: engine replica 1), runs its half of every step of
case SEED and saves its activations to OUT.npz.
"""
import json
import sys

import numpy as np
import tensorflow as tf

import engine_util as eu
import tf_tpu_emb

B, L, STEPS = 4, 3, 2
TPU = tf.tpu.experimental.embedding
OPTIMIZERS = {
    "sgd": lambda: TPU.SGD(learning_rate=0.1),
    "adagrad": lambda: TPU.Adagrad(learning_rate=0.1),
    "adam": lambda: TPU.Adam(learning_rate=0.05),
    "ftrl": lambda: TPU.FTRL(learning_rate=0.1),
}
TABLES = {"users": (13, 4, "mean"), "items": (9, 3, "sqrtn"), "tags": (6, 2, "sum")}


def feature_config(initial, batch):
    tables = {n: TPU.TableConfig(v, d, combiner=c, name=n,
                                 initializer=lambda shape, dtype, x=initial[n]: tf.constant(x))
              for n, (v, d, c) in TABLES.items()}
    return {
        "bag": TPU.FeatureConfig(tables["users"], name="bag"),
        "ragged": TPU.FeatureConfig(tables["items"], name="ragged"),
        "grid": TPU.FeatureConfig(tables["tags"], name="grid", output_shape=[batch, 2]),
        "seq": TPU.FeatureConfig(tables["users"], name="seq", max_sequence_length=L),
    }


def batch(rng):
    """(features, weights) of one replica's batch of B samples."""
    sp, sp_w = eu.bags_to_sparse(eu.random_bags(rng, B, 13, weighted=True, max_len=4))
    rg, rg_w = eu.bags_to_ragged(eu.random_bags(rng, B, 9, weighted=True, max_len=3))
    grid = tf.constant(rng.integers(0, 6, [B, 2, 1]), tf.int64)
    seq_bags = eu.random_bags(rng, B * L, 13, exactly_one=True)
    seq, _ = eu.bags_to_sparse(seq_bags, [B, L])
    seq = tf.SparseTensor(seq.indices[:, :2], seq.values, [B, L])
    return ({"bag": sp, "ragged": rg, "grid": grid, "seq": seq},
            {"bag": sp_w, "ragged": rg_w, "grid": None, "seq": None})


def concat(parts):
    """The global batch of replica batches (sparse/ragged/dense per feature)."""
    out = {}
    for name in parts[0]:
        xs = [p[name] for p in parts]
        if xs[0] is None:
            out[name] = None
        elif isinstance(xs[0], tf.SparseTensor):
            out[name] = tf.sparse.concat(0, xs, expand_nonconcat_dims=True)
        else:
            out[name] = tf.concat(xs, 0)
    return out


def stepper(emb):
    """One training step: enqueue, dequeue, apply_gradients(cotangent)."""
    @tf.function
    def step(features, weights, cot):
        emb.enqueue(features, weights, training=True)
        acts = emb.dequeue()
        emb.apply_gradients(cot)
        return acts
    return step


def multi_stepper(emb):
    """Several training steps in one call: ``call([(features, weights, cot),
    ...])`` returns every step's activations."""
    @tf.function
    def call(batch):
        out = []
        for features, weights, cot in batch:
            emb.enqueue(features, weights, training=True)
            out.append(emb.dequeue())
            emb.apply_gradients(cot)
        return out
    return call


def state(emb):
    emb._retrieve_variables()  # pylint: disable=protected-access
    return {t: {n: v.numpy() for n, v in slots.items()}
            for t, slots in emb._variables.items()}  # pylint: disable=protected-access


def make_case(seed, replicas):
    """(initial tables, per step the replicas' (features, weights), per step
    the replicas' activation gradients): the same in every process."""
    rng = np.random.default_rng(seed)
    initial = {n: rng.standard_normal((v, d)).astype(np.float32)
               for n, (v, d, _) in TABLES.items()}
    per_replica = [[batch(rng) for _ in range(replicas)] for _ in range(STEPS)]
    cots = [[{"bag": rng.standard_normal([B, 4]), "ragged": rng.standard_normal([B, 3]),
              "grid": rng.standard_normal([B, 2, 2]), "seq": rng.standard_normal([B, L, 4])}
             for _ in range(replicas)] for _ in range(STEPS)]
    cots = [[{k: tf.constant(v, tf.float32) for k, v in c.items()} for c in s] for s in cots]
    return initial, per_replica, cots


def clustered(initial, optimizer, hosts, sharding, worker, workers):
    return tf_tpu_emb.TPUEmbedding(feature_config(initial, B), OPTIMIZERS[optimizer](),
                                   cluster=hosts, sharding_strategy=sharding,
                                   workers=(worker, workers))


def main(cluster_json, sharding, optimizer, seed, out):
    from tf_tpu_emb.cluster import EmbeddingHosts
    hosts = EmbeddingHosts(json.loads(cluster_json), replicas_per_host=2)
    hosts.connect()
    initial, per_replica, cots = make_case(int(seed), 2)
    step = stepper(clustered(initial, optimizer, hosts, sharding, 1, 2))
    acts = [step(*per_replica[s][1], cots[s][1]) for s in range(STEPS)]
    np.savez(out, **{"%d_%s" % (s, k): v.numpy() for s, a in enumerate(acts)
                     for k, v in a.items()})
    print("worker 1 done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
