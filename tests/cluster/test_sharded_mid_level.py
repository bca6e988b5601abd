"""tf_tpu_emb.TPUEmbedding(cluster=...) on a loopback cluster vs one local engine.

Two embedding hosts (each with 2 replica devices); the same feature config,
initial tables and batches train a clustered TPUEmbedding and a local one.
Features cover a weighted mean bag (sparse), a sqrtn ragged bag, a sum
high-rank dense feature and a sequence feature; optimizers SGD, Adagrad, Adam
and FTRL; DIV_DEFAULT and MOD; 1 replica, and 2 replicas (two TPUEmbedding
objects with ``workers=(0, 2)`` / ``(1, 2)``, each driving one engine replica,
as two worker processes do; and two real worker processes, this one and a
child), checked against one local engine fed the global
batch (both replicas' batches concatenated: the engine's update sums every
replica's contributions per row).

Tolerances (engine/routing.h says why): with one replica, tables and slots
bit-identical (each row's contributions reach its host in the single-engine
order with the same weights, or summed by the worker in that order), except
rtol 1e-6 for the sqrtn table (the engine's sum of squared weights may be fused
(FMA), TF's is not); with two replicas rtol 1e-5 for every table (a table sent
in the rows form reaches its host as one summed gradient per replica, and the
two sums are added: one reassociation, a relative 5e-7 in a gradient, which
FTRL's square roots amplify to a few 1e-6); activations rtol 1e-5 (a bag whose
ids are split over hosts is the sum of the hosts' partial sums).
"""
import json
import threading

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
import harness
from cluster import connected_hosts
import tf_tpu_emb
from sharded_case import (B, STEPS, TABLES, OPTIMIZERS, clustered, concat, feature_config,
                          make_case, state, stepper)

pytestmark = pytest.mark.system  # child processes, servers or compilers


@pytest.fixture(scope="module")
def hosts():
    with connected_hosts(2, replicas_per_host=2) as h:
        yield h


def one_engine(initial, optimizer, per_replica, cots):
    """One local engine fed the global batch (the replicas' batches
    concatenated): activations per step and the final tables."""
    local = tf_tpu_emb.TPUEmbedding(feature_config(initial, B * len(per_replica[0])),
                                    OPTIMIZERS[optimizer]())
    step = stepper(local)
    want = [step(concat([f for f, _ in s]), concat([w for _, w in s]),
                 {k: tf.concat([c[k] for c in cs], 0) for k in cs[0]})
            for s, cs in zip(per_replica, cots)]
    tables = state(local)
    local.shutdown()
    return want, tables


def assert_equivalent(got_acts, want_acts, got_state, want_state):
    """got_acts[step][worker]: that worker's slice of the global batch."""
    for s, per_worker in enumerate(got_acts):
        for w, acts in enumerate(per_worker):
            for name in want_acts[s]:
                eu.assert_close(acts[name], want_acts[s][name][w * B:(w + 1) * B],
                                rtol=1e-5, atol=1e-6, what="step %d worker %d %s" % (s, w, name))
    for t in want_state:
        for n in want_state[t]:
            if TABLES[t][2] == "sqrtn" or len(got_acts[0]) > 1:
                rtol = 1e-6 if len(got_acts[0]) == 1 else 1e-5
                np.testing.assert_allclose(got_state[t][n], want_state[t][n], rtol=rtol,
                                           atol=rtol / 10, err_msg="%s/%s" % (t, n))
            else:
                np.testing.assert_array_equal(got_state[t][n], want_state[t][n],
                                              err_msg="%s/%s" % (t, n))


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("sharding", ["DIV_DEFAULT", "MOD"])
def test_clustered_training_equals_one_engine(hosts, engine_released, sharding, optimizer,
                                              replicas):
    initial, per_replica, cots = make_case(len(sharding) * 10 + len(optimizer) + replicas,
                                           replicas)
    want, want_state = one_engine(initial, optimizer, per_replica, cots)
    workers = [clustered(initial, optimizer, hosts, sharding, w, replicas)
               for w in range(replicas)]
    try:
        # The workers' steps interleave (each step is one synchronous update);
        # worker 0's first enqueue builds (configures and loads the hosts),
        # the others' attach to its engines.
        fns = [stepper(emb) for emb in workers]
        got = [[fns[w](*per_replica[s][w], cots[s][w]) for w in range(replicas)]
               for s in range(STEPS)]
        assert_equivalent(got, want, state(workers[0]), want_state)
    finally:
        for emb in reversed(workers):
            emb.shutdown()


@pytest.mark.parametrize("sharding, optimizer", [
    ("DIV_DEFAULT", "adam"), pytest.param("MOD", "ftrl", marks=pytest.mark.long)])
def test_two_worker_processes_train_one_model(hosts, engine_released, tmp_path, sharding,
                                              optimizer):
    """Worker 0 (this process) and worker 1 (a child process) each drive one
    engine replica of the same hosts; every step is one synchronous update."""
    seed = 7 + len(optimizer)
    initial, per_replica, cots = make_case(seed, 2)
    want, want_state = one_engine(initial, optimizer, per_replica, cots)
    emb = clustered(initial, optimizer, hosts, sharding, 0, 2)
    step = stepper(emb)
    try:
        got = [[step(*per_replica[0][0], cots[0][0])]]  # builds: configures and loads
        out = str(tmp_path / "worker1.npz")
        child = []
        thread = threading.Thread(target=lambda: child.append(harness.run_python(
            [harness.script(__file__, "sharded_case.py"),
             json.dumps(hosts.cluster_spec.as_dict()), sharding, optimizer, str(seed), out],
            timeout=240)))
        thread.start()
        # Step 1's Recv waits on the hosts until worker 1 has sent step 0.
        got += [[step(*per_replica[s][0], cots[s][0])] for s in range(1, STEPS)]
        thread.join()
        assert child and child[0].returncode == 0, harness.describe(child[0]) if child else ""
        worker1 = np.load(out)
        for s in range(STEPS):
            got[s].append({k: worker1["%d_%s" % (s, k)] for k in want[s]})
        assert_equivalent(got, want, state(emb), want_state)
    finally:
        emb.shutdown()
