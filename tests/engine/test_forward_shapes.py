"""Forward path of the engine: input shapes and encodings.

Sequence features (truncation and padding, COO with and without the padded
column, ragged), high-dimensional features, COO indices with trailing or
missing columns, empty bags and zero weight sums, the index/id/weight dtypes,
a large batch (the thread-pool path), and the enqueue's in-order fast path
against its general grouping; checked against the numpy reference of spec
§4.2 and, where TF has one, TF's TPUEmbeddingForServing (spec §4.7).
"""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from forward_common import (B, FEATURES, L, _feature_config, _random_sequences, _seed,
                            _table_config)

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


# ================================================= sequences, shapes, bags

@pytest.mark.parametrize("encoding", ["coo_r", "coo_padded", "ragged"])
def test_sequence_feature_truncates_and_pads(encoding):
    lengths = [0, 2, 3, 5]  # empty, padded, exact, truncated
    config = eu.feature_mode_config([TableSpec("user", 16, 3)],
                                    [FeatureSpec("seq", 0, [B, L])])
    rng = np.random.default_rng(5)
    seqs = _random_sequences(rng, 16, lengths)
    sp, _ = eu.bags_to_sparse(seqs)  # indices (b, p): the sparse sequence input
    rg, _ = eu.bags_to_ragged(seqs)
    if encoding == "coo_r":
        args = eu.sparse_to_enqueue(sp)
    elif encoding == "coo_padded":  # what TF's v2 API sends: [b, p, 0]
        args = eu.sparse_to_enqueue(sp, pad_sequence=True)
    else:
        args = eu.ragged_to_enqueue(rg)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 5)
        eu.enqueue_arbitrary([args])
        (got,) = eu.recv(config)
    table = tables["user"][0]
    eu.assert_close(got, eu.reference_sequence(table, seqs, L))
    oracle = eu.serving_lookup({"user": (table, "mean")},
                               {"seq": ("user", {"max_sequence_length": L})},
                               {"seq": rg if encoding == "ragged" else sp})
    eu.assert_close(got, oracle["seq"], what="serving")


@pytest.mark.parametrize("shape", [[2, 2], [2, 3, 4]])
@pytest.mark.parametrize("kind", ["sparse", "ragged", "dense"])
def test_high_dimensional_features(shape, kind):
    config = eu.feature_mode_config([TableSpec("video", 12, 4), TableSpec("user", 9, 2)],
                                    [FeatureSpec("hd", 0, shape), FeatureSpec("flat", 1, [2])])
    rng = np.random.default_rng(len(shape))
    positions = int(np.prod(shape))
    weighted = kind != "dense"
    bags = eu.random_bags(rng, positions, 12, weighted=weighted, exactly_one=kind == "dense")
    flat_bags = eu.random_bags(rng, 2, 9)
    if kind == "sparse":
        sp, spw = eu.bags_to_sparse(bags, shape)
        args, oracle_in, oracle_w = eu.sparse_to_enqueue(sp, spw), sp, spw
    elif kind == "ragged":  # one row per output position, row-major
        rg, rgw = eu.bags_to_ragged(bags)
        args, oracle_in, oracle_w = eu.ragged_to_enqueue(rg, rgw), None, None
    else:
        dense = eu.bags_to_dense(bags, shape, id_dtype=tf.int32)
        args, oracle_in, oracle_w = eu.dense_to_enqueue(dense), dense, None
    with eu.engine(config):
        tables = eu.load_random_tables(config, 1)
        eu.enqueue_arbitrary([args, eu.sparse_to_enqueue(eu.bags_to_sparse(flat_bags)[0])],
                             combiners=["mean", "sum"])
        hd, flat = eu.recv(config)
    video = tables["video"][0]
    eu.assert_close(hd, eu.reference_lookup(video, bags, "mean", shape))
    eu.assert_close(flat, eu.reference_lookup(tables["user"][0], flat_bags, "sum"))
    if oracle_in is not None:
        oracle = eu.serving_lookup({"video": (video, "mean")},
                                   {"hd": ("video", {"output_shape": shape})},
                                   {"hd": oracle_in}, {"hd": oracle_w})
        eu.assert_close(hd, oracle["hd"], what="serving")


def test_high_dimensional_ragged_sequences():
    """Row splits with one row per sequence (rows * last_dim == positions):
    element j of a row goes to position j of it, truncated at the last dim."""
    shape = [2, 3, 4]  # 6 sequences of length 4
    config = eu.feature_mode_config([TableSpec("video", 12, 4)], [FeatureSpec("s", 0, shape)])
    rng = np.random.default_rng(2)
    seqs = _random_sequences(rng, 12, [0, 1, 4, 6, 3, 2])
    rg, _ = eu.bags_to_ragged(seqs)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 2)
        eu.enqueue_arbitrary([eu.ragged_to_enqueue(rg)])
        (got,) = eu.recv(config)
    want = eu.reference_sequence(tables["video"][0], seqs, 4).reshape(shape + [4])
    eu.assert_close(got, want)


def test_coo_trailing_columns_past_shape_are_dropped():
    """With r + 1 columns, columns 1..r-1 past the input_shape dim are dropped
    (sequence truncation); the last column is the position inside the bag."""
    config = eu.feature_mode_config([TableSpec("t", 8, 2)], [FeatureSpec("f", 0, [2, 2])])
    idx = np.array([[0, 0, 0], [0, 0, 1], [0, 5, 0], [1, 1, 7], [1, 2, 0]], np.int64)
    ids = np.array([1, 2, 3, 4, 5], np.int64)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 4)
        eu.enqueue_arbitrary([(idx, ids, eu.empty(tf.float32))])
        (got,) = eu.recv(config)
    e = tables["t"][0]
    want = np.zeros((2, 2, 2))
    want[0, 0] = e[1] + e[2]
    want[1, 1] = e[4]
    eu.assert_close(got, want)


@pytest.mark.parametrize("encoding", ["empty_indices", "all_empty_coo", "zero_splits"])
def test_all_bags_empty_gives_zeros(encoding):
    config = _feature_config()
    with eu.engine(config):
        eu.load_random_tables(config, 9)
        if encoding == "empty_indices":  # no ids at all => every bag empty
            arg = (eu.empty(tf.int32), eu.empty(tf.int64), eu.empty(tf.float32))
        elif encoding == "all_empty_coo":
            arg = (tf.zeros([0, 2], tf.int64), eu.empty(tf.int64), eu.empty(tf.float32))
        else:
            arg = (tf.zeros([B + 1], tf.int32), eu.empty(tf.int64), eu.empty(tf.float32))
        eu.enqueue_arbitrary([arg] * 3, combiners=["mean", "sqrtn"])
        got = eu.recv(config)
    for o, shape in enumerate(eu.output_shapes(config)):
        np.testing.assert_array_equal(got[o], np.zeros(shape, np.float32))


def test_zero_weight_sum_gives_zeros_for_mean_and_sqrtn():
    config = eu.feature_mode_config([TableSpec("t", 8, 2)],
                                    [FeatureSpec("m", 0, [2]), FeatureSpec("s", 0, [2]),
                                     FeatureSpec("u", 0, [2])])
    idx = np.array([[0, 0], [0, 1], [1, 0]], np.int32)
    ids = np.array([1, 2, 3], np.int32)
    w = np.array([1.0, -1.0, 0.0], np.float32)  # bag 0 sums to 0, bag 1 all zero
    with eu.engine(config):
        e = eu.load_random_tables(config, 8)["t"][0]
        eu.enqueue_arbitrary([(idx, ids, w)] * 3, combiners=["mean", "sqrtn", "sum"])
        m, s, u = eu.recv(config)
    np.testing.assert_array_equal(m, np.zeros((2, 2)))
    eu.assert_close(s[0], (e[1] - e[2]) / np.sqrt(2.0))
    np.testing.assert_array_equal(s[1], np.zeros(2))
    eu.assert_close(u, np.stack([e[1] - e[2], np.zeros(2)]))


@pytest.mark.parametrize("index_dtype,id_dtype,weight_dtype", [
    (tf.int32, tf.int32, tf.float32),
    (tf.int64, tf.int64, tf.float64),
    (tf.int32, tf.int64, tf.float64),
    (tf.int64, tf.int32, tf.float32),
])
def test_input_dtypes(index_dtype, id_dtype, weight_dtype):
    """int32/int64 indices, splits and ids, float32/float64 weights, through
    Arbitrary (COO and splits) and table-mode SparseTensor/RaggedTensor."""
    rng = np.random.default_rng(13)
    bags = [eu.random_bags(rng, B, 10 if t == 0 else 16, weighted=True) for _, t in FEATURES]
    cast = dict(id_dtype=id_dtype, weight_dtype=weight_dtype)

    def sparse(b):
        return eu.sparse_to_enqueue(*eu.bags_to_sparse(b), index_dtype=index_dtype, **cast)

    def ragged(b):
        return eu.ragged_to_enqueue(*eu.bags_to_ragged(b), splits_dtype=index_dtype, **cast)

    fconfig, tconfig = _feature_config(), _table_config()
    results = {}
    with eu.engine(fconfig):
        tables = eu.load_random_tables(fconfig, 13)
        eu.enqueue_arbitrary([sparse(bags[0]), ragged(bags[1]), sparse(bags[2])],
                             combiners=["mean", "sqrtn"])
        results["arbitrary"] = eu.recv(fconfig)
    with eu.engine(tconfig):
        eu.load_random_tables(tconfig, 13)
        eu.enqueue_sparse_tensor([sparse(b) for b in bags], [0, 1, 0],
                                 combiners=["mean", "sqrtn"])
        results["sparse_tensor"] = eu.recv(tconfig)
        eu.enqueue_ragged_tensor([ragged(b) for b in bags], [0, 1, 0],
                                 combiners=["mean", "sqrtn"])
        results["ragged_tensor"] = eu.recv(tconfig)
    ref = [eu.reference_lookup(tables["video"][0], bags[0], "mean"),
           eu.reference_lookup(tables["user"][0], bags[1], "sqrtn"),
           eu.reference_lookup(tables["video"][0], bags[2], "mean")]
    for o in range(3):
        eu.assert_close(results["arbitrary"][o], ref[o], what="arbitrary %d" % o)
    for name in ("sparse_tensor", "ragged_tensor"):
        eu.assert_close(results[name][0], eu.interleave_table_rows([ref[0], ref[2]]), what=name)
        eu.assert_close(results[name][1], ref[1], what=name)


def test_large_batch_uses_thread_pool():
    """Thousands of bags over several outputs (the sharded ParallelFor path)."""
    big = 2048
    config = eu.feature_mode_config(
        [TableSpec("a", 1000, 16), TableSpec("b", 300, 8)],
        [FeatureSpec("x", 0, [big]), FeatureSpec("y", 1, [big // 4, 4]),
         FeatureSpec("z", 0, [7])])
    rng = np.random.default_rng(94)
    bx = eu.random_bags(rng, big, 1000, weighted=True, max_len=6)
    by = eu.random_bags(rng, big, 300, max_len=4)
    bz = eu.random_bags(rng, 7, 1000, weighted=True)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 94)
        eu.enqueue_arbitrary([eu.ragged_to_enqueue(*eu.bags_to_ragged(bx)),
                              eu.sparse_to_enqueue(eu.bags_to_sparse(by, [big // 4, 4])[0]),
                              eu.sparse_to_enqueue(*eu.bags_to_sparse(bz))],
                             combiners=["sqrtn", "mean"])
        x, y, z = eu.recv(config)
    eu.assert_close(x, eu.reference_lookup(tables["a"][0], bx, "sqrtn"))
    eu.assert_close(y, eu.reference_lookup(tables["b"][0], by, "mean", [big // 4, 4]))
    eu.assert_close(z, eu.reference_lookup(tables["a"][0], bz, "sqrtn"))


def test_coo_with_r_columns_groups_duplicates_into_bags():
    """COO indices with r columns: each row addresses an output position
    directly; several ids at one position form a bag."""
    config = eu.feature_mode_config([TableSpec("t", 10, 2)],
                                    [FeatureSpec("f", 0, [3]), FeatureSpec("g", 0, [2, 3])])
    e0 = eu.empty(tf.float32)
    with eu.engine(config):
        e = eu.load_random_tables(config, 97)["t"][0]
        eu.enqueue_arbitrary([(np.array([[2], [0], [0]]), np.array([3, 1, 2]), e0),
                              (np.array([[0, 0], [1, 2], [0, 0]]), np.array([4, 6, 5]), e0)],
                             combiners=["mean"])
        f, g = eu.recv(config)
    eu.assert_close(f, np.stack([(e[1] + e[2]) / 2, np.zeros(2), e[3]]))
    want = np.zeros((2, 3, 2))
    want[0, 0] = (e[4] + e[5]) / 2
    want[1, 2] = e[6]
    eu.assert_close(g, want)


# ============================================= in-order fast path of the enqueue

@pytest.mark.parametrize("id_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("weighted", [False, True])
def test_in_order_input_matches_the_general_grouping(id_dtype, weighted):
    """Row-major COO indices (one source per output, positions never
    decreasing) take the enqueue's copy-as-is path; the same bags given in a
    shuffled bag order take the general counting-sort grouping.  The order of
    the ids inside each bag is kept, so the two batches must be identical:
    the activations and one Adagrad step (which sums contributions in batch
    order) are compared bit for bit.  Empty bags at the start, in the middle
    and at the end are included."""
    rng = np.random.default_rng(_seed("in-order", id_dtype.name, weighted))
    config = eu.feature_mode_config([TableSpec("t", 20, 5)], [FeatureSpec("f", 0, [12])])
    bags = eu.random_bags(rng, 12, 20, max_len=4, weighted=weighted)
    bags[0], bags[5], bags[11] = [], [], []
    bags[3] = [(7, 1.5), (7, 0.5), (2, 1.0)] if weighted else [(7, 1.0), (7, 1.0), (2, 1.0)]

    def coo(bag_order):
        idx, ids, ws = [], [], []
        for p in bag_order:
            for k, (i, w) in enumerate(bags[p]):
                idx.append([p, k])
                ids.append(i)
                ws.append(w)
        w = tf.constant(ws, tf.float32) if weighted else eu.empty(tf.float32)
        return (tf.constant(np.array(idx, np.int32).reshape(-1, 2)), tf.constant(ids, id_dtype), w)

    grad = rng.standard_normal((12, 5)).astype(np.float32)
    results = []
    for order in (np.arange(12), rng.permutation(12)):
        with eu.engine(config):
            eu.load_random_tables(config, 5)
            eu.enqueue_arbitrary([coo(order)], combiners=["sqrtn"])
            (act,) = eu.recv(config)
            tf.raw_ops.SendTPUEmbeddingGradients(inputs=[grad], learning_rates=[],
                                                 config=eu.serialize(config))
            results.append((act, eu.retrieve_table(config.table_descriptor[0])))
    (act0, state0), (act1, state1) = results
    np.testing.assert_array_equal(act0, act1)
    for a, b in zip(state0, state1):
        np.testing.assert_array_equal(a, b)
    tables = None
    with eu.engine(config):
        tables = eu.load_random_tables(config, 5)
    eu.assert_close(act0, eu.reference_lookup(tables["t"][0], bags, "sqrtn"))
