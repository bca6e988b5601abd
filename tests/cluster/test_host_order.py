"""The hosts' parts of one ``tf.function`` step are not chained (issue 13).

TF's automatic control dependencies chain every stateful op without a
resource input in program order, which would run S hosts' Enqueue, Recv and
Send one host after another.  ``tf_tpu_emb.cluster.ordering`` keeps program
order among one host's ops only.  The step's concrete graph is inspected: no
op of one host's engine may have a control input from another host's engine
op, while each host's own ops stay in program order (enqueue before Recv
before Send).  Checked on a real 2-host loopback cluster's training step
(replicas 1 and 2), and on the bare mechanism with and without the mark, so
that the check demonstrably fails on a serial graph.
"""
import re

import numpy as np
import pytest
import tensorflow as tf

from cluster import connected_hosts
import engine_util as eu
import tf_tpu_emb
from tf_tpu_emb import ops
from tf_tpu_emb.cluster import ordering
from sharded_case import B, clustered, make_case, stepper

pytestmark = [pytest.mark.system,
              pytest.mark.skipif(not ordering.enabled(),
                                 reason="this TF has no ACD resource-resolver hook")]


def engine_ops(graph):
    """{op: host} for every engine op of ``graph`` placed on a host task."""
    out = {}
    for op in graph.get_operations():
        m = re.search(r"/task:(\d+)", op.device or "")
        if m and "TPUEmbedding" in op.type:
            out[op] = int(m.group(1))
    return out


def cross_host_edges(graph):
    found = engine_ops(graph)
    return [(c.name, op.name) for op, host in found.items() for c in op.control_inputs
            if c in found and found[c] != host]


def reaches(src, dst):
    """Whether ``dst`` depends on ``src`` through data or control edges."""
    seen, todo = set(), [dst]
    while todo:
        op = todo.pop()
        if op is src:
            return True
        if op in seen:
            continue
        seen.add(op)
        todo.extend(op.control_inputs)
        todo.extend(t.op for t in op.inputs)
    return False


def host_ops(graph, host, kind):
    return [op for op, h in engine_ops(graph).items() if h == host and kind in op.type]


def per_host_order_holds(graph, hosts):
    for k in range(hosts):
        enq, recv, send = (host_ops(graph, k, kind) for kind in ("Enqueue", "Recv", "Send"))
        assert enq and recv and send, "host %d lacks engine ops" % k
        for r in recv:
            assert all(reaches(e, r) for e in enq), "host %d: Recv not after its enqueue" % k
        for s in send:
            assert all(reaches(r, s) for r in recv), "host %d: Send not after its Recv" % k


@pytest.fixture(scope="module")
def hosts():
    with connected_hosts(2, replicas_per_host=2) as h:
        yield h


@pytest.mark.parametrize("replicas", [1, 2])
def test_training_step_graph_has_no_cross_host_chain(hosts, replicas):
    initial, per_replica, cots = make_case(5, replicas)
    embs = [clustered(initial, "adagrad", hosts, "MOD", w, replicas) for w in range(replicas)]
    try:
        step = stepper(embs[0])
        graph = step.get_concrete_function(*per_replica[0][0], cots[0][0]).graph
        assert cross_host_edges(graph) == []
        per_host_order_holds(graph, 2)
        if replicas == 1:  # and the parallel step still trains: a real step runs
            acts = step(*per_replica[0][0], cots[0][0])
            assert acts["bag"].shape[0] == B
            assert np.isfinite(acts["bag"].numpy()).all()
    finally:
        for e in reversed(embs):
            e.shutdown()


def test_pipelined_step_looks_ahead_past_the_previous_send(hosts):
    """With pipelining a host's Recv of step 2 is not ordered after its Send
    of step 1 (ordering.py: the engine looks one batch ahead), while its
    Recvs and its Sends each keep program order; without it, Recv 2 follows
    Send 1 (the check demonstrably fails on that graph)."""
    from sharded_case import OPTIMIZERS, feature_config, multi_stepper
    initial, per_replica, cots = make_case(6, 1)
    steps = [(per_replica[s][0][0], per_replica[s][0][1], cots[s][0]) for s in range(2)]
    for pipelined in (True, False):
        emb = tf_tpu_emb.TPUEmbedding(feature_config(initial, B), OPTIMIZERS["adagrad"](),
                                      cluster=hosts, pipeline_execution_with_tensor_core=pipelined)
        try:
            call = multi_stepper(emb)
            graph = call.get_concrete_function(steps).graph
            assert cross_host_edges(graph) == []
            for k in range(2):
                recv, send = (sorted(host_ops(graph, k, kind), key=lambda op: op._id)  # pylint: disable=protected-access
                              for kind in ("Recv", "Send"))
                assert len(recv) == len(send) == 2
                assert reaches(recv[0], recv[1]) and reaches(send[0], send[1])
                assert reaches(recv[0], send[0]) and reaches(recv[1], send[1])
                assert reaches(send[0], recv[1]) != pipelined, \
                    "host %d: pipelined=%s but Recv 2 %s Send 1" % (
                        k, pipelined, "follows" if pipelined else "does not follow")
            if pipelined:  # and the step runs
                acts = call(steps)
                assert np.isfinite(acts[1]["bag"].numpy()).all()
        finally:
            emb.shutdown()


def _two_host_program(mark):
    """A step-shaped program over two hosts' engine ops (traced, not run)."""
    config = eu.serialize(eu.table_mode_config(
        [eu.TableSpec("t", vocab=8, dim=4, num_features=1)], batch_size=4))

    @tf.function
    def program(ids):
        recvs = []
        for k in range(2):
            with tf.device("/job:host/task:%d/device:CPU:0" % k):
                e = ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                    [tf.zeros([0], tf.int64)], [ids], [tf.zeros([0])], device_ordinal=0,
                    combiners=["sum"])
                if mark:
                    ordering.per_host(e, k)
        for k in range(2):
            with tf.device("/job:host/task:%d/device:CPU:0" % k):
                r = ops.recv_tpu_embedding_activations(num_outputs=1, config=config)
                recvs.append(ordering.per_host(r, k) if mark else r)
        total = recvs[0][0] + recvs[1][0]
        for k in range(2):
            with tf.device("/job:host/task:%d/device:CPU:0" % k):
                s = ops.send_tpu_embedding_gradients([total], config)
                if mark:
                    ordering.per_host(s, k)
        return total
    return program.get_concrete_function(tf.TensorSpec([4], tf.int64)).graph


def test_mark_removes_the_cross_host_chain():
    tf_tpu_emb.load_library()
    serial = _two_host_program(mark=False)
    assert cross_host_edges(serial), "TF no longer chains unmarked engine ops: test is moot"
    parallel = _two_host_program(mark=True)
    assert cross_host_edges(parallel) == []
    per_host_order_holds(parallel, 2)
