"""Waits a person can live with (README "Waits"): a dequeue with nothing to
wait for fails at once; Ctrl-C ends any Recv wait at once with a clean
KeyboardInterrupt and loses nothing; a Recv waiting in a non-daemon thread
never holds the process after its main thread has finished.

The Ctrl-C cases run tests/engine/waits_script.py in a child with the step
timeout raised to 300 s, so a child that ends within a minute of the SIGINT
was interrupted (not timed out)."""
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import harness  # tests/common: the one way to start a child process
import tf_tpu_emb

E = tf.tpu.experimental.embedding
SCRIPT = harness.script(__file__, "waits_script.py")
LONG_TIMEOUT = {"TF_TPU_EMB_STEP_TIMEOUT_SECONDS": "300"}


# ------------------------------------------------- dequeue with nothing enqueued

@pytest.fixture
def embedding():
    table = E.TableConfig(vocabulary_size=10, dim=4, name="video")
    emb = tf_tpu_emb.TPUEmbedding({"watched": E.FeatureConfig(table)}, E.SGD(0.1))
    emb.build(per_replica_batch_size=2)
    yield emb
    emb.shutdown()


@pytest.mark.parametrize("form", ["eager", "function"])
def test_dequeue_before_enqueue_fails_at_once(embedding, form):
    dequeue = embedding.dequeue if form == "eager" else tf.function(embedding.dequeue)
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"TPUEmbedding.dequeue\(\) on replica 0: nothing is enqueued"):
        dequeue()
    # Nothing changed: a step afterwards works.
    embedding.enqueue({"watched": tf.constant([1, 2], tf.int64)})
    assert embedding.dequeue()["watched"].shape == (2, 4)


def test_dequeue_after_an_enqueue_elsewhere_takes_the_batch(embedding):
    """Enqueue and dequeue in separate functions (or eagerly): the check finds
    the batch; one function holding both needs no check."""
    ids = {"watched": tf.constant([1, 2], tf.int64)}
    tf.function(lambda features: embedding.enqueue(features) and None)(ids)
    want = tf.function(embedding.dequeue)()["watched"].numpy()
    embedding.enqueue(ids)
    np.testing.assert_array_equal(embedding.dequeue()["watched"].numpy(), want)

    @tf.function
    def step(features):
        embedding.enqueue(features)
        return embedding.dequeue()

    np.testing.assert_array_equal(step(ids)["watched"].numpy(), want)
    graph = step.get_concrete_function(ids).graph
    assert not [op for op in graph.get_operations() if "AssertTPUEmbeddingEnqueued" in op.type]


# ------------------------------------------------------------------- Ctrl-C

def _default_sigint():
    # A shell without job control starts background commands with SIGINT
    # ignored, and Python keeps an inherited SIG_IGN (no KeyboardInterrupt):
    # the child gets the default a terminal's Python has, wherever pytest runs.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(mode):
    env = harness.child_env(**LONG_TIMEOUT)
    return subprocess.Popen([sys.executable, SCRIPT, mode], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_default_sigint)


def _interrupt(proc):
    """Sends SIGINT once the child waits; returns (seconds to exit, stdout, stderr)."""
    assert proc.stdout.readline().strip() == "waiting", proc.stderr.read()
    time.sleep(1.0)  # the Recv is waiting now
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return time.monotonic() - sent, out, err


@pytest.mark.system
@pytest.mark.parametrize("mode", ["eager", "function", "session"])
def test_ctrl_c_ends_a_waiting_recv_with_keyboard_interrupt(mode):
    seconds, _, err = _interrupt(_start(mode))
    assert seconds < 60, "the Recv was not interrupted (%.0f s)\n%s" % (seconds, err[-3000:])
    last = [line for line in err.strip().splitlines() if line.strip()][-1]
    assert last.startswith("KeyboardInterrupt"), err[-3000:]
    assert "MISMATCH" not in err and "RuntimeError" not in err, err[-3000:]
    assert "interrupted (SIGINT, Ctrl-C) while this op waited" in err, err[-3000:]


@pytest.mark.system
def test_ctrl_c_loses_nothing():
    proc = _start("recover")
    _, out, err = _interrupt(proc)
    assert proc.returncode == 0, err[-3000:]
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    assert "interrupted" in out
    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    activations = np.array(lines["activations"].split(), np.float32).reshape(2, 4)
    np.testing.assert_array_equal(activations, table[[3, 5]])  # bag 0: id 3, bag 1: id 5
    np.testing.assert_array_equal(np.array(lines["table"].split(), np.float32).reshape(8, 4),
                                  table)


@pytest.mark.system
def test_ctrl_c_without_a_wait_is_python_s_own():
    seconds, _, err = _interrupt(_start("sleep"))
    assert seconds < 60 and err.strip().splitlines()[-1].startswith("KeyboardInterrupt"), err
    assert "interrupted (SIGINT" not in err


@pytest.mark.system
def test_a_waiting_thread_does_not_hold_the_exit():
    started = time.monotonic()
    proc = subprocess.run([sys.executable, SCRIPT, "thread"], capture_output=True, text=True,
                          env=harness.child_env(**LONG_TIMEOUT), timeout=240)
    # With a 300 s step timeout, exiting within a minute means the wait ended
    # when the main thread finished (after its grace period).
    assert time.monotonic() - started < 60, harness.describe(proc)
    assert "main thread done" in proc.stdout
    assert "after the program's main thread finished" in proc.stderr, harness.describe(proc)
