"""An engine's lifetime is its owner's (issue 24 items 1, 3, 4, 5, 7).

* Collected owners release their engine from any thread, even while another
  thread traces a tf.function (the release is a C call, not an op added to
  the graph being traced; tf_tpu_emb/engine_registry.py).
* Engine names are pooled: churn does not grow the set of names (TF's eager
  kernel cache keys on them), and a function traced for a collected object
  keeps its name out of the pool, so it can never reach another object's
  engine.
* No implicit rebuild after shutdown(): the data path raises, from any thread,
  until an explicit build() or a checkpoint restore.
* The first enqueue of an unbuilt object builds it once, whichever threads race.
* enqueue() returns None, as TF's does (also inside tf.function).
"""
import gc
import threading

import numpy as np
import pytest
import tensorflow as tf

import tf_tpu_emb
from tf_tpu_emb import engine_registry
from tf_tpu_emb import ops as tte_ops

E = tf.tpu.experimental.embedding
B, VOCAB, DIM = 4, 16, 3


@pytest.fixture(autouse=True)
def no_engines_left(lib):
    del lib
    gc.collect()
    before = engine_registry.live_state_bytes()
    yield
    gc.collect()
    assert engine_registry.owners() == []
    assert engine_registry.live_state_bytes() == before


def _initial(shape, dtype=tf.float32):
    return tf.constant(np.arange(np.prod(shape)).reshape(shape) * 0.01, dtype)


def make(vocab=VOCAB):
    table = E.TableConfig(vocab, DIM, name="t", combiner="sum", initializer=_initial)
    return tf_tpu_emb.TPUEmbedding({"f": E.FeatureConfig(table)}, E.SGD(0.5))


def batch(step=0):
    return {"f": tf.constant((np.arange(B) * 3 + step) % VOCAB, tf.int64)}


def step(emb, s=0):
    emb.enqueue(batch(s))
    emb.apply_gradients(emb.dequeue())


def configured(name):
    return bool(tte_ops.is_tpu_embedding_initialized(engine=name).numpy())


# ================================================= item 1: collected anywhere

def _trace_collecting():
    """Traces, in a fresh function, a body that runs the cycle collector
    (what any allocation can trigger in the middle of a user's trace)."""
    @tf.function
    def traced(x):
        gc.collect()
        return x + 1

    return traced.get_concrete_function(tf.TensorSpec([], tf.float32)).graph


def test_object_collected_inside_another_threads_trace_releases_its_engine():
    emb = make()
    emb.build(B)
    step(emb)
    name = emb.layout.engine
    emb.self_reference = emb  # only the cycle collector can free it
    del emb
    graphs = []
    thread = threading.Thread(target=lambda: graphs.append(_trace_collecting()))
    thread.start()
    thread.join()
    assert not configured(name)
    # Nothing of the release went into the graph being traced.
    assert not [op.type for op in graphs[0].get_operations() if "Shutdown" in op.type]


def test_objects_dropped_by_one_thread_while_another_traces_leak_nothing(monkeypatch):
    done = threading.Event()
    graphs = []

    def tracer():
        while not done.is_set():
            graphs.append(_trace_collecting())

    thread = threading.Thread(target=tracer)
    thread.start()
    try:
        for i in range(40):
            emb = make()
            emb.build(B)
            step(emb, i)
            emb.self_reference = emb
            del emb
            if i % 8 == 7:
                gc.collect()
    finally:
        done.set()
        thread.join()
    gc.collect()
    assert engine_registry.engines() == []
    assert len(graphs) > 0
    assert not [op.type for g in graphs for op in g.get_operations() if "Shutdown" in op.type]
    # Nothing is left in C++ either: a budget of exactly one engine more than
    # before admits one (the fixture checks the live bytes too).
    monkeypatch.setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES",
                       str(engine_registry.live_state_bytes() + VOCAB * DIM * 4))
    emb = make()
    emb.build(B)
    emb.shutdown()


def test_shutdown_inside_a_trace_runs_at_once():
    emb = make()
    emb.build(B)
    name = emb.layout.engine

    @tf.function
    def traced():
        emb.shutdown()
        return tf.constant(0)

    graph = traced.get_concrete_function().graph
    assert not configured(name)
    assert not [op for op in graph.get_operations() if "Shutdown" in op.type]


# ======================================================== item 3: name pool

def test_names_are_reused_after_owners_are_gone():
    made_before, _ = engine_registry.pool_size()
    names = set()
    for i in range(12):
        emb = make()
        emb.build(B)
        step(emb, i)
        names.add(emb.layout.engine)
        emb.shutdown()
        del emb
    made_after, _ = engine_registry.pool_size()
    assert len(names) == 1, names
    assert made_after - made_before <= 1


def test_a_rebuilt_object_keeps_its_name():
    emb = make()
    emb.build(B)
    name = emb.layout.engine
    emb.shutdown()
    emb.build(B)
    assert emb.layout.engine == name
    emb.shutdown()


def test_a_stale_function_never_reaches_another_objects_engine():
    a = make()
    a.build(B)

    @tf.function
    def lookup():
        # A closure, not a default argument: `del a` below must drop the last
        # reference (pyflakes reads the closure after that del).
        return a.dequeue()["f"]  # noqa: F821

    concrete = lookup.get_concrete_function()
    stale = a.layout.engine
    del lookup
    a.shutdown()
    del a
    gc.collect()
    # The concrete function's graph still carries the name: it stays out of
    # the pool while the function exists.
    b = make()
    b.build(B)
    assert b.layout.engine != stale
    b.enqueue(batch())
    with pytest.raises(tf.errors.FailedPreconditionError, match="is not configured"):
        concrete()
    b.dequeue()  # b's batch is still there: the stale call never reached b
    b.shutdown()
    del b, concrete
    gc.collect()
    c = make()
    c.build(B)
    assert c.layout.engine == stale  # back in the pool
    c.shutdown()


# ============================================ item 4: no implicit rebuild

@pytest.mark.parametrize("call", ["enqueue", "dequeue", "apply_gradients"])
def test_data_path_after_shutdown_says_to_build(call):
    emb = make()
    emb.build(B)
    step(emb)
    emb.shutdown()
    args = {"enqueue": (batch(),), "dequeue": (),
            "apply_gradients": ({"f": tf.zeros([B, DIM])},)}[call]
    with pytest.raises(RuntimeError, match=r"^{} called on a TPUEmbedding that was shut down"
                       r".*Call build\(\).*restore a checkpoint".format(call)):
        getattr(emb, call)(*args)
    assert engine_registry.engines() == []


def test_shutdown_from_another_thread_fails_every_later_step():
    emb = make()
    emb.build(B)
    shut = threading.Event()
    results = []  # (started after the shutdown, error or None)

    def trainer():
        for s in range(400):
            after = shut.is_set()
            try:
                step(emb, s)
                results.append((after, None))
            except (RuntimeError, tf.errors.OpError) as e:  # noqa: PERF203
                results.append((after, e))
            if len(results) > 40 and after:
                return

    thread = threading.Thread(target=trainer)
    thread.start()
    while len(results) < 5:
        threading.Event().wait(0.01)
    emb.shutdown()
    shut.set()
    thread.join()
    later = [e for after, e in results if after]
    assert later and all(e is not None for e in later)
    assert all(isinstance(e, RuntimeError) and "shut down" in str(e) for e in later)
    assert engine_registry.engines() == []


def test_explicit_build_after_shutdown_loads_the_host_variables():
    emb = make()
    emb.build(B)
    for s in range(3):
        step(emb, s)
    trained = emb.embedding_tables[emb.tables[0]].numpy()  # retrieved into the host variable
    step(emb, 3)  # not retrieved: lost with the engine
    emb.shutdown()
    emb.build(B)
    np.testing.assert_array_equal(emb.embedding_tables[emb.tables[0]].numpy(), trained)
    emb.shutdown()


def test_checkpoint_restore_after_shutdown_rebuilds(tmp_path):
    emb = make()
    emb.build(B)
    for s in range(3):
        step(emb, s)
    path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "ckpt"))
    saved = emb.embedding_tables[emb.tables[0]].numpy()
    step(emb, 3)
    emb.shutdown()
    tf.train.Checkpoint(embedding=emb).restore(path)
    np.testing.assert_array_equal(emb.embedding_tables[emb.tables[0]].numpy(), saved)
    step(emb, 4)  # training resumes
    emb.shutdown()


# ================================================ item 5: one concurrent build

def test_racing_first_enqueues_build_once():
    for _ in range(5):
        emb = make()
        barrier = threading.Barrier(2)
        errors = []

        def first_enqueue(s, emb=emb, barrier=barrier, errors=errors):
            barrier.wait()
            try:
                emb.enqueue(batch(s))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=first_enqueue, args=(s,)) for s in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert engine_registry.engines() == [emb.layout.engine]
        emb.dequeue()  # both batches went to the one engine
        emb.dequeue()
        emb.shutdown()
        del emb
        gc.collect()
        assert engine_registry.engines() == []


# ================================================ item 7: enqueue returns None

def test_enqueue_returns_none_eagerly_and_in_a_function():
    emb = make()
    try:
        assert emb.enqueue(batch()) is None
        enqueue = tf.function(lambda f: emb.enqueue(f))
        assert enqueue(batch(1)) is None
        got = tf.function(lambda: emb.dequeue()["f"])()
        first = np.asarray(_initial([VOCAB, DIM]))[batch().get("f").numpy()]
        np.testing.assert_allclose(got.numpy(), first)
        tf.function(lambda: emb.dequeue())()
    finally:
        emb.shutdown()
