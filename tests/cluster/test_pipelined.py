"""``pipeline_execution_with_tensor_core=True`` on one engine and on two hosts.

The rule (docs/tpu_embedding_semantics.md, config field 7: "the forward pass
of step N+1 may run before the backward pass of step N"; engine/engine.h,
``deferred_``): a step's update waits for the next lookup, so the lookup of
step N+1 sees the updates of steps < N and never step N's, however the ops
reach the engine; Retrieve (and Load, the step-count ops) start a waiting
update first.  The same rule runs in the in-process engine and in every
host's shard engine, so:

* in process: step 1's activations are the lookup of its batch in the
  initial tables (update 0 is not seen), step 0's and the final tables equal
  the unpipelined run's (the gradients are fixed, so the same updates are
  applied in the same order), and step 1's activations differ from the
  unpipelined run's (the deferral is visible);
* two real ``python -m tf_tpu_emb.server`` hosts, 1, 2 and 4 steps per
  ``tf.function`` call (inside a call a host looks up step k+1 before step
  k's gradients come, engine/engine.h ``lookahead_``): activations of every
  step and the final tables equal the in-process pipelined engine's, with
  test_sharded_mid_level.py's one-replica tolerances (tables bit-identical
  except rtol 1e-6 for the sqrtn table; activations rtol 1e-5: a bag split
  over hosts is the sum of their partial sums);
* two replicas (two worker objects, ``workers=(0, 2)`` / ``(1, 2)``, their
  steps interleaved) on the same hosts equal one in-process pipelined engine
  fed the global batch: the update waits for both replicas' next lookups
  (test_sharded_mid_level.py's two-replica tolerance, rtol 1e-5).
"""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from cluster import connected_hosts
import tf_tpu_emb
from sharded_case import (B, OPTIMIZERS, TABLES, concat, feature_config, make_case,
                          multi_stepper, state, stepper)

pytestmark = pytest.mark.system  # servers


@pytest.fixture(scope="module")
def hosts():
    with connected_hosts(2, replicas_per_host=2) as h:
        yield h


def _steps(seed):
    """(initial tables, 4 steps of (features, weights, cotangent)): the case's
    two batches twice."""
    initial, per_replica, cots = make_case(seed, 1)
    steps = [(per_replica[s][0][0], per_replica[s][0][1], cots[s][0]) for s in range(2)]
    return initial, steps * 2


def _run(emb, steps, per_call):
    """Activations of every step (numpy) and the final tables; `per_call`
    steps in each tf.function call."""
    call = multi_stepper(emb)
    acts = []
    for s in range(0, len(steps), per_call):
        acts.extend({k: v.numpy() for k, v in a.items()} for a in call(steps[s:s + per_call]))
    return acts, state(emb)


def _make(initial, optimizer, pipelined, hosts=None):
    return tf_tpu_emb.TPUEmbedding(feature_config(initial, B), OPTIMIZERS[optimizer](),
                                   pipeline_execution_with_tensor_core=pipelined,
                                   **({} if hosts is None else {"cluster": hosts}))


def _assert_tables(got, want):
    """Bit-identical, except rtol 1e-6 for the sqrtn table (the module doc)."""
    for t in want:
        for n in want[t]:
            if TABLES[t][2] == "sqrtn":
                np.testing.assert_allclose(got[t][n], want[t][n], rtol=1e-6, atol=1e-7,
                                           err_msg="%s/%s" % (t, n))
            else:
                np.testing.assert_array_equal(got[t][n], want[t][n], err_msg="%s/%s" % (t, n))


@pytest.mark.parametrize("optimizer", ["adagrad", "ftrl"])
def test_one_engine_next_lookup_does_not_see_the_current_update(optimizer, engine_released):
    initial, steps = _steps(3)
    runs = {}
    for pipelined in (False, True):
        emb = _make(initial, optimizer, pipelined)
        try:
            runs[pipelined] = _run(emb, steps, 1)
        finally:
            emb.shutdown()
    fresh = _make(initial, optimizer, False)  # step 1's batch on the initial tables
    try:
        first, _ = _run(fresh, steps[1:2], 1)
    finally:
        fresh.shutdown()
    (plain, plain_tables), (piped, piped_tables) = runs[False], runs[True]
    for name in plain[0]:
        np.testing.assert_array_equal(piped[0][name], plain[0][name], err_msg=name)
        np.testing.assert_array_equal(piped[1][name], first[0][name], err_msg=name)
    assert any(not np.array_equal(piped[1][n], plain[1][n]) for n in plain[1]), \
        "step 1 saw step 0's update although the config pipelines execution"
    for t in plain_tables:  # the same updates in the same order: same tables
        for n in plain_tables[t]:
            np.testing.assert_array_equal(piped_tables[t][n], plain_tables[t][n],
                                          err_msg="%s/%s" % (t, n))


@pytest.mark.parametrize("per_call", [1, 2, 4])  # 4: a host looks ahead twice in one call
@pytest.mark.parametrize("optimizer", ["adagrad", "ftrl"])
def test_two_hosts_equal_one_pipelined_engine(hosts, optimizer, per_call, engine_released):
    initial, steps = _steps(5)
    local = _make(initial, optimizer, True)
    try:
        want, want_tables = _run(local, steps, per_call)
    finally:
        local.shutdown()
    clustered = _make(initial, optimizer, True, hosts)
    try:
        got, got_tables = _run(clustered, steps, per_call)
    finally:
        clustered.shutdown()
    for s, (g, w) in enumerate(zip(got, want)):
        for name in w:
            eu.assert_close(g[name], w[name], rtol=1e-5, atol=1e-6,
                            what="step %d %s" % (s, name))
    _assert_tables(got_tables, want_tables)


def test_two_replicas_equal_one_pipelined_engine_fed_the_global_batch(hosts, engine_released):
    initial, per_replica, cots = make_case(9, 2)
    per_replica, cots = per_replica * 2, cots * 2  # 4 steps
    local = tf_tpu_emb.TPUEmbedding(feature_config(initial, 2 * B), OPTIMIZERS["adagrad"](),
                                    pipeline_execution_with_tensor_core=True)
    try:
        step = stepper(local)
        want = [{k: v.numpy() for k, v in step(
            concat([f for f, _ in s]), concat([w for _, w in s]),
            {k: tf.concat([c[k] for c in cs], 0) for k in cs[0]}).items()}
            for s, cs in zip(per_replica, cots)]
        want_tables = state(local)
    finally:
        local.shutdown()
    workers = []
    try:
        for w in range(2):
            workers.append(tf_tpu_emb.TPUEmbedding(
                feature_config(initial, B), OPTIMIZERS["adagrad"](),
                pipeline_execution_with_tensor_core=True, cluster=hosts,
                sharding_strategy="MOD", workers=(w, 2)))
        fns = [stepper(emb) for emb in workers]
        got = [[fns[w](*per_replica[s][w], cots[s][w]) for w in range(2)]
               for s in range(len(per_replica))]
        got_tables = state(workers[0])
    finally:
        for emb in reversed(workers):
            emb.shutdown()
    for s, per_worker in enumerate(got):
        for w, acts in enumerate(per_worker):
            for name in want[s]:
                eu.assert_close(acts[name].numpy(), want[s][name][w * B:(w + 1) * B], rtol=1e-5,
                                atol=1e-6, what="step %d worker %d %s" % (s, w, name))
    for t in want_tables:
        for n in want_tables[t]:
            np.testing.assert_allclose(got_tables[t][n], want_tables[t][n], rtol=1e-5,
                                       atol=1e-6, err_msg="%s/%s" % (t, n))
