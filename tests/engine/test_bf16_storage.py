"""Opt-in bfloat16 storage of tables and slots (TF_TPU_EMB_STORAGE, README
"Reduced-precision storage").

References are numpy, written from the format: bfloat16 is the upper half of
a float32; Load rounds to nearest even; a row update computes in float32 on
the widened row and rounds stochastically.  fp32 stays the default and
bit-exact.
"""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec

pytestmark = pytest.mark.usefixtures("engine_released")

ENV = "TF_TPU_EMB_STORAGE"
ULP_EXP = 7  # bfloat16 keeps 7 explicit mantissa bits


def bf16_nearest_even(x):
    """float32 -> bfloat16 (round to nearest, ties to even) -> float32."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def is_bf16(x):
    return np.all((np.asarray(x, np.float32).view(np.uint32) & 0xFFFF) == 0)


def bf16_ulp(x):
    """The gap between bfloat16 neighbours around |x| (x normal)."""
    return np.ldexp(np.float32(1), np.frexp(np.abs(x))[1] - 1 - ULP_EXP).astype(np.float32)


def config(tables, batch, optimizer="adagrad"):
    specs = [TableSpec(name, vocab, dim, optimizer) for name, vocab, dim in tables]
    feats = [FeatureSpec("f_" + name, t, [batch]) for t, (name, _, _) in enumerate(tables)]
    return eu.feature_mode_config(specs, feats)


def one_id_per_bag(ids_per_table, mode="train"):
    args = []
    for ids in ids_per_table:
        bags = [[(int(i), 1.0)] for i in ids]
        args.append(eu.sparse_to_enqueue(eu.bags_to_sparse(bags)[0]))
    eu.enqueue_arbitrary(args, combiners=["sum"] * len(args), mode=mode)


def send(cfg, grads):
    tf.raw_ops.SendTPUEmbeddingGradients(
        inputs=[tf.constant(g, tf.float32) for g in grads], learning_rates=[],
        config=eu.serialize(cfg))


def with_ties(rng, shape):
    """Normal values, a quarter of them exactly half-way between two bfloat16
    neighbours (low half 0x8000: the tie cases of round-to-nearest-even)."""
    x = rng.standard_normal(shape).astype(np.float32)
    u = x.view(np.uint32)
    tie = rng.random(shape) < 0.25
    u[tie] = (u[tie] & 0xFFFF0000) | 0x8000
    return u.view(np.float32)


def test_load_rounds_to_nearest_even_and_retrieve_gives_fp32(monkeypatch):
    monkeypatch.setenv(ENV, "bf16")
    cfg = config([("t", 64, 8)], 4)
    rng = np.random.default_rng(0)
    params = with_ties(rng, (64, 8))
    acc = rng.uniform(0.1, 3.0, (64, 8)).astype(np.float32)
    with eu.engine(cfg):
        eu.load_table(cfg.table_descriptor[0], [params, acc])
        got_p, got_a = eu.retrieve_table(cfg.table_descriptor[0])
        assert got_p.dtype == np.float32 and got_p.shape == (64, 8)  # TF's layout
        np.testing.assert_array_equal(got_p, bf16_nearest_even(params))
        np.testing.assert_array_equal(got_a, bf16_nearest_even(acc))
        # A checkpoint of bfloat16 values loads back unchanged.
        eu.load_table(cfg.table_descriptor[0], [got_p, got_a])
        again = eu.retrieve_table(cfg.table_descriptor[0])
        np.testing.assert_array_equal(again[0], got_p)
        np.testing.assert_array_equal(again[1], got_a)


def test_sharded_load_and_retrieve_round(monkeypatch):
    monkeypatch.setenv(ENV, "bf16")
    cfg = config([("t", 10, 4)], 2)
    cfg.sharding_strategy = eu.MOD
    rng = np.random.default_rng(1)
    full = with_ties(rng, (10, 4))
    with eu.engine(cfg):
        for shard in range(2):
            rows = eu.shard_rows(10, 2, shard, True)
            eu.load_table(cfg.table_descriptor[0], [full[rows], np.ones((len(rows), 4))],
                          num_shards=2, shard_id=shard)
        for shard in range(2):
            rows = eu.shard_rows(10, 2, shard, True)
            got = eu.retrieve_table(cfg.table_descriptor[0], num_shards=2, shard_id=shard)[0]
            np.testing.assert_array_equal(got, bf16_nearest_even(full[rows]))


def bf16_lookup(monkeypatch, seed, vocab, dim, bags, combiner):
    """(the float32 table loaded, the activations of `bags`) in bf16 storage."""
    monkeypatch.setenv(ENV, "bf16")
    cfg = config([("t", vocab, dim)], len(bags))
    params = np.random.default_rng(seed).standard_normal((vocab, dim)).astype(np.float32)
    with eu.engine(cfg):
        eu.load_table(cfg.table_descriptor[0], [params, np.ones_like(params)])
        eu.enqueue_arbitrary([eu.sparse_to_enqueue(*eu.bags_to_sparse(bags))],
                             combiners=[combiner], mode="inference")
        (act,) = eu.recv(cfg)
    return params, act


def test_lookup_equals_the_rounded_rows(monkeypatch):
    ids = np.random.default_rng(2).integers(0, 100, 32)
    params, act = bf16_lookup(monkeypatch, 2, 100, 16, [[(int(i), 1.0)] for i in ids], "sum")
    np.testing.assert_array_equal(act, bf16_nearest_even(params)[ids])


def test_multi_id_bags_sum_the_rounded_rows(monkeypatch):
    bags = eu.random_bags(np.random.default_rng(3), 16, 50, max_len=4, weighted=True)
    params, act = bf16_lookup(monkeypatch, 3, 50, 8, bags, "mean")
    want = eu.reference_lookup(bf16_nearest_even(params), bags, "mean")
    eu.assert_close(act, want, rtol=1e-6, atol=1e-6)


def test_fp32_stays_the_default_and_per_table_selection(monkeypatch):
    monkeypatch.setenv(ENV, "small=bf16")
    cfg = config([("big", 20, 4), ("small", 20, 4)], 2)
    rng = np.random.default_rng(4)
    a, b = (with_ties(rng, (20, 4)) for _ in range(2))
    with eu.engine(cfg):
        eu.load_table(cfg.table_descriptor[0], [a, np.ones_like(a)])
        eu.load_table(cfg.table_descriptor[1], [b, np.ones_like(b)])
        np.testing.assert_array_equal(eu.retrieve_table(cfg.table_descriptor[0])[0], a)
        np.testing.assert_array_equal(eu.retrieve_table(cfg.table_descriptor[1])[0],
                                      bf16_nearest_even(b))
    monkeypatch.delenv(ENV)
    with eu.engine(cfg):
        eu.load_table(cfg.table_descriptor[1], [b, np.ones_like(b)])
        np.testing.assert_array_equal(eu.retrieve_table(cfg.table_descriptor[1])[0], b)


@pytest.mark.parametrize("value,needle", [
    ("fp16", "'fp16'"), ("bf16,", "empty"), ("nosuch=bf16", "'nosuch'"),
    ("t=bf16,t=fp32", "'t' twice"), ("t=", "''")])
def test_bad_storage_setting_is_refused(monkeypatch, value, needle):
    monkeypatch.setenv(ENV, value)
    cfg = config([("t", 10, 4)], 2)
    eu.shutdown()
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        tf.raw_ops.ConfigureTPUEmbedding(config=eu.serialize(cfg))
    assert ENV in str(e.value) and needle in str(e.value), str(e.value)
    assert not eu.is_initialized()


@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("frac", [0.1, 0.3, 0.75])
def test_stochastic_rounding_is_unbiased(monkeypatch, sign, frac):
    """SGD moves every element of N rows from +-1 (exact in bfloat16) to a
    float32 value x a fraction p of the way to the next bfloat16 value:
    each element must land on one of the two neighbours, and the share that
    rounds away from 1 must be p within 6 standard deviations of a binomial
    (the generator is counter-based, so the outcome is also fixed)."""
    monkeypatch.setenv(ENV, "bf16")
    N, D = 4000, 16
    cfg = config([("t", N, D)], N, optimizer="stochastic_gradient_descent")
    ulp = np.float32(2.0 ** -ULP_EXP)
    g = np.full((N, D), -sign * frac * ulp / np.float32(0.1), np.float32)
    x = (np.float32(sign) - np.float32(0.1) * g)[0, 0]  # the float32 update, as the engine does it
    p = float((abs(x) - 1) / ulp)
    assert 0.05 < p < 0.95
    with eu.engine(cfg):
        eu.load_table(cfg.table_descriptor[0], [np.full((N, D), sign, np.float32)])
        one_id_per_bag([np.arange(N)])
        eu.recv(cfg)
        send(cfg, [g])
        (w,) = eu.retrieve_table(cfg.table_descriptor[0])
    up = np.abs(w) == np.float32(1) + ulp
    assert np.all(up | (w == np.float32(sign))), np.unique(w)
    n = N * D
    share = up.mean()
    assert abs(share - p) <= 6 * np.sqrt(p * (1 - p) / n), (share, p)
    assert abs(np.abs(w).astype(np.float64).mean() - abs(x)) <= 6 * ulp * np.sqrt(p * (1 - p) / n)


def test_adagrad_update_within_one_ulp_of_fp32(monkeypatch):
    monkeypatch.setenv(ENV, "bf16")
    V, D, B = 300, 8, 64
    cfg = config([("t", V, D)], B)
    rng = np.random.default_rng(5)
    params = bf16_nearest_even(rng.standard_normal((V, D)))
    acc = bf16_nearest_even(rng.uniform(0.1, 2.0, (V, D)))
    ids = rng.choice(V, B, replace=False)
    g = rng.standard_normal((B, D)).astype(np.float32)
    with eu.engine(cfg):
        eu.load_table(cfg.table_descriptor[0], [params, acc])
        one_id_per_bag([ids])
        eu.recv(cfg)
        send(cfg, [g])
        got_p, got_a = eu.retrieve_table(cfg.table_descriptor[0])
    # float32 Adagrad on the stored (bfloat16) values, semantics §5.
    want_a = acc.copy()
    want_p = params.copy()
    want_a[ids] = acc[ids] + g * g
    want_p[ids] = params[ids] - np.float32(0.1) * g / np.sqrt(want_a[ids])
    assert is_bf16(got_p) and is_bf16(got_a)
    untouched = np.setdiff1d(np.arange(V), ids)
    np.testing.assert_array_equal(got_p[untouched], params[untouched])
    np.testing.assert_array_equal(got_a[untouched], acc[untouched])
    for got, want in ((got_p[ids], want_p[ids]), (got_a[ids], want_a[ids])):
        assert np.all(np.abs(got - want) <= bf16_ulp(want)), np.abs(got - want).max()
