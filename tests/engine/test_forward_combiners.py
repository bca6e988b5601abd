"""Forward path of the engine (enqueue -> RecvTPUEmbeddingActivations): the
combiners.

Every result is checked against a numpy reference written from the spec
formulas (spec §4.2) and, where TF has one, against TF's own CPU oracle
TPUEmbeddingForServing (spec §4.7), so a wrong combiner, a wrong row layout
or a wrong bag assignment cannot agree with both: every combiner with dense,
sparse and ragged input, weighted or not, in both config modes; per-input and
per-table combiner lists; the defaults; the spec §4.2 worked numbers.
"""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from forward_common import B, FEATURES, _feature_config, _seed, _table_config

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]

COMBINERS = ["sum", "mean", "sqrtn"]


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
