"""A hung embedding host under the sharded data path (TPUEmbedding(cluster=)).

Two loopback hosts; host 1 is stopped (SIGSTOP: alive, holding its sockets,
silent) while a training step runs under ``hosts.run(timeout_s=3)``.  The step
must fail with DeadlineExceededError naming host 1 (and not host 0) within
the deadline, never hang.  The host was stopped before the step began, so
the step was abandoned before it started (hosts.run asks every host for its
step count first): when the host is continued (SIGCONT) its thread ends
without running the step (a step the caller was told had failed must never
be applied late, after a recovery), and training goes on: the activations
and tables after the next step equal one local engine run through the steps
that were applied (the tolerances of test_sharded_mid_level.py).
"""
import os
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from cluster import LoopbackCluster
import tf_tpu_emb
from sharded_case import B, OPTIMIZERS, TABLES, feature_config, make_case, state, stepper

pytestmark = pytest.mark.system  # servers

STEP_THREAD = "tf_tpu_emb-step"  # hosts.run's thread (tf_tpu_emb/cluster/hosts.py)


@pytest.fixture(scope="module")
def cluster():
    with LoopbackCluster(2) as c:
        c.hosts.connect()
        tf_tpu_emb.load_library()
        yield c


def test_hung_host_is_named_in_bounded_time_and_training_goes_on(cluster, engine_released):
    initial, per_replica, cots = make_case(11, 1)
    steps = [(per_replica[s][0], cots[s][0]) for s in range(len(per_replica))]
    steps.append(steps[0])  # a third step: the first batch again
    local = tf_tpu_emb.TPUEmbedding(feature_config(initial, B), OPTIMIZERS["adagrad"]())
    clustered = tf_tpu_emb.TPUEmbedding(feature_config(initial, B), OPTIMIZERS["adagrad"](),
                                        cluster=cluster.hosts)
    local_step, clustered_step = stepper(local), stepper(clustered)
    try:
        (f, w), c = steps[0]
        want = [local_step(f, w, c)]
        got = [cluster.hosts.run(clustered_step, f, w, c, timeout_s=120)]

        (f, w), c = steps[1]
        pid = cluster.procs[1].pid
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(tf.errors.DeadlineExceededError) as info:
                cluster.hosts.run(clustered_step, f, w, c, timeout_s=3)
            assert time.monotonic() - started < 30  # 3 s, then a bounded probe of the hosts
        finally:
            os.kill(pid, signal.SIGCONT)
        message = info.value.message
        assert cluster.hosts.describe(1) in message, message
        assert cluster.hosts.describe(0) not in message, message
        assert "did not finish (nor start: it never will, nothing was sent) within 3 s" \
            in message, message
        for thread in threading.enumerate():  # the abandoned step ends once host 1 answers
            if thread.name == STEP_THREAD:
                thread.join(120)
                assert not thread.is_alive(), "the abandoned step never finished"

        (f, w), c = steps[2]
        want.append(local_step(f, w, c))
        got.append(cluster.hosts.run(clustered_step, f, w, c, timeout_s=120))
        for s, (g, w_) in enumerate([(got[0], want[0]), (got[1], want[1])]):
            for name in w_:
                eu.assert_close(g[name].numpy(), w_[name].numpy(), rtol=1e-5, atol=1e-6,
                                what="step %d %s" % (2 * s, name))
        want_state, got_state = state(local), state(clustered)
        for t in want_state:
            for n in want_state[t]:
                rtol = 1e-6 if TABLES[t][2] == "sqrtn" else 0
                np.testing.assert_allclose(got_state[t][n], want_state[t][n], rtol=rtol,
                                           atol=rtol / 10, err_msg="%s/%s" % (t, n))
    finally:
        clustered.shutdown()
        local.shutdown()



def test_eager_enqueue_on_a_hung_host_is_bounded_and_the_step_completes(cluster, monkeypatch):
    """An eager call's wait for the hosts (hosts.translating) ends at
    TF_TPU_EMB_HOST_TIMEOUT_SECONDS with DeadlineExceededError naming the hung
    host; once it answers, the enqueued batch is there and the step completes
    as on one engine."""
    import lifecycle_model as model  # pylint: disable=import-outside-toplevel

    local, clustered = model.make(), model.make(cluster.hosts)
    local.build(model.B)
    clustered.build(model.B)
    try:
        model.step(local, 0)
        model.step(clustered, 0)
        monkeypatch.setenv("TF_TPU_EMB_HOST_TIMEOUT_SECONDS", "3")
        pid = cluster.procs[1].pid
        os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(tf.errors.DeadlineExceededError) as info:
                clustered.enqueue({"f": model.ids(1)})
            assert time.monotonic() - started < 30  # 3 s, then a bounded probe
        finally:
            os.kill(pid, signal.SIGCONT)
        message = info.value.message
        assert "did not confirm this step's operations within 3 s" in message, message
        assert cluster.hosts.describe(1) in message and cluster.hosts.describe(0) not in message
        for thread in threading.enumerate():  # the abandoned wait ends once host 1 answers
            if thread.name == "tf_tpu_emb-sync":
                thread.join(120)
                assert not thread.is_alive(), "the wait never finished"
        monkeypatch.delenv("TF_TPU_EMB_HOST_TIMEOUT_SECONDS")
        clustered.apply_gradients({"f": clustered.dequeue()["f"] + 1.0})
        model.step(local, 1)
        np.testing.assert_allclose(model.table(clustered), model.table(local), rtol=1e-6)
    finally:
        clustered.shutdown()
        local.shutdown()
