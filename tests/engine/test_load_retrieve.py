"""The engine's Load/Retrieve ops: per-table round trips of every optimizer's
state, sharded (DIV and MOD) and whole, checked bit-exact against numpy
slicing of the tables (spec §2.7) and through a lookup; the initial state;
LoadAll/RetrieveAll with and without gradient accumulators.
"""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_library

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from forward_common import _seed
from tf_tpu_emb import ops as tte_ops
from tf_tpu_emb.optimizers import BY_PROTO_FIELD

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


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
