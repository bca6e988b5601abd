"""The memory budget is a reservation (issue 24 item 2; README "Memory budget").

ConfigureTPUEmbedding checks the tables' bytes against the budget and
reserves them in one step, before allocating (engine/engine.cc
Engine::ReserveMemory), so engines configured at the same instant cannot both
pass; a failed configure and a shutdown return the reservation.  The engines
here are named (our prefixed ops' `engine` attr) so that two configure at once.
"""
import threading

import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from tf_tpu_emb import engine_registry
from tf_tpu_emb import ops as tte_ops

# 2M rows x dim 4 x 4 bytes = 32 MiB of SGD parameters: allocating and
# filling them takes long enough for two unreserved configures to overlap.
ROWS, DIM = 1 << 21, 4
ENGINE_BYTES = ROWS * DIM * 4


def _config(name):
    return eu.serialize(eu.feature_mode_config(
        [TableSpec(name, ROWS, DIM, optimizer="stochastic_gradient_descent")],
        [FeatureSpec("f", 0, [2])]))


@pytest.fixture
def names(lib):
    del lib
    made = []
    yield made
    for n in made:
        tte_ops.shutdown_tpu_embedding(engine=n)


def _race(names, count):
    """`count` threads configure an engine each at the same instant; returns
    {name: None or the error}."""
    barrier = threading.Barrier(count)
    results = {}

    def configure(name):
        barrier.wait()
        try:
            tte_ops.configure_tpu_embedding(_config(name), engine=name)
            results[name] = None
        except tf.errors.OpError as e:
            results[name] = e

    threads = [threading.Thread(target=configure, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("round_", range(4))
def test_concurrent_configures_over_the_limit_admit_exactly_one(monkeypatch, names, round_):
    base = engine_registry.live_state_bytes()
    limit = base + ENGINE_BYTES * 3 // 2  # room for one engine, not two
    monkeypatch.setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", str(limit))
    pair = ["race%d_a" % round_, "race%d_b" % round_]
    names.extend(pair)
    results = _race(pair, 2)
    admitted = [n for n, e in results.items() if e is None]
    refused = [e for e in results.values() if e is not None]
    assert len(admitted) == 1 and len(refused) == 1, results
    error = refused[0]
    assert isinstance(error, tf.errors.ResourceExhaustedError), error
    assert ("need %d bytes (other live engines hold %d bytes) but the memory budget is %d "
            "bytes (TF_TPU_EMB_MEMORY_LIMIT_BYTES)" % (ENGINE_BYTES, base + ENGINE_BYTES, limit)
            in error.message), error.message
    assert engine_registry.live_state_bytes() == base + ENGINE_BYTES
    tte_ops.shutdown_tpu_embedding(engine=admitted[0])
    assert engine_registry.live_state_bytes() == base


def test_concurrent_configures_within_the_limit_all_succeed(monkeypatch, names):
    base = engine_registry.live_state_bytes()
    monkeypatch.setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", str(base + 3 * ENGINE_BYTES))
    trio = ["fit_a", "fit_b", "fit_c"]
    names.extend(trio)
    assert _race(trio, 3) == {n: None for n in trio}
    assert engine_registry.live_state_bytes() == base + 3 * ENGINE_BYTES


@pytest.mark.parametrize("variable, value", [
    ("TF_TPU_EMB_STORAGE", "bf17"),                 # fails after reserving, before allocating
    ("TF_TPU_EMB_STEP_TIMEOUT_SECONDS", "never"),   # fails after allocating
])
def test_a_failed_configure_returns_its_reservation(monkeypatch, names, variable, value):
    base = engine_registry.live_state_bytes()
    monkeypatch.setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", str(base + ENGINE_BYTES))
    monkeypatch.setenv(variable, value)
    names.append("failing")
    with pytest.raises(tf.errors.InvalidArgumentError, match=variable):
        tte_ops.configure_tpu_embedding(_config("failing"), engine="failing")
    assert engine_registry.live_state_bytes() == base
    monkeypatch.delenv(variable)
    # The whole budget is there for the next engine.
    tte_ops.configure_tpu_embedding(_config("failing"), engine="failing")
    assert engine_registry.live_state_bytes() == base + ENGINE_BYTES


def test_shutdown_returns_the_reservation(monkeypatch, names):
    base = engine_registry.live_state_bytes()
    monkeypatch.setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", str(base + ENGINE_BYTES))
    names.extend(["first", "second"])
    tte_ops.configure_tpu_embedding(_config("first"), engine="first")
    with pytest.raises(tf.errors.ResourceExhaustedError):
        tte_ops.configure_tpu_embedding(_config("second"), engine="second")
    tte_ops.shutdown_tpu_embedding(engine="first")
    assert engine_registry.live_state_bytes() == base
    tte_ops.configure_tpu_embedding(_config("second"), engine="second")
