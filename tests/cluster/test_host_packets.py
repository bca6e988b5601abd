"""The embedding hosts refuse a bad routed packet and change nothing
(engine/routing.h, "Packet integrity"), with real ``python -m
tf_tpu_emb.server`` hosts on 127.0.0.1 and a model trained through them.

One test per case: a corrupt packet (one bit flipped: DataLoss), a truncated
one (DataLoss), a replayed one (a packet the host already took:
FailedPrecondition naming the sequence) and one of another session (routed
by another model's router: FailedPrecondition naming the sessions).  Each
error names the host; the model's table and its Adagrad slot are bit-equal
before and after, and a training step after the refusal gives what one
local engine gives from the same tables (nothing was queued on any host).
"""
import numpy as np
import pytest
import tensorflow as tf

from cluster import LoopbackCluster
import tf_tpu_emb
from tf_tpu_emb import ops
from tf_tpu_emb.cluster import routing
from tf_tpu_emb.cluster import sharded

pytestmark = pytest.mark.system  # child processes, servers or compilers

E = tf.tpu.experimental.embedding
S = 2
B, VOCAB, DIM = 4, 10, 3


def _initial(shape, dtype=tf.float32):
    return tf.constant(np.arange(np.prod(shape)).reshape(shape) * 0.01 + 0.1, dtype)


def make(hosts=None):
    """The model (one Adagrad table, ids of every host's shard in a batch)."""
    table = E.TableConfig(VOCAB, DIM, name="t", combiner="sum", initializer=_initial)
    kwargs = {} if hosts is None else {"cluster": hosts}
    emb = tf_tpu_emb.TPUEmbedding({"f": E.FeatureConfig(table)}, E.Adagrad(0.5), **kwargs)
    emb.build(B)
    return emb


def ids(n):
    return tf.constant(np.random.default_rng(n).integers(0, VOCAB, B), tf.int64)


def step(emb, n):
    """Training step n, eagerly (the gradient is the activation + n)."""
    emb.enqueue({"f": ids(n)})
    act = emb.dequeue()["f"]
    emb.apply_gradients({"f": act + float(n)})


def state(emb):
    """The table and its accumulator, as numpy arrays."""
    return [x.numpy() for x in emb.retrieve_table(emb.tables[0])]


def reference_step(start, n):
    """The table and accumulator after step n from `start`, on one local engine."""
    emb = make()
    emb.load_table(emb.tables[0], start)
    step(emb, n)
    out = state(emb)
    emb.shutdown()
    return out


@pytest.fixture(scope="module")
def cluster():
    with LoopbackCluster(S) as c:
        c.hosts.connect()
        yield c


@pytest.fixture
def emb(cluster):
    emb = make(cluster.hosts)
    yield emb
    emb.shutdown()


def backend(emb):
    return emb._backend  # pylint: disable=protected-access  (the test drives the hosts)


def fresh_packets(emb, n, router=None):
    """Per host a valid packed batch no host has taken (routed eagerly by the
    model's router, or `router`), for replica 0."""
    router = router or backend(emb).router
    batches, _, _ = router.route([tf.zeros([0], tf.int32)], [ids(n)], [tf.zeros([0])],
                                 "train", 0)
    return [b.numpy() for b in batches]


def longest(packets):
    """The host whose packet holds ids (its arrays after the 112 bytes of
    the header and the output's words)."""
    k = int(np.argmax([len(p) for p in packets]))
    assert len(packets[k]) > 112
    return k


def feed(emb, k, packet):
    """Host k's enqueue of `packet` (its own executor: the error is the op's)."""
    hosts = backend(emb).hosts
    with hosts.synchronous(), tf.device(hosts.device(k, 0)):
        ops.enqueue_tpu_embedding_routed_batch(tf.constant(packet, tf.uint8),
                                               engine=backend(emb).engine)


def refused(emb, k, packet, error, match):
    """Feeds host k `packet`: refused with `error` matching `match`, naming
    the host; tables and slots bit-equal; then a step trains as one local
    engine does from the same tables (no host queued anything)."""
    before = state(emb)
    with pytest.raises(error, match=match) as failed:
        feed(emb, k, packet)
    assert "EnqueueTPUEmbeddingRoutedBatch: host %d of %d" % (k, S) in failed.value.message
    after = state(emb)
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)
    step(emb, 7)
    expected = reference_step(before, 7)
    for got, want in zip(state(emb), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    return failed.value.message


def test_a_corrupt_packet_is_refused_and_changes_nothing(emb):
    step(emb, 1)
    packets = fresh_packets(emb, 2)
    k = longest(packets)
    bad = packets[k].copy()
    bad[-1] ^= 0x10  # one bit of its last array (an id)
    message = refused(emb, k, bad, tf.errors.DataLossError, "is corrupt: its checksum is")
    assert "routed packet #" in message


def test_a_truncated_packet_is_refused_and_changes_nothing(emb):
    step(emb, 1)
    packets = fresh_packets(emb, 3)
    k = longest(packets)
    refused(emb, k, packets[k][:-4], tf.errors.DataLossError,
            r"is truncated: its header lays out %d bytes" % len(packets[k]))
    refused(emb, k, packets[k][:40], tf.errors.DataLossError,
            "fewer than its 80-byte header: truncated")


def test_a_replayed_packet_is_refused_and_changes_nothing(emb, monkeypatch):
    """A packet the host took in a step, fed to it again after that step."""
    taken = []
    enqueue = ops.enqueue_tpu_embedding_routed_batch

    def recording(batch, **kwargs):
        taken.append(batch.numpy())
        return enqueue(batch, **kwargs)

    monkeypatch.setattr(sharded.ops, "enqueue_tpu_embedding_routed_batch", recording)
    step(emb, 1)
    monkeypatch.undo()
    assert len(taken) == S
    sequence = int(np.frombuffer(taken[0][:80].tobytes(), np.int64)[7])
    message = refused(emb, 0, taken[0], tf.errors.FailedPreconditionError,
                      r"replica 0: routed batch #%d is a replayed packet" % sequence)
    assert "has already taken routed batch #%d" % sequence in message


def test_a_packet_of_another_session_is_refused_and_changes_nothing(emb):
    """A packet routed for the same tables by another model's router (its own
    session), not yet seen by the host."""
    step(emb, 1)
    own = backend(emb).router
    other = routing.Router(own.config, own.features, S, session=routing.new_session())
    try:
        packets = fresh_packets(emb, 4, router=other)
    finally:
        other.shutdown()
    message = refused(emb, 1, packets[1], tf.errors.FailedPreconditionError,
                      "host 1 of 2 belongs to session %d but the routed packet #1 "
                      r"\(\d+ bytes\) was routed for session %d"
                      % (backend(emb).session % 2**64, other.session % 2**64))
    assert "another model or trainer" in message
