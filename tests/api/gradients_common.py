"""What the tests of the training path's Python side share
(tests/api/test_gradient_layout.py, test_gradients_tf1.py,
test_gradients_tf2.py): the feature-mode scenario (two features on the video
table with disjoint id ranges, one on the user table, SGD), its batches and
enqueue, a loss whose gradient is known (R_f + a_f), and the numpy SGD
reference written from the spec (§4.3: row ``id`` moves by
``-lr * sum over occurrences of (w_k / N_bag) * dL/da_bag``) with the check
of the retrieved tables against it."""
import collections

import numpy as np
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec


B = 4
L = 2                # sequence length of the table-mode sequence feature
LR = 0.1             # engine_util's constant learning rate
SGD = "stochastic_gradient_descent"

# Feature-mode scenario: two features share the video table, with disjoint id
# ranges so the rows of each feature are known.
FEATURES = [("watched", 0, (0, 6)), ("friends", 1, (0, 16)), ("favorited", 0, (6, 10))]
COMBINERS = {0: "mean", 1: "sqrtn"}  # per table


def _tables(video_lr_tag=None):
    return [TableSpec("video", 10, 4, SGD, lr_tag=video_lr_tag), TableSpec("user", 16, 3, SGD)]


def _feature_config(video_lr_tag=None):
    return eu.feature_mode_config(_tables(video_lr_tag),
                                  [FeatureSpec(n, t, [B]) for n, t, _ in FEATURES])


def _bags(rng, lo, hi, n=B):
    bags = eu.random_bags(rng, n, hi - lo, weighted=True)
    return [[(i + lo, w) for i, w in bag] for bag in bags]


def _feature_batch(rng):
    """{feature: bags} and the ArbitraryTensorBatch enqueue arguments."""
    bags = collections.OrderedDict((n, _bags(rng, lo, hi)) for n, _, (lo, hi) in FEATURES)
    args = [eu.sparse_to_enqueue(*eu.bags_to_sparse(b)) for b in bags.values()]
    return bags, args


def _enqueue_features(args):
    eu.enqueue_arbitrary(args, combiners=[COMBINERS[0], COMBINERS[1]])


def _graph_enqueue(args):
    """The enqueue as an op of the current TF1 graph (arguments as constants)."""
    return tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
        sample_indices_or_row_splits=[np.asarray(a[0]) for a in args],
        embedding_indices=[np.asarray(a[1]) for a in args],
        aggregation_weights=[np.asarray(a[2]) for a in args], combiners=["mean", "sqrtn"],
        mode_override="unspecified")


def _recv(layout):
    return tf.raw_ops.RecvTPUEmbeddingActivations(
        num_outputs=len(layout.output_shapes), config=layout.config)


def _targets(layout, seed):
    """Random R_f per feature for the loss sum(R_f * a_f) + 0.5 * sum(a_f^2),
    whose gradient is R_f + a_f."""
    rng = np.random.default_rng(seed)
    return {f.name: rng.standard_normal(f.shape).astype(np.float32) for f in layout.features}


def _loss(acts, targets, use=None):
    use = list(acts) if use is None else use
    return tf.add_n([tf.reduce_sum(targets[n] * acts[n]) + 0.5 * tf.reduce_sum(acts[n] ** 2)
                     for n in use])


def _sgd(table, contributions, lr=LR):
    """numpy SGD: contributions = [(bags, dL/da per bag [n_bags, D], combiner)]."""
    grad = np.zeros(table.shape, np.float64)
    for bags, g, combiner in contributions:
        g = np.asarray(g, np.float64).reshape(len(bags), -1)
        for bag, gb in zip(bags, g):
            if not bag:
                continue
            w = np.array([wk for _, wk in bag], np.float64)
            norm = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
            for (i, wk) in bag:
                grad[i] += wk / norm * gb
    return table - lr * grad


def _expected_feature_mode(before, bags, grads, lrs=(LR, LR)):
    """Expected {table: parameters} after one step of the feature scenario."""
    out = {}
    for t, name in enumerate(("video", "user")):
        contributions = [(bags[n], grads[n], COMBINERS[t]) for n, tt, _ in FEATURES
                         if tt == t and grads.get(n) is not None]
        out[name] = _sgd(before[name][0], contributions, lrs[t])
    return out


def _retrieve(config):
    return {d.name: eu.retrieve_table(d)[0] for d in config.table_descriptor}


def _assert_tables(config, want):
    got = _retrieve(config)
    for name in want:
        eu.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, what="table " + name)
