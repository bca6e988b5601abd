"""Several engines per process (README "Several engines per process").

Each TPUEmbedding configures an engine of its own (a name from
engine_registry); our prefixed ops address an engine by their `engine` attr
and TF's core-named ops keep addressing the process's default engine ("").
Two objects with different tables and optimizers train independently, each
bit-for-bit like the same object trained alone; shutting one down (or
collecting it) leaves the other working and releases its memory from the
budget TF_TPU_EMB_MEMORY_LIMIT_BYTES, which counts every live engine.
"""
import gc

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
import tf_tpu_emb
from engine_util import FeatureSpec, TableSpec
from tf_tpu_emb import engine_registry
from tf_tpu_emb import ops as tte_ops

E = tf.tpu.experimental.embedding
B = 4
STEPS = 4


@pytest.fixture(autouse=True)
def no_engines_left(lib):
    del lib
    yield
    gc.collect()
    assert engine_registry.owners() == []
    eu.shutdown()


def _ramp(rows, dim, scale):
    def init(shape, dtype=tf.float32):
        return tf.constant(np.arange(shape[0] * shape[1]).reshape(shape) * scale, dtype)
    return init


def _embedding(kind):
    """Object "a": one SGD table of dim 3; object "b": two Adagrad tables."""
    if kind == "a":
        t = E.TableConfig(12, 3, name="ta", combiner="sum", initializer=_ramp(12, 3, 0.01))
        return tf_tpu_emb.TPUEmbedding({"x": E.FeatureConfig(t)}, E.SGD(0.5))
    t1 = E.TableConfig(9, 2, name="tb1", combiner="mean", initializer=_ramp(9, 2, 0.02))
    t2 = E.TableConfig(5, 4, name="tb2", combiner="sum", initializer=_ramp(5, 4, -0.03))
    return tf_tpu_emb.TPUEmbedding({"y": E.FeatureConfig(t1), "z": E.FeatureConfig(t2)},
                                   E.Adagrad(0.2, initial_accumulator_value=0.1))


def _batch(kind, step):
    rng = np.random.default_rng(100 * step + (kind == "b"))
    if kind == "a":
        return {"x": tf.constant(rng.integers(0, 12, B), tf.int64)}
    return {"y": tf.constant(rng.integers(0, 9, B), tf.int64),
            "z": tf.constant(rng.integers(0, 5, B), tf.int64)}


def _step(emb, kind, step):
    """One training step; the gradient of sum(act^2)/2 is act itself."""
    emb.enqueue(_batch(kind, step))
    activations = emb.dequeue()
    emb.apply_gradients(activations)


def _tables(emb):
    return {t.name: v.numpy() for t, v in emb.embedding_tables.items()}


def _alone(kind, steps=STEPS):
    emb = _embedding(kind)
    try:
        for s in range(steps):
            _step(emb, kind, s)
        return _tables(emb)
    finally:
        emb.shutdown()


@pytest.fixture
def pair():
    """Object "a" and object "b", both shut down at the end."""
    a, b = _embedding("a"), _embedding("b")
    yield a, b
    a.shutdown()
    b.shutdown()


def _assert_same(got, want):
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_two_objects_train_independently_as_each_alone(pair):
    want_a, want_b = _alone("a"), _alone("b")
    a, b = pair
    for s in range(STEPS):  # interleaved, both built and live all along
        a.enqueue(_batch("a", s))
        b.enqueue(_batch("b", s))
        act_b = b.dequeue()
        act_a = a.dequeue()
        a.apply_gradients(act_a)
        b.apply_gradients(act_b)
    assert a.layout.engine != b.layout.engine
    assert "" not in (a.layout.engine, b.layout.engine)
    _assert_same(_tables(a), want_a)
    _assert_same(_tables(b), want_b)
    assert np.abs(want_a["ta"] - _ramp(12, 3, 0.01)([12, 3]).numpy()).max() > 1e-3


def test_training_inside_one_tf_function_routes_each_gradient_to_its_engine(pair):
    want_a, want_b = _alone("a"), _alone("b")
    a, b = pair
    a.build(B)
    b.build(B)

    @tf.function
    def step(xa, xb):
        a.enqueue(xa)
        b.enqueue(xb)
        act_a, act_b = a.dequeue(), b.dequeue()
        b.apply_gradients(act_b)
        a.apply_gradients(act_a)

    for s in range(STEPS):
        step(_batch("a", s), _batch("b", s))
    _assert_same(_tables(a), want_a)
    _assert_same(_tables(b), want_b)


def test_shutting_one_down_leaves_the_other_working(pair):
    want_b = _alone("b")
    a, b = pair
    _step(a, "a", 0)
    _step(b, "b", 0)
    engine_a = a.layout.engine
    a.shutdown()
    assert not tte_ops.is_tpu_embedding_initialized(engine=engine_a).numpy()
    assert tte_ops.is_tpu_embedding_initialized(engine=b.layout.engine).numpy()
    for s in range(1, STEPS):
        _step(b, "b", s)
    _assert_same(_tables(b), want_b)


def test_a_collected_object_releases_its_engine():
    a = _embedding("a")
    _step(a, "a", 0)
    engine_a = a.layout.engine
    del a
    gc.collect()
    assert not tte_ops.is_tpu_embedding_initialized(engine=engine_a).numpy()


def test_checkpoint_restore_object_coexists_with_a_training_object(tmp_path):
    trained = _embedding("a")
    try:
        for s in range(2):
            _step(trained, "a", s)
        path = tf.train.Checkpoint(embedding=trained).save(str(tmp_path / "ckpt"))
        want = _tables(trained)
        # TF's pattern: a CPU-side object only to read the checkpoint (no build,
        # no engine) while the training object keeps its engine.
        reader = _embedding("a")
        tf.train.Checkpoint(embedding=reader).restore(path)  # deferred: variables come lazily
        _assert_same(_tables(reader), want)
        assert not engine_registry.is_owner(reader)
        _step(trained, "a", 2)  # the training object is unaffected
        # Built, the restored object gets an engine of its own with those tables.
        reader.build(B)
        assert engine_registry.is_owner(reader) and engine_registry.is_owner(trained)
        _assert_same(_tables(reader), want)
        reader.shutdown()
    finally:
        trained.shutdown()


def test_core_named_raw_ops_address_the_default_engine():
    a = _embedding("a")
    config = eu.feature_mode_config([TableSpec("t", 6, 2)], [FeatureSpec("f", 0, [2])])
    try:
        _step(a, "a", 0)
        assert not tf.raw_ops.IsTPUEmbeddingInitialized().numpy()  # a's engine is not the default
        with eu.engine(config):
            assert tf.raw_ops.IsTPUEmbeddingInitialized().numpy()
            assert tte_ops.is_tpu_embedding_initialized(engine="").numpy()
            table = eu.load_random_tables(config, 3)["t"][0]
            eu.enqueue_arbitrary([(eu.empty(tf.int32), np.array([4, 1], np.int64),
                                   eu.empty(tf.float32))])
            _step(a, "a", 1)  # a's queue and tables are its own
            np.testing.assert_array_equal(eu.recv(config)[0], table[[4, 1]])
            # the prefixed ops with engine="" reach the same (default) engine
            tte_ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                [eu.empty(tf.int32)], [np.array([2, 3], np.int64)], [eu.empty(tf.float32)],
                engine="")
            np.testing.assert_array_equal(eu.recv(config)[0], table[[2, 3]])
        assert engine_registry.is_owner(a)
    finally:
        a.shutdown()


def test_named_engine_errors_name_the_engine():
    config = eu.feature_mode_config([TableSpec("t", 6, 2)], [FeatureSpec("f", 0, [2])])
    raw = config.SerializeToString()
    tte_ops.configure_tpu_embedding(raw, engine="mine")
    try:
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match="TPU embedding engine 'mine' is already configured"):
            tte_ops.configure_tpu_embedding(raw, engine="mine")
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match="RecvTPUEmbeddingActivations: TPU embedding engine 'other' is "
                                 "not configured; run ConfigureTPUEmbedding with "
                                 "engine='other' first"):
            tte_ops.recv_tpu_embedding_activations(1, raw, engine="other")
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match="the default TPU embedding engine is not configured"):
            tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=1, config=raw)
    finally:
        tte_ops.shutdown_tpu_embedding(engine="mine")
    assert not tte_ops.is_tpu_embedding_initialized(engine="mine").numpy()


def test_memory_budget_counts_every_live_engine(monkeypatch):
    """Two engines that fit the budget only one at a time: the second is
    refused while the first lives and configures once it is shut down."""
    config = eu.feature_mode_config([TableSpec("t", 1 << 16, 64)], [FeatureSpec("f", 0, [2])])
    raw = config.SerializeToString()
    one = (1 << 16) * 64 * 4 * 2  # adagrad: parameters + accumulators (README "Memory budget")
    monkeypatch.setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", str(one * 3 // 2))
    tte_ops.configure_tpu_embedding(raw, engine="first")
    try:
        with pytest.raises(tf.errors.ResourceExhaustedError,
                           match="need %d bytes \\(other live engines hold %d bytes\\)"
                                 % (one, one)):
            tte_ops.configure_tpu_embedding(raw, engine="second")
        assert not tte_ops.is_tpu_embedding_initialized(engine="second").numpy()
    finally:
        tte_ops.shutdown_tpu_embedding(engine="first")
    tte_ops.configure_tpu_embedding(raw, engine="second")
    tte_ops.shutdown_tpu_embedding(engine="second")
