"""The two homes of the host-sharding arithmetic agree: the C++ data path
(core/sharding.h, through the worker's RouteTPUEmbeddingArbitraryTensorBatch)
and its Python twin (tf_tpu_emb.sharding).

Random ids of a table are routed over S hosts; each host's packed batch is
decoded (the format engine/routing.h documents) and its local rows mapped back
to global ids with ``sharding.global_rows``.  The hosts' global ids must
be the batch's ids, each host's in the batch's order and disjoint, for
DIV_DEFAULT and MOD, tables smaller than the host count, vocabularies not
divisible by it, and ids near 2^31."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb

from tf_tpu_emb import sharding
from tf_tpu_emb.cluster import routing
from tf_tpu_emb.features import Feature

HEADER_WORDS, OUTPUT_WORDS = 10, 4  # engine/routing.h, namespace packed (version 2)
WEIGHTS, SCALES, IDS64 = 1, 2, 4


def _align8(n):
    return (n + 7) // 8 * 8


def decode(packed):
    """The one output of a packed batch: (form, lengths or None, ids)."""
    data = np.asarray(packed).tobytes()
    header = np.frombuffer(data, np.int64, HEADER_WORDS)
    assert header[4] == 1, header
    form, bags, n, flags = np.frombuffer(data, np.int64, OUTPUT_WORDS, HEADER_WORDS * 8)
    at = (HEADER_WORDS + OUTPUT_WORDS) * 8
    lengths = None
    if form == 0:
        lengths = np.frombuffer(data, np.int32, bags, at)
        at += _align8(bags * 4)
    ids = np.frombuffer(data, np.int64 if flags & IDS64 else np.int32, n, at)
    return int(form), lengths, ids.astype(np.int64)


def route(ids, vocab, num_hosts, strategy, form):
    c = pb.TPUEmbeddingConfiguration(mode=pb.TPUEmbeddingConfiguration.TRAINING,
                                     num_hosts=num_hosts, sharding_strategy=int(strategy))
    t = c.table_descriptor.add(name="t", vocabulary_size=vocab, dimension=2)
    t.optimization_parameters.adagrad.SetInParent()
    t.optimization_parameters.learning_rate.constant = 0.1
    c.feature_descriptor.add(name="f", table_id=0, input_shape=[len(ids)])
    router = routing.Router(c.SerializeToString(), [Feature("f", [len(ids)], vocab, "sum")],
                            num_hosts, form=form)
    try:
        batches, _, _ = router.route([tf.zeros([0], tf.int32)], [tf.constant(ids, tf.int64)],
                                     [tf.zeros([0], tf.float32)], "inference", 0)
        return [decode(b) for b in batches]
    finally:
        router.shutdown()


CASES = [(3, 4), (1, 2), (13, 5), (64, 4), (100_003, 7), (2**31 + 5, 3)]


@pytest.mark.parametrize("strategy", list(sharding.Sharding), ids=lambda s: s.name)
@pytest.mark.parametrize("vocab, num_hosts", CASES)
def test_cpp_routing_and_python_twin_agree(lib, strategy, vocab, num_hosts):
    del lib
    rng = np.random.default_rng(vocab % 1000 + num_hosts)
    ids = rng.integers(0, vocab, 200).astype(np.int64)
    ids[:2] = [0, vocab - 1]
    for form in ("bags", "rows"):
        parts = route(ids, vocab, num_hosts, strategy, form)
        seen = []
        for k, (got_form, lengths, local) in enumerate(parts):
            assert got_form == (0 if form == "bags" else 1)
            rows = sharding.rows_in_shard(vocab, num_hosts, k)
            assert np.all((local >= 0) & (local < rows)), (k, local, rows)
            global_ids = sharding.global_rows(vocab, num_hosts, k, strategy, local)
            if form == "bags":
                # One id a position: host k's ids, in the batch's order.
                assert np.all(lengths == 1)
                mine = np.isin(np.arange(len(ids)), np.flatnonzero(
                    np.isin(ids, global_ids)))
                np.testing.assert_array_equal(global_ids, ids[mine])
            else:
                # Distinct rows in first-use order.
                _, first = np.unique(ids[np.isin(ids, global_ids)], return_index=True)
                np.testing.assert_array_equal(
                    global_ids, ids[np.isin(ids, global_ids)][np.sort(first)])
            seen.append(set(global_ids.tolist()))
        # Every id goes to exactly one host.
        assert set().union(*seen) == set(ids.tolist())
        assert sum(len(s) for s in seen) == len(set(ids.tolist()))
