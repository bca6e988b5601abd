"""tf_tpu_emb.TPUEmbedding(cluster=...) on a loopback cluster vs one local engine.

Two embedding hosts (each with 2 replica devices); the same feature config,
initial tables and batches train a clustered TPUEmbedding and a local one.
Features cover a weighted mean bag (sparse), a sqrtn ragged bag, a sum
high-rank dense feature and a sequence feature; optimizers SGD, Adagrad, Adam
and FTRL; DIV_DEFAULT and MOD; 1 replica, and 2 replicas (two TPUEmbedding
objects with ``workers=(0, 2)`` / ``(1, 2)``, each driving one engine replica,
as two worker processes do), checked against one local engine fed the global
batch (both replicas' batches concatenated: the engine's update sums every
replica's contributions per row).

Tolerances: tables and slots bit-identical (each row's contributions reach its
host in the single-host order, with the same weights), except rtol 1e-6 for
the sqrtn table (the engine's sum of squared weights may be fused (FMA), TF's
is not); activations rtol 1e-5 (a bag's ids split over hosts are summed in
another order).
"""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from cluster import LoopbackCluster
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


@pytest.fixture(scope="module")
def hosts():
    with LoopbackCluster(2, replicas_per_host=2) as cluster:
        cluster.hosts.connect()
        tf_tpu_emb.load_library()
        yield cluster.hosts


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


def state(emb):
    emb._retrieve_variables()  # pylint: disable=protected-access
    return {t: {n: v.numpy() for n, v in slots.items()}
            for t, slots in emb._variables.items()}  # pylint: disable=protected-access


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("sharding", ["DIV_DEFAULT", "MOD"])
def test_clustered_training_equals_one_engine(hosts, engine_released, sharding, optimizer,
                                              replicas):
    rng = np.random.default_rng(len(sharding) * 10 + len(optimizer) + replicas)
    initial = {n: rng.standard_normal((v, d)).astype(np.float32)
               for n, (v, d, _) in TABLES.items()}
    per_replica = [[batch(rng) for _ in range(replicas)] for _ in range(STEPS)]

    def cot(n):
        return {"bag": rng.standard_normal([n, 4]), "ragged": rng.standard_normal([n, 3]),
                "grid": rng.standard_normal([n, 2, 2]),
                "seq": rng.standard_normal([n, L, 4])}

    cots = [[{k: tf.constant(v, tf.float32) for k, v in cot(B).items()}
             for _ in range(replicas)] for _ in range(STEPS)]

    local = tf_tpu_emb.TPUEmbedding(feature_config(initial, B * replicas),
                                    OPTIMIZERS[optimizer]())
    local_step = stepper(local)
    want = [local_step(concat([f for f, _ in s]), concat([w for _, w in s]),
                       {k: tf.concat([c[k] for c in cs], 0) for k in cs[0]})
            for s, cs in zip(per_replica, cots)]
    want_state = state(local)
    local.shutdown()

    workers = [tf_tpu_emb.TPUEmbedding(feature_config(initial, B), OPTIMIZERS[optimizer](),
                                       cluster=hosts, sharding_strategy=sharding,
                                       workers=(w, replicas)) for w in range(replicas)]
    try:
        # The workers' steps interleave (each step is one synchronous update);
        # worker 0's first enqueue builds (configures and loads the hosts),
        # the others' attach to its engines.
        fns = [stepper(emb) for emb in workers]
        steps = [[fns[w](*per_replica[s][w], cots[s][w]) for w in range(replicas)]
                 for s in range(STEPS)]
        for s in range(STEPS):
            for w in range(replicas):
                for name in want[s]:
                    eu.assert_close(steps[s][w][name], want[s][name][w * B:(w + 1) * B],
                                    rtol=1e-5, atol=1e-6,
                                    what="step %d worker %d %s" % (s, w, name))
        got_state = state(workers[0])
        for t in want_state:
            for n in want_state[t]:
                if TABLES[t][2] == "sqrtn":
                    np.testing.assert_allclose(got_state[t][n], want_state[t][n], rtol=1e-6,
                                               atol=1e-7, err_msg="%s/%s" % (t, n))
                else:
                    np.testing.assert_array_equal(got_state[t][n], want_state[t][n],
                                                  err_msg="%s/%s" % (t, n))
    finally:
        for emb in reversed(workers):
            emb.shutdown()

