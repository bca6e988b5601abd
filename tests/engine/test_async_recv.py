"""RecvTPUEmbeddingActivations waits for its enqueue, as on a TPU (README
"Waits"): an asynchronous kernel resumed by the enqueue for its replica,
bounded by TF_TPU_EMB_STEP_TIMEOUT_SECONDS (DeadlineExceeded naming the
replica) and ended at once by ShutdownTPUEmbedding (Cancelled).

The enqueue's ids go through a stateless matmul in the graph tests, so that
the Recv (which has no inputs) usually starts before the batch exists: the
order the old synchronous Recv failed on ("nothing has been enqueued").
"""
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
import harness  # tests/common: the one way to start a child process
from engine_util import FeatureSpec, TableSpec
from tf_tpu_emb import ops as tte_ops

B = 4
VOCAB = 10


def _config():
    return eu.feature_mode_config([TableSpec("t", VOCAB, 3)], [FeatureSpec("f", 0, [B])])


# (enqueue, recv) under TF's core names and under our prefixed names
OP_NAMES = {
    "core": (tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch,
             tf.raw_ops.RecvTPUEmbeddingActivations),
    "prefixed": (tte_ops.enqueue_tpu_embedding_arbitrary_tensor_batch,
                 tte_ops.recv_tpu_embedding_activations),
}


def _slow(ids):
    """`ids`, after a stateless matmul (no ordering edge, takes a while)."""
    m = tf.ones([300, 300])
    for _ in range(4):
        m = tf.matmul(m, m) / 300.0
    return ids + tf.cast(tf.reduce_sum(m) * 0.0, ids.dtype)


def _enqueue(names, ids, slow=False):
    enqueue, _ = OP_NAMES[names]
    ids = tf.convert_to_tensor(ids, tf.int64)
    return enqueue(sample_indices_or_row_splits=[eu.empty(tf.int32)],
                   embedding_indices=[_slow(ids) if slow else ids],
                   aggregation_weights=[eu.empty(tf.float32)],
                   device_ordinal=-1, combiners=["sum"], mode_override="inference")


def _recv(names, config):
    _, recv = OP_NAMES[names]
    return recv(num_outputs=1, config=eu.serialize(config))[0]


def _want(table, ids):
    return table[np.asarray(ids)]


@pytest.fixture
def loaded():
    config = _config()
    with eu.engine(config):
        table = eu.load_random_tables(config, 0)["t"][0]
        yield config, table


@pytest.mark.parametrize("names", sorted(OP_NAMES))
def test_eager_recv_waits_for_an_enqueue_from_another_thread(loaded, names):
    config, table = loaded
    got = {}

    def receive():
        try:
            got["out"] = _recv(names, config).numpy()
        except tf.errors.OpError as e:  # reported below
            got["error"] = e

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    time.sleep(0.2)  # the Recv is (most likely) waiting by now; either order must work
    _enqueue(names, [1, 2, 3, 4])
    thread.join(60)
    assert not thread.is_alive() and "error" not in got, got
    np.testing.assert_array_equal(got["out"], _want(table, [1, 2, 3, 4]))


@pytest.mark.parametrize("names,recv_first", [("core", False), ("core", True),
                                               ("prefixed", False)],
                         ids=["core-enqueue_first", "core-recv_first", "prefixed-enqueue_first"])
def test_tf_function_without_control_dependencies(loaded, names, recv_first):
    """Enqueue and Recv in one tf.function, no tf.control_dependencies.  TF's
    automatic control dependencies leave core-named enqueues unordered, so
    the Recv may run first and must wait; our prefixed ops are ordered in
    program order (a prefixed Recv written before its enqueue would wait for
    it in vain), so only the core names are traced Recv-first."""
    config, table = loaded

    @tf.function
    def step(ids):
        if recv_first:
            out = _recv(names, config)
            _enqueue(names, ids, slow=True)
        else:
            _enqueue(names, ids, slow=True)
            out = _recv(names, config)
        return out

    for k in range(5):
        ids = [(k + j) % VOCAB for j in range(B)]
        np.testing.assert_array_equal(step(tf.constant(ids, tf.int64)).numpy(), _want(table, ids))


@pytest.mark.parametrize("names", sorted(OP_NAMES))
def test_tf1_graph_without_control_dependencies(loaded, names):
    """One Session.run fetches the Recv and the (slow) enqueue: no edge orders them."""
    config, table = loaded
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [B])
        out = _recv(names, config)
        enqueue = _enqueue(names, ids, slow=True)
    with tf.compat.v1.Session(graph=graph) as sess:
        for k in range(5):
            feed = [(3 * k + j) % VOCAB for j in range(B)]
            got, _ = sess.run([out, enqueue], {ids: feed})
            np.testing.assert_array_equal(got, _want(table, feed))


def test_waiting_recvs_of_one_replica_take_one_batch_each(loaded):
    """Two Recvs waiting on replica 0, then two enqueues: each Recv gets one
    of the batches (no batch twice, none lost)."""
    config, table = loaded
    got, threads = [], []
    for _ in range(2):
        threads.append(threading.Thread(
            target=lambda: got.append(_recv("core", config).numpy()), daemon=True))
        threads[-1].start()
    time.sleep(0.2)
    batches = [[1, 1, 1, 1], [2, 2, 2, 2]]
    for ids in batches:
        _enqueue("core", ids)
    for t in threads:
        t.join(60)
    assert len(got) == 2, got
    want = sorted(_want(table, ids).tolist() for ids in batches)
    assert sorted(g.tolist() for g in got) == want
    eu.assert_nothing_enqueued(config)


def test_recv_with_nothing_enqueued_times_out_naming_the_replica(loaded):
    config, table = loaded
    with pytest.raises(tf.errors.DeadlineExceededError) as e:
        _recv("core", config)
    assert ("RecvTPUEmbeddingActivations on replica 0 waited for its batch, but nothing was "
            "enqueued for replica 0" in e.value.message), e.value.message
    assert "timed out after 1 s; TF_TPU_EMB_STEP_TIMEOUT_SECONDS sets the limit" in \
        e.value.message, e.value.message
    # the engine is unchanged: the next enqueue is the next Recv's batch
    _enqueue("core", [5, 6, 7, 8])
    np.testing.assert_array_equal(_recv("core", config).numpy(), _want(table, [5, 6, 7, 8]))


def test_shutdown_cancels_a_waiting_recv_at_once():
    """Timeout 60 s; shutdown after the Recv waits: it ends with Cancelled well
    before the timeout (< 30 s, a loose bound), and the process configures
    again."""
    config = _config()
    outcome = {}
    with eu.recv_timeout(60), eu.engine(config):
        def receive():
            try:
                _recv("core", config)
                outcome["ok"] = True
            except tf.errors.OpError as e:
                outcome["error"] = e
        thread = threading.Thread(target=receive, daemon=True)
        start = time.monotonic()
        thread.start()
        time.sleep(0.5)
        eu.shutdown()
        thread.join(60)
        elapsed = time.monotonic() - start
    assert not thread.is_alive()
    assert elapsed < 30, elapsed
    assert isinstance(outcome.get("error"), tf.errors.CancelledError), outcome
    assert "ShutdownTPUEmbedding ran while this op waited" in outcome["error"].message
    assert "nothing was enqueued for replica 0" in outcome["error"].message
    with eu.engine(config):
        table = eu.load_random_tables(config, 1)["t"][0]
        _enqueue("core", [0, 1, 2, 3])
        np.testing.assert_array_equal(_recv("core", config).numpy(), _want(table, [0, 1, 2, 3]))


@pytest.mark.system
def test_several_replicas_under_mirrored_strategy():
    """Core-named enqueue + Recv per replica in strategy.run without control
    dependencies; a Recv waiting on replica 1 is not woken by replica 0's
    enqueue (its own child: logical CPU devices)."""
    proc = harness.run_python([harness.script(__file__, "async_recv_mirrored_script.py")],
                              timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
