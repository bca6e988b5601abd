"""The training pipeline around the optimizer formulas (spec §5.0): gradient
clipping, weight clipping, decoupled weight decay, gradient accumulation on
and off, dynamic learning rates, table mode, a large batch (the partitioned
update), and 1 vs 4 replicas (subprocess:
tests/engine/optimizer_multi_replica_script.py); compared with the numpy
reference (optimizer_training.py), and each feature shown to change the
result.

Run with -s to see the maximum observed errors per case (ERRORS lines).
"""
import numpy as np
import pytest

import engine_util as eu
import harness  # tests/common: the one way to start a child process
import optimizer_reference as ref
from optimizer_reference import TableParams
from optimizer_training import (B, ERRORS, LAST_RUN, STEPS, _w, compare_tables, fill_params,
                                initial_state, max_diff, replay, retrieve_all, run_training,
                                send, zlib_seed)
from optimizer_training import _print_errors  # noqa: F401 (an autouse fixture)

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


# ===================================================== 3: pipeline features

PIPELINE_CASES = {
    "grad_clip-both": TableParams("adagrad", grad_clip=(-0.2, 0.3)),
    "grad_clip-lower": TableParams("adagrad", grad_clip=(-0.2, None)),
    "grad_clip-upper": TableParams("momentum", {"momentum": 0.5}, grad_clip=(None, 0.3)),
    "weight_clip-both": TableParams("stochastic_gradient_descent", weight_clip=(-0.5, 0.6)),
    "weight_clip-lower": TableParams("adagrad", weight_clip=(-0.5, None)),
    "weight_clip-upper": TableParams("adagrad", weight_clip=(None, 0.4)),
    # decay from the pre-update weight: with SGD the post-update reading would
    # differ by decay * lr * g (~5e-3 here), far above the tolerance
    "decay-sgd": TableParams("stochastic_gradient_descent", weight_decay=0.05),
    "decay-by_lr-adagrad": TableParams("adagrad", weight_decay=0.5, decay_by_lr=True),
    "decay-adam": TableParams("adam", dict(beta1=0.9, beta2=0.99, epsilon=1e-3),
                              weight_decay=0.05),
    # non-lazy: untouched rows are decayed and clipped too (g = 0 is clipped)
    "all-adam-nonlazy": TableParams("adam", dict(beta1=0.9, beta2=0.99, epsilon=1e-3,
                                                 use_non_lazy_adam=True),
                                    grad_clip=(-0.5, 0.4), weight_clip=(-1.0, 0.9),
                                    weight_decay=0.3, decay_by_lr=True),
    "all-ftrl": TableParams("ftrl", dict(l1=0.3, l2=0.2, lr_power=-0.5), grad_clip=(-0.5, 0.5),
                            weight_clip=(-0.3, 0.2), weight_decay=0.02),
}


def _without_pipeline(p: TableParams):
    return TableParams(p.optimizer, p.hp, p.lr)


@pytest.mark.parametrize("case", list(PIPELINE_CASES))
def test_pipeline_feature(case):
    p = PIPELINE_CASES[case]
    got, want, _ = run_training([p, p], seed=zlib_seed(case), label=case)
    compare_tables(got, want, case + " vs numpy")
    # the feature changed the result (the test is sensitive to it)
    plain = replay([_without_pipeline(p)] * 2, LAST_RUN["init"], LAST_RUN["history"])
    assert max_diff(got, plain) > 1e-3, case


def test_gradient_accumulation_disabled_applies_per_contribution():
    """DISABLED: the pipeline runs per contribution, in the order outputs,
    (replicas,) bags, ids in bag order; ENABLED (explicit) and UNSPECIFIED:
    once per row on the summed gradient.  For Adagrad the two differ."""
    disabled = TableParams("adagrad", accumulate=False, grad_clip=(-0.6, 0.6))
    enabled = TableParams("adagrad", grad_clip=(-0.6, 0.6))
    seed = zlib_seed("accumulation")
    got_d, want_d, _ = run_training([disabled] * 2, seed=seed, label="adagrad accumulation off")
    compare_tables(got_d, want_d, "adagrad accumulation off vs numpy")
    # reversing each step's contribution order changes the reference by far
    # more than the tolerance: the test checks the order
    reversed_ref = replay([disabled] * 2, LAST_RUN["init"], LAST_RUN["history"],
                          order=lambda c: c[::-1])
    assert max_diff(got_d, reversed_ref) > 1e-3
    got_e, want_e, _ = run_training([enabled] * 2, seed=seed, explicit_enabled=True,
                                    label="adagrad accumulation on")
    compare_tables(got_e, want_e, "adagrad accumulation on vs numpy")
    got_u, _, _ = run_training([enabled] * 2, seed=seed, label="adagrad accumulation default")
    compare_tables(got_u, got_e, "adagrad accumulation default vs on", rtol=0, atol=0)
    assert max_diff(got_d, want_e) > 1e-2


def test_gradient_accumulation_irrelevant_for_sgd():
    seed = zlib_seed("sgd accumulation")
    got_d, want_d, _ = run_training([TableParams("stochastic_gradient_descent",
                                                 accumulate=False)] * 2, seed=seed)
    compare_tables(got_d, want_d, "sgd accumulation off vs numpy")
    got_e, _, _ = run_training([TableParams("stochastic_gradient_descent")] * 2, seed=seed)
    compare_tables(got_d, got_e, "sgd accumulation off vs on")


def test_dynamic_learning_rates_two_tags_two_tables():
    params = [TableParams("adagrad", lr_tag=0),
              TableParams("momentum", {"momentum": 0.5}, lr_tag=1)]
    lrs = [[0.1, 0.5], [0.3, 0.05], [0.02, 0.2]]
    got, want, _ = run_training(params, dynamic=lambda s: lrs[s], seed=zlib_seed("dyn"),
                                label="dynamic lr")
    compare_tables(got, want, "dynamic lr vs numpy")
    swapped = replay(params, LAST_RUN["init"],
                     [(b, g, d[::-1]) for b, g, d in LAST_RUN["history"]])
    assert max_diff(got, swapped) > 1e-3  # tag -> table mapping matters


def test_table_mode_training():
    """Table-mode config (no feature descriptors): table video has 2 features
    (rows b*2+f, input order), user 1; SparseTensorBatch with one combiner per
    input."""
    config = eu.table_mode_config([eu.TableSpec("video", 16, 3, "adagrad", num_features=2),
                                   eu.TableSpec("user", 10, 2, "adagrad", num_features=1)], B)
    rng = np.random.default_rng(zlib_seed("table mode"))
    p = TableParams("adagrad", lr=0.1)
    with eu.engine(config):
        init = [initial_state(rng, "adagrad", 16, 3), initial_state(rng, "adagrad", 10, 2)]
        for t, st in enumerate(init):
            eu.load_table(config.table_descriptor[t], st)
        want = [ref.copy_state(st) for st in init]
        for s in range(STEPS):
            b0, b2 = (eu.random_bags(rng, B, 12, max_len=4, weighted=True) for _ in range(2))
            b1 = eu.random_bags(rng, B, 8, max_len=4, weighted=True)
            b0[0] = [(4, 1.5), (4, 0.5), (9, 1.0)]
            b2[1] = [(4, 0.75)]
            eu.enqueue_sparse_tensor([eu.sparse_to_enqueue(*eu.bags_to_sparse(b))
                                      for b in (b0, b1, b2)],
                                     table_ids=[0, 1, 0], combiners=["mean", "sum", "sqrtn"])
            video, user = eu.recv(config)
            np.testing.assert_allclose(video, eu.interleave_table_rows(
                [eu.reference_lookup(want[0][0], b0, "mean"),
                 eu.reference_lookup(want[0][0], b2, "sqrtn")]), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(user, eu.reference_lookup(want[1][0], b1, "sum"),
                                       rtol=1e-5, atol=1e-5)
            gv = rng.standard_normal((B * 2, 3)).astype(np.float32)
            gu = rng.standard_normal((B, 2)).astype(np.float32)
            send(config, [gv, gu])
            ref.step(p, want[0], ref.contributions(
                [(eu.interleave_bags([b0, b2]), ["mean", "sqrtn"] * B, gv)]))
            ref.step(p, want[1], ref.contributions([(b1, "sum", gu)]))
        got = retrieve_all(config)
    compare_tables(got, want, "table mode adagrad vs numpy")


@pytest.mark.parametrize("accumulate", [True, False], ids=["accumulated", "per_contribution"])
def test_large_batch_partitioned_update(accumulate):
    """~12k ids in one step: the engine splits the table's contributions into
    hash partitions updated in parallel; the result must not depend on it."""
    n, vocab, dim = 4096, 1500, 4
    p = TableParams("adagrad", accumulate=accumulate)
    c = eu.Config()
    c.mode = eu.TRAINING
    desc = c.table_descriptor.add(name="big", vocabulary_size=vocab, dimension=dim)
    fill_params(desc.optimization_parameters, p)
    c.feature_descriptor.add(name="f", table_id=0, input_shape=[n])
    rng = np.random.default_rng(zlib_seed("large", accumulate))
    with eu.engine(c):
        init = initial_state(rng, "adagrad", vocab, dim)
        eu.load_table(desc, init)
        want = ref.copy_state(init)
        for _ in range(2):
            bags = [[(int(i), _w(rng)) for i in rng.integers(0, vocab - 100, rng.integers(1, 6))]
                    for _ in range(n)]
            eu.enqueue_arbitrary([eu.sparse_to_enqueue(*eu.bags_to_sparse(bags))],
                                 combiners=["mean"])
            eu.recv(c)
            g = rng.standard_normal((n, dim)).astype(np.float32)
            send(c, [g])
            ref.step(p, want, ref.contributions([(bags, "mean", g)]))
        got = eu.retrieve_table(desc)
    compare_tables([got], [want], "large batch %s vs numpy" % ("on" if accumulate else "off"))


# ========================================================= 4: replicas

@pytest.mark.system
def test_one_vs_four_replicas():
    """Same global batch on 1 replica and on 4 (samples split contiguously;
    threads, one per replica): identical tables, both equal to the numpy
    reference.  Separate process: TF's logical CPUs must be configured
    before its runtime starts."""
    proc = harness.run_python([harness.script(__file__, "optimizer_multi_replica_script.py")],
                              timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
    for line in proc.stdout.splitlines():
        if line.startswith("ERRORS "):
            label, a, r = line[len("ERRORS "):].rsplit(None, 2)
            ERRORS["replicas " + label.strip()] = (float(a), float(r))
