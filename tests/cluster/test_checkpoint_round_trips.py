"""Checkpoints through the mid-level API across host counts.

A ``tf.train.Checkpoint`` of ``tf_tpu_emb.TPUEmbedding`` holds whole tables in
TF's TPU-embedding layout whatever the host count, so one written by a model
on S=2 embedding hosts restores exactly (bit for bit: tables and Adagrad
slots) into one in-process engine, into S'=3 hosts and into TF's
``TPUEmbeddingForServing``; and one written by one engine restores into 2
hosts.  Each module-scoped fixture trains and saves in its own stage (one
process is connected to one cluster at a time), the tests compare the states.
"""
import numpy as np
import pytest
import tensorflow as tf

from cluster import LoopbackCluster
import tf_tpu_emb
from sharded_case import B, OPTIMIZERS, TABLES, feature_config, make_case, state, stepper

pytestmark = pytest.mark.system  # child processes, servers or compilers

OPTIMIZER = "adagrad"


@pytest.fixture(scope="module")
def case():
    return make_case(31, 1)


def _train(emb, case, steps):
    _, per_replica, cots = case
    step = stepper(emb)
    for s in steps:
        step(*per_replica[s][0], cots[s][0])


def _embedding(initial, hosts=None):
    return tf_tpu_emb.TPUEmbedding(feature_config(initial, B), OPTIMIZERS[OPTIMIZER](),
                                   cluster=hosts)


def _zeros(initial):
    return {n: np.zeros_like(v) for n, v in initial.items()}


def _restore(emb, path):
    emb.build(per_replica_batch_size=B)
    tf.train.Checkpoint(embedding=emb).restore(path).assert_consumed()
    return state(emb)


@pytest.fixture(scope="module")
def one_host(case, tmp_path_factory):
    """One in-process engine after a step: (its checkpoint, its state)."""
    emb = _embedding(case[0])
    try:
        _train(emb, case, [0])
        path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path_factory.mktemp("one") / "c"))
        return path, state(emb)
    finally:
        emb.shutdown()


@pytest.fixture(scope="module")
def two_hosts(case, one_host, tmp_path_factory):
    """On 2 hosts: the state right after restoring `one_host`'s checkpoint into
    fresh (zero) tables, then after one more step: (its checkpoint, its state)."""
    with LoopbackCluster(2) as cluster:
        cluster.hosts.connect()
        emb = _embedding(_zeros(case[0]), cluster.hosts)
        try:
            restored = _restore(emb, one_host[0])
            _train(emb, case, [1])
            path = tf.train.Checkpoint(embedding=emb).save(
                str(tmp_path_factory.mktemp("two") / "c"))
            return restored, path, state(emb)
        finally:
            emb.shutdown()


def assert_same_state(got, want):
    assert sorted(got) == sorted(want)
    for t in want:
        assert sorted(got[t]) == sorted(want[t]), t
        for slot in want[t]:
            np.testing.assert_array_equal(got[t][slot], want[t][slot], err_msg="%s %s" % (t, slot))


def test_one_host_checkpoint_restores_into_two_hosts(one_host, two_hosts):
    assert_same_state(two_hosts[0], one_host[1])


def test_the_two_host_step_changed_the_tables(one_host, two_hosts):
    """The 2-host checkpoint is not the 1-host one: the round trips below are
    checked on state the sharded step produced."""
    assert any(not np.array_equal(two_hosts[2][t]["parameters"], one_host[1][t]["parameters"])
               for t in TABLES)


def test_two_host_checkpoint_restores_into_one_engine(case, two_hosts):
    emb = _embedding(_zeros(case[0]))
    try:
        assert_same_state(_restore(emb, two_hosts[1]), two_hosts[2])
    finally:
        emb.shutdown()


def test_two_host_checkpoint_restores_into_three_hosts(case, two_hosts):
    with LoopbackCluster(3) as cluster:
        cluster.hosts.connect()
        emb = _embedding(_zeros(case[0]), cluster.hosts)
        try:
            assert_same_state(_restore(emb, two_hosts[1]), two_hosts[2])
        finally:
            emb.shutdown()


def test_two_host_checkpoint_restores_into_tpu_embedding_for_serving(case, two_hosts):
    fc = feature_config(_zeros(case[0]), B)
    serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(fc, OPTIMIZERS[OPTIMIZER]())
    serving.build()
    tf.train.Checkpoint(embedding=serving).restore(two_hosts[1]).assert_consumed()
    tables = {t.name: t for t in {f.table for f in fc.values()}}
    for t, slots in two_hosts[2].items():
        np.testing.assert_array_equal(serving.embedding_tables[tables[t]].numpy(),
                                      slots["parameters"], err_msg=t)
        for slot, value in slots.items():
            if slot != "parameters":
                np.testing.assert_array_equal(
                    serving._variables[t][slot].numpy(), value,  # pylint: disable=protected-access
                    err_msg="%s %s" % (t, slot))
