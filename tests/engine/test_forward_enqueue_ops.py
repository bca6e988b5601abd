"""Forward path of the engine through the other enqueue ops: the table-mode
ops (SparseBatch, IntegerBatch, Sparse/RaggedTensorBatch with num_features
and sequences, ArbitraryTensorBatch), rank-1 sample indices, a weighted and
an unweighted feature sharing a table, and the Dynamic* variants; checked
against the numpy reference of spec §4.2.
"""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from forward_common import B, FEATURES, L, _feature_config, _random_sequences, _table_config
from tf_tpu_emb import ops as tte_ops

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


# ========================================================= table-mode ops

def test_sparse_batch_addresses_rows_directly():
    """EnqueueTPUEmbeddingSparseBatch: input t = table t, sample index = b*nf + f."""
    config = eu.table_mode_config([TableSpec("video", 10, 4, num_features=2),
                                   TableSpec("user", 16, 3, num_features=1)], B)
    rng = np.random.default_rng(21)
    rows = {"video": B * 2, "user": B}
    vocab = {"video": 10, "user": 16}
    with eu.engine(config):
        tables = eu.load_random_tables(config, 21)
        args, bags = [], {}
        for name in ("video", "user"):
            b = eu.random_bags(rng, rows[name], vocab[name], weighted=True)
            bags[name] = b
            sample = [r for r, bag in enumerate(b) for _ in bag]
            order = rng.permutation(len(sample))  # row order in the COO input is free
            ids = [i for bag in b for i, _ in bag]
            ws = [w for bag in b for _, w in bag]
            args.append((np.array(sample, np.int32)[order], np.array(ids, np.int64)[order],
                         np.array(ws, np.float32)[order]))
        tf.raw_ops.EnqueueTPUEmbeddingSparseBatch(
            sample_indices=[a[0] for a in args], embedding_indices=[a[1] for a in args],
            aggregation_weights=[a[2] for a in args], mode_override="unspecified",
            combiners=["sqrtn", "mean"])
        video, user = eu.recv(config)
    eu.assert_close(video, eu.reference_lookup(tables["video"][0], bags["video"], "sqrtn"))
    eu.assert_close(user, eu.reference_lookup(tables["user"][0], bags["user"], "mean"))


def test_integer_batch_one_id_per_row():
    config = eu.table_mode_config([TableSpec("video", 10, 4, num_features=2),
                                   TableSpec("user", 16, 3, num_features=1)], B)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 22)
        v = np.array([9, 0, 3, 3, 1, 2, 8, 7], np.int32)
        u = np.array([15, 0, 4, 4], np.int32)
        tf.raw_ops.EnqueueTPUEmbeddingIntegerBatch(batch=[v, u], mode_override="unspecified")
        video, user = eu.recv(config)
    np.testing.assert_array_equal(video, tables["video"][0][v])
    np.testing.assert_array_equal(user, tables["user"][0][u])


def test_integer_batch_feature_mode():
    config = eu.feature_mode_config([TableSpec("t", 10, 2)],
                                    [FeatureSpec("a", 0, [3]), FeatureSpec("b", 0, [2, 2])])
    with eu.engine(config):
        e = eu.load_random_tables(config, 23)["t"][0]
        a = np.array([1, 2, 3], np.int32)
        b = np.array([4, 5, 6, 9], np.int32)
        tf.raw_ops.EnqueueTPUEmbeddingIntegerBatch(batch=[a, b], mode_override="train")
        ga, gb = eu.recv(config)
    np.testing.assert_array_equal(ga, e[a])
    np.testing.assert_array_equal(gb, e[b].reshape(2, 2, 2))


def _table_mode_nf_seq_config():
    # video: one plain feature; user: a 2-row feature and a length-3 sequence
    return eu.table_mode_config([TableSpec("video", 10, 4, num_features=1),
                                 TableSpec("user", 16, 3, num_features=2 + L)], B)


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
def test_table_mode_num_features_and_sequence(kind):
    rng = np.random.default_rng(31)
    config = _table_mode_nf_seq_config()
    plain = eu.random_bags(rng, B, 10, weighted=True)
    two = eu.random_bags(rng, B * 2, 16, weighted=True)  # sample row r -> (r//2, r%2)
    seqs = _random_sequences(rng, 16, [5, 0, 2, 3])
    if kind == "sparse":
        args = [eu.sparse_to_enqueue(*eu.bags_to_sparse(plain)),
                eu.sparse_to_enqueue(*eu.bags_to_sparse(two)),
                eu.sparse_to_enqueue(eu.bags_to_sparse(seqs)[0])]
        enqueue = eu.enqueue_sparse_tensor
    else:
        args = [eu.ragged_to_enqueue(*eu.bags_to_ragged(plain)),
                eu.ragged_to_enqueue(*eu.bags_to_ragged(two)),
                eu.ragged_to_enqueue(eu.bags_to_ragged(seqs)[0])]
        enqueue = eu.enqueue_ragged_tensor
    with eu.engine(config):
        tables = eu.load_random_tables(config, 31)
        enqueue(args, table_ids=[0, 1, 1], combiners=["mean", "sqrtn", "sum"],
                max_sequence_lengths=[0, 0, L], num_features=[1, 2, 1])
        video, user = eu.recv(config)
    eu.assert_close(video, eu.reference_lookup(tables["video"][0], plain, "mean"))
    u = tables["user"][0]
    want = eu.interleave_table_rows([
        eu.reference_lookup(u, two, "sqrtn").reshape(B, 2, 3),
        eu.reference_sequence(u, seqs, L)])
    eu.assert_close(user, want)


def test_table_mode_dense_sequence_and_num_features():
    """Empty sample indices: one id per (sample, row) of the feature."""
    config = _table_mode_nf_seq_config()
    with eu.engine(config):
        tables = eu.load_random_tables(config, 32)
        plain = np.array([1, 2, 3, 4], np.int64)
        two = np.arange(B * 2, dtype=np.int64)
        seq = np.arange(B * L, dtype=np.int64)[::-1].copy()
        e = eu.empty(tf.int32), eu.empty(tf.float32)
        eu.enqueue_sparse_tensor([(e[0], plain, e[1]), (e[0], two, e[1]), (e[0], seq, e[1])],
                                 table_ids=[0, 1, 1], max_sequence_lengths=[0, 0, L],
                                 num_features=[1, 2, 1])
        video, user = eu.recv(config)
    np.testing.assert_array_equal(video, tables["video"][0][plain])
    u = tables["user"][0]
    want = np.concatenate([u[two].reshape(B, 2, 3), u[seq].reshape(B, L, 3)], 1).reshape(-1, 3)
    np.testing.assert_array_equal(user, want)


def test_table_mode_arbitrary_batch():
    """ArbitraryTensorBatch in table mode: input i = table i ([batch*nf] rows)."""
    config = _table_config()
    rng = np.random.default_rng(33)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 33)
        bv = eu.random_bags(rng, B * 2, 10, weighted=True)
        bu = eu.random_bags(rng, B, 16, weighted=True)
        eu.enqueue_arbitrary([eu.sparse_to_enqueue(*eu.bags_to_sparse(bv)),
                              eu.ragged_to_enqueue(*eu.bags_to_ragged(bu))],
                             combiners=["mean", "sqrtn"])
        video, user = eu.recv(config)
    eu.assert_close(video, eu.reference_lookup(tables["video"][0], bv, "mean"))
    eu.assert_close(user, eu.reference_lookup(tables["user"][0], bu, "sqrtn"))


def test_mixed_weighted_and_unweighted_features_in_one_table():
    """Table mode: a weighted and an unweighted feature share the video rows."""
    config = _table_config()
    rng = np.random.default_rng(93)
    watched = eu.random_bags(rng, B, 10, weighted=True)
    friends = eu.random_bags(rng, B, 16, weighted=True)
    favorited = eu.random_bags(rng, B, 10)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 93)
        eu.enqueue_sparse_tensor([eu.sparse_to_enqueue(*eu.bags_to_sparse(watched)),
                                  eu.sparse_to_enqueue(*eu.bags_to_sparse(friends)),
                                  eu.sparse_to_enqueue(eu.bags_to_sparse(favorited)[0])],
                                 table_ids=[0, 1, 0], combiners=["mean", "sum", "sqrtn"])
        video, user = eu.recv(config)
    v = tables["video"][0]
    eu.assert_close(video, eu.interleave_table_rows([
        eu.reference_lookup(v, watched, "mean"), eu.reference_lookup(v, favorited, "sqrtn")]))
    eu.assert_close(user, eu.reference_lookup(tables["user"][0], friends, "sum"))


@pytest.mark.parametrize("mode", ["table", "feature"])
def test_rank1_sample_indices(mode):
    """SparseTensorBatch also takes rank-1 sample indices (sp_ids.indices[:, 0],
    TF's op doc), in both config modes: each id joins the bag of its sample."""
    config = _table_config() if mode == "table" else _feature_config()
    combiners = ["sqrtn"] * 3 if mode == "table" else ["mean", "sqrtn", "sum"]
    rng = np.random.default_rng(95)
    bags = [eu.random_bags(rng, B, 10 if t == 0 else 16, weighted=True) for _, t in FEATURES]
    args = []
    for b in bags:
        idx, ids, w = eu.sparse_to_enqueue(*eu.bags_to_sparse(b))
        args.append((idx[:, 0], ids, w))
    with eu.engine(config):
        tables = eu.load_random_tables(config, 95)
        eu.enqueue_sparse_tensor(args, table_ids=[0, 1, 0], combiners=combiners)
        got = eu.recv(config)
    names = {0: "video", 1: "user"}
    want = [eu.reference_lookup(tables[names[t]][0], bags[o], combiners[o])
            for o, (_, t) in enumerate(FEATURES)]
    if mode == "table":
        want = [eu.interleave_table_rows([want[0], want[2]]), want[1]]
    for g, w in zip(got, want):
        eu.assert_close(g, w)


# ====================================================== dynamic variants

def test_dynamic_arbitrary_and_ragged():
    rng = np.random.default_rng(41)
    fconfig = _feature_config()
    bags = [eu.random_bags(rng, B, 10 if t == 0 else 16, weighted=True) for _, t in FEATURES]
    with eu.engine(fconfig):
        tables = eu.load_random_tables(fconfig, 41)
        args = [eu.ragged_to_enqueue(*eu.bags_to_ragged(b)) for b in bags]
        tf.raw_ops.DynamicEnqueueTPUEmbeddingArbitraryTensorBatch(
            sample_indices_or_row_splits=[a[0] for a in args],
            embedding_indices=[a[1] for a in args], aggregation_weights=[a[2] for a in args],
            mode_override="train", device_ordinal=tf.constant(0, tf.int32),
            combiners=["mean", "sum"])
        arb = eu.recv(fconfig)
        tf.raw_ops.DynamicEnqueueTPUEmbeddingRaggedTensorBatch(
            sample_splits=[a[0] for a in args], embedding_indices=[a[1] for a in args],
            aggregation_weights=[a[2] for a in args], mode_override="inference",
            device_ordinal=tf.constant(-1, tf.int32), combiners=["sqrtn"] * 3,
            table_ids=[0, 1, 0])
        rag = eu.recv(fconfig)
        # the prefixed wrappers too
        tte_ops.dynamic_enqueue_tpu_embedding_arbitrary_tensor_batch(
            [a[0] for a in args], [a[1] for a in args], [a[2] for a in args],
            device_ordinal=tf.constant(0, tf.int32), combiners=["sum", "sum"])
        pre = eu.recv(fconfig)
    names = ["video", "user", "video"]
    for o in range(3):
        t = tables[names[o]][0]
        eu.assert_close(arb[o], eu.reference_lookup(t, bags[o], ["mean", "sum", "mean"][o]))
        eu.assert_close(rag[o], eu.reference_lookup(t, bags[o], "sqrtn"))
        eu.assert_close(pre[o], eu.reference_lookup(t, bags[o], "sum"))
