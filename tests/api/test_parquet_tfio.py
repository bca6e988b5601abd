"""Parquet click log -> tensorflow-io -> tf.data -> enqueue -> a training step
(tf_tpu_emb.data.parquet; README "Reading Parquet with tensorflow-io").

Runs where tensorflow-io's native ops load (`make test-tfio`: TF 2.16.2 +
tensorflow-io 0.37.1); skipped elsewhere with the reason.  The log holds a
weighted ragged multi-hot feature (sum combiner), an unweighted one (mean),
empty bags and dense columns; the expected activations and the SGD update are
numpy, written from docs/tpu_embedding_semantics.md (combiners, §3).
"""
import numpy as np
import pytest
import tensorflow as tf

import tf_features  # noqa: E402

tf_features.import_tfio_or_skip()

import tf_tpu_emb  # noqa: E402
from tf_tpu_emb.data import parquet  # noqa: E402

E = tf.tpu.experimental.embedding
B = 4
LR = 0.1
TABLES = {"video": (10, 4, "sum"), "user": (7, 3, "mean")}  # vocab, dim, combiner
FEATURES = {"watched": "video", "friends": "user"}
WEIGHTED = ("watched",)

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


def _log(rng, n):
    """n examples: ragged ids (0-3 per example, some empty), weights, dense, labels."""
    ids, weights = {}, {}
    for f, t in FEATURES.items():
        vocab = TABLES[t][0]
        ids[f] = [rng.integers(0, vocab, rng.integers(0, 4)).tolist() for _ in range(n)]
    weights["watched"] = [np.round(rng.uniform(0.25, 2.0, len(r)), 3).tolist()
                          for r in ids["watched"]]
    ids["watched"][1] = []  # an empty bag in the first batch
    weights["watched"][1] = []
    dense = rng.normal(size=(n, 2)).astype(np.float32)
    labels = (rng.random(n) < 0.5).astype(np.float32)
    return ids, weights, dense, labels


def _bag(ids, weights, feature, r):
    idx = ids[feature][r]
    return idx, (weights[feature][r] if feature in weights else [1.0] * len(idx))


def _reference_activations(tables, ids, weights, feature, rows):
    _, dim, combiner = TABLES[FEATURES[feature]]
    table = tables[FEATURES[feature]].astype(np.float64)
    out = np.zeros((len(rows), dim))
    for i, r in enumerate(rows):
        idx, w = _bag(ids, weights, feature, r)
        if idx:
            v = sum(wj * table[j] for j, wj in zip(idx, w))
            out[i] = v / sum(w) if combiner == "mean" else v
    return out


def _reference_sgd(tables, ids, weights, c, rows):
    new = {n: t.astype(np.float64).copy() for n, t in tables.items()}
    for feature, tname in FEATURES.items():
        combiner = TABLES[tname][2]
        for i, r in enumerate(rows):
            idx, w = _bag(ids, weights, feature, r)
            scale = 1.0 / sum(w) if combiner == "mean" and idx else 1.0
            for j, wj in zip(idx, w):
                new[tname][j] -= LR * scale * wj * c[feature][i]
    return new


def test_read_click_log_batches(tmp_path):
    rng = np.random.default_rng(0)
    ids, weights, dense, labels = _log(rng, 2 * B + 1)
    path = str(tmp_path / "log.parquet")
    parquet.write_click_log(path, labels, ids, weights, dense)
    batches = list(parquet.read_click_log(path, list(FEATURES), batch_size=B, num_dense=2,
                                          weighted=WEIGHTED))
    assert len(batches) == 2  # the ninth example is a partial batch, dropped
    for k, (d, got_ids, got_w, y) in enumerate(batches):
        rows = range(k * B, (k + 1) * B)
        np.testing.assert_array_equal(d.numpy(), dense[k * B:(k + 1) * B])
        np.testing.assert_array_equal(y.numpy(), labels[k * B:(k + 1) * B])
        assert set(got_w) == set(WEIGHTED)
        for f in FEATURES:
            assert got_ids[f].dtype == tf.int64
            assert got_ids[f].to_list() == [ids[f][r] for r in rows]
        np.testing.assert_allclose(got_w["watched"].flat_values.numpy(),
                                   np.concatenate([weights["watched"][r] for r in rows]),
                                   rtol=1e-6)
        np.testing.assert_array_equal(got_w["watched"].row_splits.numpy(),
                                      got_ids["watched"].row_splits.numpy())


def test_write_click_log_rejects_mismatched_weights(tmp_path):
    with pytest.raises(ValueError, match="feature 'watched': every example needs one weight"):
        parquet.write_click_log(str(tmp_path / "x.parquet"), [1.0], {"watched": [[1, 2]]},
                                {"watched": [[0.5]]})
    with pytest.raises(ValueError, match="weighted features \\['nope'\\] are not in"):
        parquet.read_click_log(str(tmp_path / "x.parquet"), ["watched"], batch_size=1,
                               weighted=["nope"])


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf_function"])
def test_parquet_tfio_enqueue_train_step(tmp_path, use_function):
    """Two training steps fed from the Parquet log through tf.data: the
    dequeued activations and the engine's SGD update match numpy."""
    rng = np.random.default_rng(1)
    ids, weights, dense, labels = _log(rng, 2 * B)
    path = str(tmp_path / "log.parquet")
    parquet.write_click_log(path, labels, ids, weights, dense)
    initial = {n: rng.uniform(-1, 1, (v, d)).astype(np.float32)
               for n, (v, d, _) in TABLES.items()}
    tables = {n: E.TableConfig(vocabulary_size=v, dim=d, combiner=comb, name=n,
                               initializer=tf.constant_initializer(initial[n]))
              for n, (v, d, comb) in TABLES.items()}
    fc = {f: E.FeatureConfig(tables[t], name=f) for f, t in FEATURES.items()}
    embedding = tf_tpu_emb.TPUEmbedding(fc, E.SGD(learning_rate=LR))
    cs = [{f: rng.normal(size=(B, TABLES[t][1])).astype(np.float32)
           for f, t in FEATURES.items()} for _ in range(2)]
    try:
        embedding.build(per_replica_batch_size=B)

        def step(features, feature_weights, c):
            embedding.enqueue(features, feature_weights, training=True)
            with tf.GradientTape() as tape:
                act = embedding.dequeue()
                tape.watch(act)
                loss = tf.add_n([tf.reduce_sum(act[f] * c[f]) for f in FEATURES])
            embedding.apply_gradients(tape.gradient(loss, act))
            return act

        if use_function:
            step = tf.function(step)
        want_tables = initial
        dataset = parquet.read_click_log(path, list(FEATURES), batch_size=B, num_dense=2,
                                         weighted=WEIGHTED)
        for k, (_, batch_ids, batch_weights, _) in enumerate(dataset):
            rows = range(k * B, (k + 1) * B)
            act = step(batch_ids, parquet.enqueue_weights(FEATURES, batch_weights), cs[k])
            for f in FEATURES:
                np.testing.assert_allclose(
                    act[f].numpy(),
                    _reference_activations(want_tables, ids, weights, f, rows),
                    rtol=1e-5, atol=1e-6, err_msg="step %d %s" % (k, f))
            want_tables = _reference_sgd(want_tables, ids, weights, cs[k], rows)
        assert k == 1
        for n in TABLES:
            np.testing.assert_allclose(embedding.embedding_tables[tables[n]].numpy(),
                                       want_tables[n], rtol=1e-5, atol=1e-6, err_msg=n)
    finally:
        embedding.shutdown()
