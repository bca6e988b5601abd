"""Stress of engine lifecycles, as users' threads, notebooks and services
drive them (issue 24 "Why"; `slow`: a few minutes on 2 cores).

* threads each with its own TPUEmbedding train bit-exactly as alone;
* shutdown and garbage collection while another thread is mid-step: only the
  documented errors, no hang, no engine left behind;
* create/build/destroy churn beside a trainer, which trains bit-exactly as alone;
* 65,536 Recvs racing their enqueues (in rounds): each gets exactly one batch;
* bfloat16 special values (NaN, +-Inf, -0, the largest finite, subnormals)
  survive Load, lookups and updates as the format says;

The resident-set soak of build/destroy churn is test_churn_soak.py.
"""
import gc
import random
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
import tf_tpu_emb
from engine_util import FeatureSpec, TableSpec
from tf_tpu_emb import engine_registry

pytestmark = pytest.mark.slow

E = tf.tpu.experimental.embedding
B = 8


@pytest.fixture(autouse=True)
def nothing_left(lib):
    del lib
    gc.collect()
    before = engine_registry.live_state_bytes()
    yield
    gc.collect()
    assert engine_registry.engines() == []
    assert engine_registry.live_state_bytes() == before


def make(seed, vocab=50, dim=4):
    def initial(shape, dtype=tf.float32):
        return tf.constant(np.random.default_rng(seed).standard_normal(shape) * 0.1, dtype)

    table = E.TableConfig(vocab, dim, name="t%d" % seed, combiner="sum", initializer=initial)
    return tf_tpu_emb.TPUEmbedding({"f": E.FeatureConfig(table)}, E.Adagrad(0.2))


def step(emb, seed, n, vocab=50):
    ids = np.random.default_rng(1000 * seed + n).integers(0, vocab, B)
    emb.enqueue({"f": tf.constant(ids, tf.int64)})
    emb.apply_gradients({"f": emb.dequeue()["f"] * 0.5 + 0.01})


def trained_alone(seed, steps):
    emb = make(seed)
    emb.build(B)
    for n in range(steps):
        step(emb, seed, n)
    out = emb.retrieve_table(emb.tables[0])[0].numpy()
    emb.shutdown()
    return out


def run_threads(targets):
    errors = []

    def guarded(fn):
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
        assert not t.is_alive(), "a thread hung"
    assert errors == [], errors


# ===================================================== objects per thread

def test_threads_each_with_an_object_train_as_alone():
    seeds, steps = range(4), 200
    got = {}

    def train(seed):
        emb = make(seed)
        emb.build(B)
        for n in range(steps):
            step(emb, seed, n)
        got[seed] = emb.retrieve_table(emb.tables[0])[0].numpy()
        emb.shutdown()

    run_threads([lambda s=s: train(s) for s in seeds])
    for seed in seeds:
        np.testing.assert_array_equal(got[seed], trained_alone(seed, steps))


# ============================================= shutdown / gc mid-step

def test_shutdown_or_collection_mid_step_gives_documented_errors_only():
    allowed = (RuntimeError, tf.errors.FailedPreconditionError, tf.errors.CancelledError)
    rng = random.Random(3)
    for round_ in range(40):
        holder = {"emb": make(round_)}
        holder["emb"].build(B)
        started = threading.Event()
        seen = []

        def trainer(ref=weakref.ref(holder["emb"]), started=started, seen=seen,
                    round_=round_):
            for n in range(200):
                started.set()
                emb = ref()  # the step holds the object; between steps only the killer
                if emb is None:
                    return
                try:
                    step(emb, round_, n)
                except allowed as e:  # noqa: PERF203
                    seen.append(e)
                    return
                finally:
                    del emb

        def killer(holder=holder, started=started, round_=round_):
            started.wait()
            threading.Event().wait(rng.uniform(0, 0.05))
            if round_ % 2:
                holder["emb"].shutdown()
            else:
                emb = holder.pop("emb")
                emb.self_reference = emb  # only the collector frees it
                del emb
                gc.collect()

        run_threads([trainer, killer])
        holder.clear()
        gc.collect()
        assert engine_registry.engines() == []
        for e in seen:
            if isinstance(e, RuntimeError):
                assert "shut down" in str(e), e


# ================================================= churn beside a trainer

def test_create_destroy_churn_beside_a_trainer():
    steps = 300
    got = {}
    done = threading.Event()

    def trainer():
        emb = make(7)
        emb.build(B)
        for n in range(steps):
            step(emb, 7, n)
        got["t"] = emb.retrieve_table(emb.tables[0])[0].numpy()
        emb.shutdown()
        done.set()

    def churn():
        i = 0
        while not done.is_set() or i < 200:
            emb = make(100 + i % 5, vocab=30)
            emb.build(B)
            step(emb, 100 + i % 5, 0, vocab=30)
            if i % 3:
                emb.shutdown()
            del emb
            i += 1

    run_threads([trainer, churn])
    np.testing.assert_array_equal(got["t"], trained_alone(7, steps))


# ===================================================== racing Recvs

def test_65536_recvs_racing_their_enqueues():
    """Rounds of 4,096 Recvs and 4,096 enqueues in one graph, no ordering
    between them (a TF1 graph: no automatic control dependencies), run with
    several inter-op threads: every Recv gets exactly one batch (batch k
    looks up row k)."""
    per_round, rounds, vocab = 4096, 16, 4096
    config = eu.feature_mode_config(
        [TableSpec("t", vocab, 1, optimizer="stochastic_gradient_descent")],
        [FeatureSpec("f", 0, [1])])
    raw = eu.serialize(config)
    table = np.arange(vocab, dtype=np.float32).reshape(vocab, 1)
    with eu.engine(config):
        tf.raw_ops.LoadTPUEmbeddingStochasticGradientDescentParameters(
            parameters=table, table_name="t", num_shards=1, shard_id=0)
        graph = tf.Graph()
        with graph.as_default():
            ops = []
            for k in range(per_round):
                ops.append(("enqueue", tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
                    sample_indices_or_row_splits=[tf.zeros([0], tf.int32)],
                    embedding_indices=[tf.constant([k], tf.int64)],
                    aggregation_weights=[tf.zeros([0], tf.float32)],
                    mode_override="inference", device_ordinal=0)))
                ops.append(("recv", tf.raw_ops.RecvTPUEmbeddingActivations(
                    num_outputs=1, config=raw)[0]))
            random.Random(5).shuffle(ops)
            fetch = [op for kind, op in ops if kind == "recv"]
            run = [op for kind, op in ops if kind == "enqueue"]
        session_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=8)
        with tf.compat.v1.Session(graph=graph, config=session_config) as session:
            for _ in range(rounds):
                got = session.run([fetch, run])[0]
                values = sorted(int(v[0, 0]) for v in got)
                assert values == list(range(per_round))


# ============================================= bfloat16 special values

def _bf16(x):
    """float32 -> bfloat16 (nearest even) -> float32; NaN stays NaN, Inf stays."""
    x = np.asarray(x, np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x) | np.isinf(x), x, r)


def test_bf16_special_values(monkeypatch):
    monkeypatch.setenv("TF_TPU_EMB_STORAGE", "bf16")
    big = np.finfo(np.float32).max
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, big, -big, 1e-40, 3.0e38,
                         1.0, -2.5, 1e-38], np.float32)
    dim = len(specials)
    config = eu.feature_mode_config(
        [TableSpec("t", 4, dim, optimizer="stochastic_gradient_descent")],
        [FeatureSpec("f", 0, [1])])
    table = np.stack([specials, specials[::-1], np.roll(specials, 3), np.ones(dim)])
    table = table.astype(np.float32)
    with eu.engine(config):
        tf.raw_ops.LoadTPUEmbeddingStochasticGradientDescentParameters(
            parameters=table, table_name="t", num_shards=1, shard_id=0)
        stored = tf.raw_ops.RetrieveTPUEmbeddingStochasticGradientDescentParameters(
            table_name="t", num_shards=1, shard_id=0).numpy()
        want = _bf16(table)
        np.testing.assert_array_equal(np.isnan(stored), np.isnan(want))
        finite = ~np.isnan(want)
        np.testing.assert_array_equal(stored[finite].view(np.uint32),
                                      want[finite].view(np.uint32))
        for row in range(4):
            eu.enqueue_arbitrary([(eu.empty(tf.int32), np.array([row], np.int64),
                                   eu.empty(tf.float32))])
            act = tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=1,
                                                         config=eu.serialize(config))[0]
            act = act.numpy()[0]
            # Lookups widen exactly (subnormals flush, semantics §4.2).
            expect = np.where(np.abs(stored[row]) < np.finfo(np.float32).tiny, 0, stored[row])
            np.testing.assert_array_equal(np.isnan(act), np.isnan(expect))
            np.testing.assert_array_equal(act[~np.isnan(act)], expect[~np.isnan(expect)])
            # An update that overflows: big - lr * (-huge) -> +Inf, never NaN
            # from rounding; NaN and Inf stay.
            grad = np.full([1, dim], -big, np.float32)
            tf.raw_ops.SendTPUEmbeddingGradients(inputs=[grad], learning_rates=[],
                                                 config=eu.serialize(config))
        after = tf.raw_ops.RetrieveTPUEmbeddingStochasticGradientDescentParameters(
            table_name="t", num_shards=1, shard_id=0).numpy()
        assert np.array_equal(np.isnan(after), np.isnan(stored)), (stored, after)
        with np.errstate(over="ignore", invalid="ignore"):
            ref = stored.astype(np.float64) + 0.1 * np.float64(big)
        overflow = ~np.isnan(stored) & (ref > big)
        assert np.all(after[overflow] == np.inf), after
        assert np.all(after[np.isposinf(stored)] == np.inf)
        assert np.all(after[np.isneginf(stored)] == -np.inf)
