"""Forward path of the engine: enqueue -> RecvTPUEmbeddingActivations.

Every result is checked against a numpy reference written from the spec
formulas (spec §4.2) and, where TF has one, against TF's own CPU oracle
TPUEmbeddingForServing (spec §4.7), so a wrong combiner, a wrong row layout
or a wrong bag assignment cannot agree with both.  Load/Retrieve round trips
are checked bit-exact against numpy slicing of the sharded tables (spec §2.7).
"""
import zlib

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_library

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from tf_tpu_emb import ops as tte_ops
from tf_tpu_emb.optimizers import BY_PROTO_FIELD

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]

B = 4
COMBINERS = ["sum", "mean", "sqrtn"]


def _seed(*parts):
    """A seed that is stable across processes (str hash is randomised)."""
    return zlib.crc32(repr(parts).encode())


def _tables(optimizer="adagrad", nf=(0, 0)):
    return [TableSpec("video", 10, 4, optimizer, num_features=nf[0]),
            TableSpec("user", 16, 3, optimizer, num_features=nf[1])]


# Three features, two of them sharing the video table.
FEATURES = [("watched", 0), ("friends", 1), ("favorited", 0)]


def _feature_config():
    return eu.feature_mode_config(_tables(), [FeatureSpec(n, t, [B]) for n, t in FEATURES])


def _table_config():
    return eu.table_mode_config(_tables(nf=(2, 1)), B)


def _make_inputs(kind, bags, weighted):
    """(serving input, serving weight, enqueue args) of one feature."""
    if kind == "dense":
        dense = eu.bags_to_dense(bags)
        if weighted:  # serving refuses weights on dense input: give it the sparse form
            sp, spw = eu.bags_to_sparse(bags)
            return sp, spw, (eu.empty(tf.int32), tf.reshape(dense, [-1]),
                             tf.constant([w for b in bags for _, w in b], tf.float32))
        return dense, None, eu.dense_to_enqueue(dense)
    if kind == "sparse":
        sp, spw = eu.bags_to_sparse(bags)
        return sp, (spw if weighted else None), eu.sparse_to_enqueue(sp, spw if weighted else None)
    rg, rgw = eu.bags_to_ragged(bags)
    return rg, (rgw if weighted else None), eu.ragged_to_enqueue(rg, rgw if weighted else None)


# ======================================================= combiner matrix

@pytest.mark.parametrize("mode", ["feature", "table"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("kind", ["dense", "sparse", "ragged"])
@pytest.mark.parametrize("combiner", COMBINERS)
def test_combiner_matrix(combiner, kind, weighted, mode):
    seed = _seed(combiner, kind, weighted, mode)
    rng = np.random.default_rng(seed)
    config = _feature_config() if mode == "feature" else _table_config()
    with eu.engine(config):
        tables = eu.load_random_tables(config, seed)
        vocab = {"video": 10, "user": 16}
        tname = {0: "video", 1: "user"}
        bags, serving_in, serving_w, args, ref = {}, {}, {}, [], {}
        for fname, t in FEATURES:
            b = eu.random_bags(rng, B, vocab[tname[t]], weighted=weighted,
                               exactly_one=kind == "dense")
            if kind != "dense":
                b[1] = []  # always at least one empty bag
            bags[fname] = b
            serving_in[fname], serving_w[fname], a = _make_inputs(kind, b, weighted)
            args.append(a)
            ref[fname] = eu.reference_lookup(tables[tname[t]][0], b, combiner)

        if mode == "feature":
            # combiners per table, as TF's v2 API passes them
            eu.enqueue_arbitrary(args, combiners=[combiner, combiner])
        else:
            enqueue = eu.enqueue_ragged_tensor if kind == "ragged" else eu.enqueue_sparse_tensor
            enqueue(args, table_ids=[t for _, t in FEATURES], combiners=[combiner] * 3)
        got = eu.recv(config)

    oracle = eu.serving_lookup(
        {n: (tables[n][0], combiner) for n in ("video", "user")},
        {f: (tname[t], {}) for f, t in FEATURES}, serving_in,
        serving_w if weighted else None)
    if mode == "feature":
        for o, (fname, _) in enumerate(FEATURES):
            eu.assert_close(got[o], ref[fname], what="numpy " + fname)
            eu.assert_close(got[o], oracle[fname], what="serving " + fname)
    else:
        # video rows b*2 + f: f=0 watched, f=1 favorited (input order)
        eu.assert_close(got[0], eu.interleave_table_rows([ref["watched"], ref["favorited"]]),
                        what="numpy video")
        eu.assert_close(got[0], eu.interleave_table_rows([oracle["watched"],
                                                          oracle["favorited"]]),
                        what="serving video")
        eu.assert_close(got[1], ref["friends"], what="numpy user")
        eu.assert_close(got[1], oracle["friends"], what="serving user")


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
def test_feature_mode_sparse_and_ragged_tensor_ops(kind):
    """SparseTensorBatch / RaggedTensorBatch in a feature-descriptor config
    behave like ArbitraryTensorBatch (table_ids must match the features)."""
    rng = np.random.default_rng(7)
    config = _feature_config()
    with eu.engine(config):
        tables = eu.load_random_tables(config, 7)
        names = {0: "video", 1: "user"}
        bags = [eu.random_bags(rng, B, 10 if t == 0 else 16, weighted=True) for _, t in FEATURES]
        args = [_make_inputs(kind, b, True)[2] for b in bags]
        enqueue = eu.enqueue_ragged_tensor if kind == "ragged" else eu.enqueue_sparse_tensor
        # per-input combiners (3 inputs, 2 tables)
        enqueue(args, table_ids=[0, 1, 0], combiners=["mean", "sqrtn", "sum"])
        got = eu.recv(config)
    for o, ((_, t), comb) in enumerate(zip(FEATURES, ["mean", "sqrtn", "sum"])):
        eu.assert_close(got[o], eu.reference_lookup(tables[names[t]][0], bags[o], comb))


def test_combiners_per_table_win_for_arbitrary_when_lengths_match():
    """Two inputs, two tables: for ArbitraryTensorBatch a 2-list is per table;
    for SparseTensorBatch it is per input (features ordered table 1, table 0)."""
    tables = [TableSpec("a", 6, 2), TableSpec("b", 6, 2)]
    config = eu.feature_mode_config(tables, [FeatureSpec("fb", 1, [B]),
                                             FeatureSpec("fa", 0, [B])])
    rng = np.random.default_rng(3)
    bags = [eu.random_bags(rng, B, 6, weighted=True, allow_empty=False) for _ in range(2)]
    args = [eu.sparse_to_enqueue(*eu.bags_to_sparse(b)) for b in bags]
    with eu.engine(config):
        st = eu.load_random_tables(config, 3)
        eu.enqueue_arbitrary(args, combiners=["mean", "sqrtn"])  # table a: mean, b: sqrtn
        per_table = eu.recv(config)
        eu.enqueue_sparse_tensor(args, table_ids=[1, 0], combiners=["mean", "sqrtn"])
        per_input = eu.recv(config)
    eu.assert_close(per_table[0], eu.reference_lookup(st["b"][0], bags[0], "sqrtn"))
    eu.assert_close(per_table[1], eu.reference_lookup(st["a"][0], bags[1], "mean"))
    eu.assert_close(per_input[0], eu.reference_lookup(st["b"][0], bags[0], "mean"))
    eu.assert_close(per_input[1], eu.reference_lookup(st["a"][0], bags[1], "sqrtn"))


def test_default_combiner_is_sum_and_default_weights_are_one():
    config = _feature_config()
    rng = np.random.default_rng(11)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 11)
        bags = [eu.random_bags(rng, B, 10 if t == 0 else 16) for _, t in FEATURES]
        eu.enqueue_arbitrary([eu.sparse_to_enqueue(eu.bags_to_sparse(b)[0]) for b in bags])
        got = eu.recv(config)
    for o, (_, t) in enumerate(FEATURES):
        eu.assert_close(got[o], eu.reference_lookup(tables[["video", "user"][t]][0],
                                                    bags[o], "sum"))


# ======================================================= spec §4.2 numbers

def _spec_config():
    return eu.feature_mode_config(
        [TableSpec("video", 8, 4), TableSpec("user", 16, 2)],
        [FeatureSpec("v", 0, [4]), FeatureSpec("um", 1, [4]), FeatureSpec("us", 1, [4])])


SPEC_BAGS_W = [[(3, 2.0)], [(0, 1.0), (1, 3.0)], [], [(0, 1.0), (1, 1.0), (2, 2.0)]]
SPEC_EXPECTED = {
    True: [[[24, 26, 28, 30], [12, 16, 20, 24], [0, 0, 0, 0], [20, 24, 28, 32]],
           [[6, 7], [1.5, 2.5], [0, 0], [2.5, 3.5]],
           [[6, 7], [1.8974, 3.1623], [0, 0], [4.0825, 5.7155]]],
    False: [[[12, 13, 14, 15], [4, 6, 8, 10], [0, 0, 0, 0], [12, 15, 18, 21]],
            [[6, 7], [1, 2], [0, 0], [2, 3]],
            [[6, 7], [1.4142, 2.8284], [0, 0], [3.4641, 5.1962]]],
}


def _load_arange(config):
    e0 = np.arange(32, dtype=np.float32).reshape(8, 4)
    e1 = np.arange(32, dtype=np.float32).reshape(16, 2)
    for t, e in enumerate([e0, e1]):
        desc = config.table_descriptor[t]
        eu.load_table(desc, [e, np.full_like(e, 0.1)], table_id=t)
    return e0, e1


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
@pytest.mark.parametrize("weighted", [True, False], ids=["weighted", "unweighted"])
def test_spec_reference_numbers(kind, weighted):
    config = _spec_config()
    bags = SPEC_BAGS_W if weighted else eu.unit_weights(SPEC_BAGS_W)
    with eu.engine(config):
        _load_arange(config)
        args = [_make_inputs(kind, bags, weighted)[2] for _ in range(3)]
        eu.enqueue_arbitrary(args, combiners=["sum", "mean", "sqrtn"])  # per input
        got = eu.recv(config)
    for o in range(3):
        np.testing.assert_allclose(got[o], np.array(SPEC_EXPECTED[weighted][o]), atol=1e-4)


def test_spec_reference_sequence_and_high_dimensional():
    config = eu.feature_mode_config(
        [TableSpec("user", 16, 2)],
        [FeatureSpec("seq", 0, [2, 2]), FeatureSpec("hd", 0, [2, 2])])
    e = np.arange(32, dtype=np.float32).reshape(16, 2)
    with eu.engine(config):
        eu.load_table(config.table_descriptor[0], [e, np.full_like(e, 0.1)])
        seq_idx = np.array([[0, 0], [1, 0], [1, 1], [1, 2]], np.int64)  # r1 position 2 truncated
        seq_ids = np.array([3, 0, 1, 2], np.int64)
        hd_idx = np.array([[0, 0, 0], [0, 1, 0], [0, 1, 1], [1, 0, 0]], np.int32)
        hd_ids = np.array([1, 2, 3, 4], np.int32)
        eu.enqueue_arbitrary([(seq_idx, seq_ids, eu.empty(tf.float32)),
                              (hd_idx, hd_ids, eu.empty(tf.float32))], combiners=["mean"])
        seq, hd = eu.recv(config)
    np.testing.assert_array_equal(seq, [[[6, 7], [0, 0]], [[0, 1], [2, 3]]])
    np.testing.assert_array_equal(hd, [[[2, 3], [5, 6]], [[8, 9], [0, 0]]])


# ================================================= sequences, shapes, bags

L = 3


def _random_sequences(rng, vocab, lengths):
    return [[(int(i), 1.0) for i in rng.integers(0, vocab, n)] for n in lengths]


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


# ============================================== quantization, modes, queue

def test_simulated_quantization():
    q = (-0.5, 0.75, 6)
    config = eu.feature_mode_config(
        [TableSpec("q", 10, 4, quantization=q), TableSpec("plain", 10, 4)],
        [FeatureSpec("a", 0, [B]), FeatureSpec("b", 1, [B])])
    rng = np.random.default_rng(51)
    bags = [eu.random_bags(rng, B, 10, weighted=True) for _ in range(2)]
    with eu.engine(config):
        tables = eu.load_random_tables(config, 51)
        eu.enqueue_arbitrary([eu.sparse_to_enqueue(*eu.bags_to_sparse(b)) for b in bags],
                             combiners=["mean", "mean"])
        a, b = eu.recv(config)
    eu.assert_close(a, eu.reference_lookup(tables["q"][0], bags[0], "mean", quant=q))
    eu.assert_close(b, eu.reference_lookup(tables["plain"][0], bags[1], "mean"))
    # sanity: the quantized result is really different from the plain one
    assert not np.allclose(a, eu.reference_lookup(tables["q"][0], bags[0], "mean"))


def test_quantize_reference_hand_values():
    # lo=-1, hi=1, 5 buckets: step 0.5 -> grid {-1,-0.5,0,0.5,1}
    got = eu.quantize([-3.0, -0.76, -0.74, 0.1, 0.26, 0.9, 7.0], -1.0, 1.0, 5)
    np.testing.assert_array_equal(got, np.float32([-1, -1, -0.5, 0, 0.5, 1, 1]))


@pytest.mark.parametrize("config_mode,override", [
    (eu.INFERENCE, "unspecified"), (eu.TRAINING, "inference"), (eu.INFERENCE, "train")])
def test_inference_mode_lookup(config_mode, override):
    config = eu.feature_mode_config(_tables(), [FeatureSpec(n, t, [B]) for n, t in FEATURES],
                                    mode=config_mode)
    rng = np.random.default_rng(61)
    bags = [eu.random_bags(rng, B, 10 if t == 0 else 16) for _, t in FEATURES]
    with eu.engine(config):
        tables = eu.load_random_tables(config, 61)
        eu.enqueue_arbitrary([eu.sparse_to_enqueue(eu.bags_to_sparse(b)[0]) for b in bags],
                             combiners=["mean", "mean"], mode=override)
        got = eu.recv(config)
    for o, (_, t) in enumerate(FEATURES):
        eu.assert_close(got[o], eu.reference_lookup(tables[["video", "user"][t]][0], bags[o],
                                                    "mean"))


def test_queue_is_fifo():
    config = _feature_config()
    with eu.engine(config):
        tables = eu.load_random_tables(config, 71)
        batches = []
        for k in range(3):
            ids = [np.array([k, k + 1, k + 2, k + 3], np.int32) for _ in FEATURES]
            batches.append(ids)
            eu.enqueue_arbitrary([(eu.empty(tf.int32), i, eu.empty(tf.float32)) for i in ids])
        outs = [eu.recv(config) for _ in range(3)]
    for k in range(3):
        for o, (_, t) in enumerate(FEATURES):
            np.testing.assert_array_equal(outs[k][o],
                                          tables[["video", "user"][t]][0][batches[k][o]])


def test_recv_inside_tf_function():
    config = _feature_config()
    cfg = config.SerializeToString()

    @tf.function
    def step(ids0, ids1, ids2):
        e32, ef = tf.zeros([0], tf.int32), tf.zeros([0], tf.float32)
        enqueue = tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
            sample_indices_or_row_splits=[e32, e32, e32], embedding_indices=[ids0, ids1, ids2],
            aggregation_weights=[ef, ef, ef], mode_override="train")
        # TF's automatic control dependencies do not order stateful ops that
        # have no resource inputs, so the Recv must be ordered explicitly.
        with tf.control_dependencies([enqueue]):
            return tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=3, config=cfg)

    @tf.function
    def recv_only():  # our prefixed op inside a tf.function
        return tte_ops.recv_tpu_embedding_activations(num_outputs=3, config=cfg)

    with eu.engine(config):
        tables = eu.load_random_tables(config, 81)
        ids = [np.array([1, 2, 3, 4], np.int64), np.array([5, 6, 7, 15], np.int64),
               np.array([0, 9, 0, 9], np.int64)]
        outs = step(*ids)
        assert [o.shape.as_list() for o in outs] == eu.output_shapes(config)
        outs2 = step(*[i[::-1].copy() for i in ids])  # retrace-free second step
        eu.enqueue_arbitrary([(eu.empty(tf.int32), i, eu.empty(tf.float32)) for i in ids])
        outs3 = recv_only()
    names = ["video", "user", "video"]
    for o in range(3):
        t = tables[names[o]][0]
        np.testing.assert_array_equal(outs[o].numpy(), t[ids[o]])
        np.testing.assert_array_equal(outs2[o].numpy(), t[ids[o][::-1]])
        np.testing.assert_array_equal(outs3[o].numpy(), t[ids[o]])


def test_is_initialized_and_shutdown():
    assert not eu.is_initialized()
    config = _feature_config()
    with eu.engine(config):
        assert eu.is_initialized()
        assert bool(tte_ops.is_tpu_embedding_initialized().numpy())
    assert not eu.is_initialized()
    # reconfigure after shutdown works and starts from zero tables
    with eu.engine(config):
        eu.enqueue_arbitrary([(eu.empty(tf.int32), np.array([1, 2, 3, 4]), eu.empty(tf.float32))]
                             * 3)
        for o in eu.recv(config):
            assert not o.any()


# ======================================================= load / retrieve

ROUNDTRIP_OPTIMIZERS = ["stochastic_gradient_descent", "adagrad", "adam", "ftrl",
                        "centered_rms_prop", "proximal_yogi", "frequency_estimator",
                        "lion", "online_yogi", "assign", "frequency_aware_adagrad"]


@pytest.mark.parametrize("sharding", [eu.DIV, eu.MOD], ids=["div", "mod"])
@pytest.mark.parametrize("optimizer", ROUNDTRIP_OPTIMIZERS)
def test_load_retrieve_roundtrip_sharded(optimizer, sharding):
    vocab, dim, n = 10, 3, 3
    config = eu.feature_mode_config([TableSpec("pad", 4, 2, "adagrad"),
                                     TableSpec("t", vocab, dim, optimizer)],
                                    [FeatureSpec("p", 0, [2]), FeatureSpec("f", 1, [vocab])],
                                    sharding=sharding)
    desc = config.table_descriptor[1]
    rng = np.random.default_rng(_seed(optimizer, int(sharding)))
    full = eu.random_state(rng, desc)
    mod = sharding == eu.MOD
    with eu.engine(config):
        # load shard by shard (alternating name / id), retrieve whole
        for s in range(n):
            rows = eu.shard_rows(vocab, n, s, mod)
            eu.load_table(desc, [x[rows] for x in full], table_id=1 if s % 2 else None,
                          num_shards=n, shard_id=s)
        whole = eu.retrieve_table(desc, num_shards=1, shard_id=0)
        for got, want in zip(whole, full):
            np.testing.assert_array_equal(got, want)
        # retrieve per shard: numpy slicing of the full table
        sizes = []
        for s in range(n):
            rows = eu.shard_rows(vocab, n, s, mod)
            sizes.append(len(rows))
            shard = eu.retrieve_table(desc, table_id=1, num_shards=n, shard_id=s)
            assert len(shard) == len(full)
            for got, want in zip(shard, full):
                np.testing.assert_array_equal(got, want[rows])
        assert sizes == [4, 3, 3]
        # the lookup sees the loaded parameters at the right global rows
        ids = np.arange(vocab, dtype=np.int32)
        eu.enqueue_arbitrary([(eu.empty(tf.int32), np.array([0, 1], np.int32),
                               eu.empty(tf.float32)),
                              (eu.empty(tf.int32), ids, eu.empty(tf.float32))])
        _, out = eu.recv(config)
        np.testing.assert_array_equal(out, full[0])
        # the other table was not touched
        pad = eu.retrieve_table(config.table_descriptor[0])
        np.testing.assert_array_equal(pad[0], np.zeros((4, 2), np.float32))


def test_shard_rows_helper_matches_spec_example():
    div = [list(eu.shard_rows(13, 5, s, False)) for s in range(5)]
    mod = [list(eu.shard_rows(13, 5, s, True)) for s in range(5)]
    assert div == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]
    assert mod == [[0, 5, 10], [1, 6, 11], [2, 7, 12], [3, 8], [4, 9]]


@pytest.mark.parametrize("optimizer,slots", [
    ("stochastic_gradient_descent", []),
    ("adagrad", [0.1]),
    ("adam", [0.0, 0.0]),
    ("ftrl", [0.1, 0.0]),
    ("rms_prop", [1.0, 0.0]),
    ("proximal_yogi", [0.1, 0.0]),
    ("momentum", [0.0]),
])
def test_initial_state(optimizer, slots):
    """Tables start at 0 and slots at TF's padding initial values."""
    config = eu.feature_mode_config([TableSpec("t", 5, 2, optimizer)], [FeatureSpec("f", 0, [2])])
    with eu.engine(config):
        state = eu.retrieve_table(config.table_descriptor[0])
    assert len(state) == 1 + len(slots)
    np.testing.assert_array_equal(state[0], np.zeros((5, 2), np.float32))
    for got, v in zip(state[1:], slots):
        np.testing.assert_array_equal(got, np.full((5, 2), v, np.float32))


def _all_tables_config():
    return eu.feature_mode_config(
        [TableSpec("sgd", 7, 2, "stochastic_gradient_descent"), TableSpec("ada", 7, 3, "adagrad"),
         TableSpec("adam", 8, 2, "adam"), TableSpec("crms", 9, 2, "centered_rms_prop")],
        [FeatureSpec("a", 0, [2]), FeatureSpec("b", 1, [2]), FeatureSpec("c", 2, [2]),
         FeatureSpec("d", 3, [2])], sharding=eu.MOD)


def _groups(config, rng, num_shards, shard_id):
    """LoadAll groups for one shard: per table [parameters, slots...,
    gradient_accumulators] then empty tensors up to 8; plus the shard's state."""
    groups = [[] for _ in range(8)]
    state = []
    for desc in config.table_descriptor:
        info = BY_PROTO_FIELD[eu.optimizer_of(desc)]
        rows = len(eu.shard_rows(desc.vocabulary_size, num_shards, shard_id, True))
        vals = [rng.standard_normal((rows, desc.dimension)).astype(np.float32)
                for _ in range(1 + len(info.slots))]
        state.append(vals)
        accum = np.zeros((rows, desc.dimension), np.float32)
        full = vals + [accum]
        for i in range(8):
            groups[i].append(full[i] if i < len(full) else np.zeros((0, 0), np.float32))
    return groups, state


@pytest.mark.parametrize("via", ["prefixed_wrapper", "core_op_in_graph"])
def test_load_all_retrieve_all_roundtrip(via):
    config = _all_tables_config()
    cfg = config.SerializeToString()
    rng = np.random.default_rng(91)
    n = 2
    num_tables = len(config.table_descriptor)
    names = ["parameters"] + ["auxiliary%d" % i for i in range(1, 8)]

    def load_all(groups, shard):
        if via == "prefixed_wrapper":
            tte_ops.load_all_tpu_embedding_parameters(*groups, config=cfg, num_shards=n,
                                                      shard_id=shard)
            return

        @tf.function
        def fn():
            op_def_library._apply_op_helper(
                "LoadAllTPUEmbeddingParameters", config=cfg, num_shards=n, shard_id=shard,
                **{k: [tf.constant(x) for x in g] for k, g in zip(names, groups)})
        fn()

    def retrieve_all(shard):
        if via == "prefixed_wrapper":
            out = tte_ops.retrieve_all_tpu_embedding_parameters(
                NumTables=num_tables, config=cfg, num_shards=n, shard_id=shard)
            return [[np.asarray(t) for t in g] for g in out]

        @tf.function
        def fn():
            _, _, op, _ = op_def_library._apply_op_helper(
                "RetrieveAllTPUEmbeddingParameters", NumTables=num_tables, config=cfg,
                num_shards=n, shard_id=shard)
            return [list(op.outputs[i * num_tables:(i + 1) * num_tables]) for i in range(8)]
        return [[t.numpy() for t in g] for g in fn()]

    with eu.engine(config):
        loaded = {}
        for s in range(n):
            groups, state = _groups(config, rng, n, s)
            load_all(groups, s)
            loaded[s] = state
        for s in range(n):
            got = retrieve_all(s)
            for t, desc in enumerate(config.table_descriptor):
                nvars = len(loaded[s][t])
                for i in range(nvars):
                    np.testing.assert_array_equal(got[i][t], loaded[s][t][i])
                # trailing gradient_accumulators: shard-shaped, TPU fill value
                acc = got[nvars][t]
                assert acc.shape == loaded[s][t][0].shape
                assert (acc.view(np.uint32) == 1).all()  # spec §5.0: denormal 0x00000001
                for i in range(nvars + 1, 8):
                    assert got[i][t].shape == (0, 0)
        # per-table retrieve sees the same data, unsharded via MOD interleave
        for t, desc in enumerate(config.table_descriptor):
            whole = eu.retrieve_table(desc)
            for i, w in enumerate(whole):
                for s in range(n):
                    rows = eu.shard_rows(desc.vocabulary_size, n, s, True)
                    np.testing.assert_array_equal(w[rows], loaded[s][t][i])


def test_load_all_with_gradient_accumulation_disabled():
    """A table with gradient accumulation DISABLED has no trailing
    gradient_accumulators group (spec §2.7)."""
    config = eu.feature_mode_config([TableSpec("ada", 6, 2, "adagrad"),
                                     TableSpec("sgd", 5, 3, "stochastic_gradient_descent")],
                                    [FeatureSpec("a", 0, [2]), FeatureSpec("b", 1, [2])])
    for desc in config.table_descriptor:
        desc.optimization_parameters.gradient_accumulation_status = 2  # DISABLED
    cfg = config.SerializeToString()
    rng = np.random.default_rng(92)
    p0, a0 = [rng.standard_normal((6, 2)).astype(np.float32) for _ in range(2)]
    p1 = rng.standard_normal((5, 3)).astype(np.float32)
    empty = np.zeros((0, 0), np.float32)
    groups = [[p0, p1], [a0, empty]] + [[empty, empty] for _ in range(6)]
    with eu.engine(config):
        tte_ops.load_all_tpu_embedding_parameters(*groups, config=cfg, num_shards=1,
                                                  shard_id=0)
        got = tte_ops.retrieve_all_tpu_embedding_parameters(NumTables=2, config=cfg,
                                                            num_shards=1, shard_id=0)
    np.testing.assert_array_equal(got[0][0], p0)
    np.testing.assert_array_equal(got[0][1], p1)
    np.testing.assert_array_equal(got[1][0], a0)
    assert got[1][1].shape == (0, 0)
    for i in range(2, 8):
        assert got[i][0].shape == (0, 0) and got[i][1].shape == (0, 0)


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


def test_shutdown_drops_queued_batches():
    config = _feature_config()
    ids = [(eu.empty(tf.int32), np.array([1, 2, 3, 4], np.int32), eu.empty(tf.float32))] * 3
    with eu.engine(config):
        eu.enqueue_arbitrary(ids)
    with eu.engine(config):
        eu.assert_nothing_enqueued(config)


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


def test_quantization_disabled_is_plain_lookup():
    config = eu.feature_mode_config([TableSpec("q", 10, 4, quantization=(-0.1, 0.1, 3))],
                                    [FeatureSpec("a", 0, [B])])
    config.table_descriptor[0].optimization_parameters.simulated_quantization.enabled = False
    ids = np.array([0, 3, 5, 9], np.int32)
    with eu.engine(config):
        e = eu.load_random_tables(config, 96)["q"][0]
        eu.enqueue_arbitrary([(eu.empty(tf.int32), ids, eu.empty(tf.float32))])
        (got,) = eu.recv(config)
    np.testing.assert_array_equal(got, e[ids])


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
