"""A host that dies or hangs mid-run: a clear error naming it in bounded time
(never a hang), then restart, reconnect and resume from the last checkpoint.

The step here shards one table over two hosts by hand (MOD layout: id -> host
id % 2, local row id // 2, sum combiner, the same activation gradient sent to
both hosts), so that these tests need only the host layer; the checkpoint is
the whole table (tf_tpu_emb.sharding.assemble of what the hosts
retrieve).  The result after the restart is checked against a numpy SGD
reference of the uninterrupted run."""
import os
import signal

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb

from cluster import LoopbackCluster
from tf_tpu_emb import ops
from tf_tpu_emb import sharding

pytestmark = pytest.mark.system  # child processes, servers or compilers

S, VOCAB, DIM, BATCH, LR = 2, 9, 4, 3, 0.5
BAGS = [[[0, 3], [4], [1, 7, 8]], [[2], [5, 6], [3, 3]], [[8], [0, 1], [4, 7]],
        [[6, 2], [5], [0]], [[1], [2], [3]]]


def _config(k):
    c = pb.TPUEmbeddingConfiguration(mode=pb.TPUEmbeddingConfiguration.TRAINING)
    t = c.table_descriptor.add(name="t", vocabulary_size=sharding.rows_in_shard(VOCAB, S, k),
                               dimension=DIM)
    t.optimization_parameters.stochastic_gradient_descent.SetInParent()
    t.optimization_parameters.learning_rate.constant = LR
    c.feature_descriptor.add(name="f", table_id=0, input_shape=[BATCH])
    return c.SerializeToString()


CONFIGS = [_config(k) for k in range(S)]


def _grad(step):
    return np.arange(BATCH * DIM, dtype=np.float32).reshape(BATCH, DIM) / 10 + step


def _routed(bags, k):
    """Host k's bags: its ids (id % S == k) as local rows id // S."""
    splits, ids = [0], []
    for bag in bags:
        ids += [i // S for i in bag if i % S == k]
        splits.append(len(ids))
    return np.array(splits, np.int64), np.array(ids, np.int64)


def reference(table, steps):
    table = table.copy()
    for step in steps:
        grad = _grad(step)
        for b, bag in enumerate(BAGS[step]):
            for i in bag:
                table[i] -= LR * grad[b]
    return table


class Trainer:
    """Configure/load/step/checkpoint of the hand-sharded table on the hosts."""

    def __init__(self, cluster):
        self.cluster, self.hosts = cluster, cluster.hosts

    def restore(self, full):
        for k in range(S):
            with tf.device(self.hosts.device(k)):
                ops.shutdown_tpu_embedding()
                ops.configure_tpu_embedding(CONFIGS[k])
                tf.raw_ops.LoadTPUEmbeddingStochasticGradientDescentParameters(
                    parameters=sharding.shard_rows(full, S, k, sharding.Sharding.MOD),
                    table_name="t", num_shards=1, shard_id=0)
        self._step = self._build_step()

    def _build_step(self):
        hosts = self.hosts

        @tf.function
        def step(routed, grad):
            acts = []
            for k in range(S):
                with tf.device(hosts.device(k)):
                    splits, ids = routed[k]
                    ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                        [splits], [ids], [tf.zeros([0], tf.float32)], mode_override="train",
                        combiners=["sum"])
                    acts.append(ops.recv_tpu_embedding_activations(num_outputs=1,
                                                                   config=CONFIGS[k])[0])
                    ops.send_tpu_embedding_gradients([grad], config=CONFIGS[k])
            return tf.add_n(acts)
        return step

    def step(self, n, timeout_s=None):
        routed = [_routed(BAGS[n], k) for k in range(S)]
        return self.hosts.run(lambda: self._step(routed, _grad(n)).numpy(), timeout_s=timeout_s)

    def checkpoint(self):
        shards = []
        for k in range(S):
            with tf.device(self.hosts.device(k)):
                shards.append(tf.raw_ops.RetrieveTPUEmbeddingStochasticGradientDescentParameters(
                    table_name="t", num_shards=1, shard_id=0).numpy())
        return sharding.assemble(shards, sharding.Sharding.MOD)


@pytest.fixture(scope="module")
def trainer():
    with LoopbackCluster(S) as cluster:
        cluster.hosts.reconnect()
        yield Trainer(cluster)


INITIAL = np.random.default_rng(3).standard_normal((VOCAB, DIM)).astype(np.float32)


def test_sharded_steps_match_the_reference(trainer):
    trainer.restore(INITIAL)
    trainer.step(0)
    trainer.step(1)
    np.testing.assert_allclose(trainer.checkpoint(), reference(INITIAL, [0, 1]), rtol=1e-6,
                               atol=1e-6)


def _assert_names_host(message, cluster, k):
    assert cluster.hosts.describe(k) in message, message


def test_killed_host_gives_unavailable_naming_it_then_resume(trainer):
    cluster = trainer.cluster
    trainer.restore(INITIAL)
    trainer.step(0)
    saved = trainer.checkpoint()                       # the last checkpoint
    trainer.step(1)                                    # work after it is lost
    cluster.kill(1)
    with pytest.raises(tf.errors.UnavailableError) as info:
        trainer.step(2)
    _assert_names_host(info.value.message, cluster, 1)
    cluster.restart(1)
    cluster.hosts.reconnect()
    trainer.restore(saved)
    for n in (1, 2, 3):
        trainer.step(n)
    np.testing.assert_allclose(trainer.checkpoint(), reference(INITIAL, [0, 1, 2, 3]),
                               rtol=1e-6, atol=1e-6)


def test_hung_host_gives_deadline_exceeded_naming_it_then_resume(trainer):
    cluster = trainer.cluster
    trainer.restore(INITIAL)
    trainer.step(0)
    saved = trainer.checkpoint()
    pid = cluster.procs[0].pid
    os.kill(pid, signal.SIGSTOP)                       # alive, holding its sockets, silent
    try:
        with pytest.raises(tf.errors.DeadlineExceededError) as info:
            trainer.step(1, timeout_s=3)
    finally:
        os.kill(pid, signal.SIGCONT)
    message = info.value.message
    _assert_names_host(message, cluster, 0)
    assert cluster.hosts.describe(1) not in message
    assert "did not finish within 3 s" in message
    cluster.kill(0)                                    # frees the abandoned step
    cluster.restart(0)
    cluster.hosts.reconnect()
    trainer.restore(saved)
    trainer.step(1)
    np.testing.assert_allclose(trainer.checkpoint(), reference(INITIAL, [0, 1]), rtol=1e-6,
                               atol=1e-6)
