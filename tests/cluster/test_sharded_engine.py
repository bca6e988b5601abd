"""Host-sharded engines (ConfigureTPUEmbeddingHostShard) and routing, without a cluster.

S host engines run one after another in this process: host k is configured
with the config's num_hosts = S and host_id k, loaded with shard k of the
tables (Load with num_shards=S, shard_id=k), fed the batch routed for host k
(tf_tpu_emb.cluster.routing), sent the full activation gradient, and read
back.  The sum of the hosts' partial activations must equal one single-host
engine's activations, and the reassembled tables and slots its tables.

Tolerances: a table row lives on exactly one host and its gradient
contributions arrive there in the single-host order with the same weights
(w * combiner scale, computed as core/bag.h computes it), so with sum and mean
tables and slots are bit-identical.  sqrtn's sum of squared weights may be
fused (FMA) by the engine's compiler and not by TF's kernel: rtol 1e-6 there.
Activations are sums over a bag whose ids are split between hosts (and, for
mean/sqrtn, scaled per id instead of once per bag): rtol 1e-5 (float32 reassociation of at most a few terms).
"""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from tf_tpu_emb import ops
from tf_tpu_emb.cluster import routing

pytestmark = pytest.mark.system  # child processes, servers or compilers

B, L = 4, 3          # batch, sequence length
OPTIMIZERS = ["stochastic_gradient_descent", "adagrad", "adam", "ftrl"]


def make_config(optimizer, sharding, num_hosts):
    tables = [eu.TableSpec("users", 11, 4, optimizer), eu.TableSpec("items", 7, 3, optimizer)]
    features = [
        eu.FeatureSpec("bag_sparse", 0, [B]),         # weighted COO bags
        eu.FeatureSpec("bag_ragged", 1, [B]),         # weighted ragged bags
        eu.FeatureSpec("dense_2d", 0, [B, 2]),        # high-rank dense, one id a position
        eu.FeatureSpec("seq_sparse", 1, [B, L]),      # sequence (COO [b, s, 0])
        eu.FeatureSpec("seq_ragged", 0, [B, L]),      # sequence (ragged rows, truncated)
        eu.FeatureSpec("bag_3d", 1, [2, 2]),          # high-rank COO bags
    ]
    config = eu.feature_mode_config(tables, features, sharding=sharding)
    config.num_hosts = num_hosts
    return config


def make_inputs(rng, weighted):
    """ArbitraryTensorBatch inputs (the mid-level API's form), one per feature."""
    def maybe(w):
        return w if weighted else None

    sp, sp_w = eu.bags_to_sparse(eu.random_bags(rng, B, 11, weighted=True, max_len=4))
    rg, rg_w = eu.bags_to_ragged(eu.random_bags(rng, B, 7, weighted=True, max_len=4))
    dense = eu.bags_to_dense(eu.random_bags(rng, 2 * B, 11, exactly_one=True), [B, 2])
    seq_bags = eu.random_bags(rng, B * L, 7, exactly_one=True)
    for p in range(0, B * L, 4):
        seq_bags[p] = []  # sequences shorter than L
    seq, seq_w = eu.bags_to_sparse(seq_bags, [B, L])
    seq_sp = (tf.SparseTensor(seq.indices[:, :2], seq.values, [B, L]),
              tf.SparseTensor(seq_w.indices[:, :2], seq_w.values, [B, L]))
    # Ragged sequences, some longer than L (the engine drops the tail).
    lengths = rng.integers(0, L + 2, B)
    rg_seq = tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.integers(0, 11, lengths.sum()), tf.int64), lengths)
    rg_seq_w = tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.uniform(0.25, 2, lengths.sum()), tf.float32), lengths)
    b3, b3_w = eu.bags_to_sparse(eu.random_bags(rng, 4, 7, weighted=True), [2, 2])
    return [
        eu.sparse_to_enqueue(sp, maybe(sp_w)),
        eu.ragged_to_enqueue(rg, maybe(rg_w)),
        eu.dense_to_enqueue(dense),
        eu.sparse_to_enqueue(seq_sp[0], maybe(seq_sp[1]), pad_sequence=True),
        eu.ragged_to_enqueue(rg_seq, maybe(rg_seq_w)),
        eu.sparse_to_enqueue(b3, maybe(b3_w)),
    ]


def router_for(config, combiners):
    features = [routing.FeatureRoute(f.name, f.input_shape,
                                     config.table_descriptor[f.table_id].vocabulary_size,
                                     combiners[f.table_id])
                for f in config.feature_descriptor]
    return routing.Router(features, config.num_hosts,
                          mod=config.sharding_strategy == eu.MOD)


def run_steps(config, state, batches, grads, combiners, host_id=None, router=None):
    """Configures one engine (a host of config.num_hosts when host_id is given),
    loads `state`, runs one training step per batch; returns (activations per
    step, retrieved state)."""
    shard = {} if host_id is None else dict(num_shards=config.num_hosts, shard_id=host_id)
    ops.shutdown_tpu_embedding()
    if host_id is None:
        tf.raw_ops.ConfigureTPUEmbedding(config=config.SerializeToString())
    else:
        ops.configure_tpu_embedding_host_shard(config.SerializeToString(), host_id)
    try:
        for desc in config.table_descriptor:
            eu.load_table(desc, state[desc.name], **shard)
        acts = []
        for batch, grad in zip(batches, grads):
            if router is None:
                args, comb = batch, [combiners[f.table_id] for f in config.feature_descriptor]
            else:
                routed = router.route(*zip(*batch))[host_id]
                args, comb = list(zip(*routed)), router.host_combiners
            ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                [a[0] for a in args], [a[1] for a in args], [a[2] for a in args],
                combiners=comb, mode_override="train")
            acts.append(eu.recv(config))
            ops.send_tpu_embedding_gradients(grad, config.SerializeToString())
        got = {d.name: eu.retrieve_table(d, **shard) for d in config.table_descriptor}
        return acts, got
    finally:
        ops.shutdown_tpu_embedding()


def local_state(config, state, k):
    mod = config.sharding_strategy == eu.MOD
    return {d.name: [s[eu.shard_rows(d.vocabulary_size, config.num_hosts, k, mod)]
                     for s in state[d.name]] for d in config.table_descriptor}


# Every optimizer x combiner x sharding x weighted on 2 hosts; 3 hosts (uneven
# DIV_DEFAULT shards) for each combiner and sharding with Adagrad.
MATRIX = ([(w, s, c, o, 2) for w in (True, False) for s in ("DIV_DEFAULT", "MOD")
           for c in ("sum", "mean", "sqrtn") for o in OPTIMIZERS] +
          [(True, s, c, "adagrad", 3) for s in ("DIV_DEFAULT", "MOD")
           for c in ("sum", "mean", "sqrtn")])


@pytest.mark.parametrize("weighted, sharding, combiner, optimizer, num_hosts", MATRIX)
def test_sharded_step_equals_single_host(engine_released, weighted, sharding, combiner,
                                         optimizer, num_hosts):
    rng = np.random.default_rng(hash((weighted, sharding, combiner, optimizer, num_hosts))
                                % 2**32)
    config = make_config(optimizer, getattr(eu, sharding[:3]), num_hosts)
    combiners = [combiner, "mean" if combiner == "sum" else "sum"]  # per table
    state = {d.name: eu.random_state(rng, d) for d in config.table_descriptor}
    batches = [make_inputs(rng, weighted) for _ in range(2)]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in eu.output_shapes(config)]
             for _ in batches]

    want_acts, want_state = run_steps(config, state, batches, grads, combiners)
    router = router_for(config, combiners)
    got_acts = [[np.zeros(s, np.float32) for s in eu.output_shapes(config)] for _ in batches]
    got_state = {d.name: [np.zeros_like(s) for s in state[d.name]]
                 for d in config.table_descriptor}
    mod = config.sharding_strategy == eu.MOD
    for k in range(num_hosts):
        acts, shard = run_steps(config, local_state(config, state, k), batches, grads,
                                combiners, host_id=k, router=router)
        for step, step_acts in enumerate(acts):
            for o, a in enumerate(step_acts):
                got_acts[step][o] += a
        for d in config.table_descriptor:
            rows = eu.shard_rows(d.vocabulary_size, num_hosts, k, mod)
            for full, part in zip(got_state[d.name], shard[d.name]):
                full[rows] = part
    for step in range(len(batches)):
        for o, f in enumerate(config.feature_descriptor):
            eu.assert_close(got_acts[step][o], want_acts[step][o], rtol=1e-5, atol=1e-6,
                            what="step %d feature %s" % (step, f.name))
    assert_tables(got_state, want_state, exact=combiner != "sqrtn")


def assert_tables(got, want, exact):
    """Tables and slots: bit-identical, or (exact=False) within rtol 1e-6."""
    for name in want:
        for i, (g, w) in enumerate(zip(got[name], want[name])):
            if exact:
                np.testing.assert_array_equal(g, w, err_msg="table %s state %d" % (name, i))
            else:
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7,
                                           err_msg="table %s state %d" % (name, i))


def test_host_engine_holds_only_its_shard(engine_released):
    config = make_config("adagrad", eu.MOD, 3)
    ops.configure_tpu_embedding_host_shard(config.SerializeToString(), 1)
    desc = config.table_descriptor[0]  # vocabulary 11 over 3 hosts: 4, 4, 3 rows
    params, accum = eu.retrieve_table(desc, num_shards=3, shard_id=1)
    assert params.shape == (4, 4) and accum.shape == (4, 4)
    for num_shards, shard_id in [(1, 0), (3, 0), (2, 1)]:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="table 'users': this engine is host 1 of 3 .*num_shards=3, "
                                 "shard_id=1"):
            eu.retrieve_table(desc, num_shards=num_shards, shard_id=shard_id)
    # Local ids beyond the shard are refused (routing sends local rows).
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"outside the table's vocabulary \[0, 4\)"):
        eu.enqueue_arbitrary([eu.dense_to_enqueue(tf.constant([4] * B))] +
                             [eu.dense_to_enqueue(tf.zeros([n], tf.int64))
                              for n in (B, 2 * B, B * L, B * L, 4)], mode="train")


@pytest.mark.parametrize("host_id, num_hosts, match", [
    (2, 2, "host_id 2 is not a host of the config's num_hosts 2"),
    (0, 0, "host_id 0 is not a host of the config's num_hosts 0"),
    (11, 12, "table 'users'.*All embedding shards must be non-empty"),
])
def test_configure_host_rejects(engine_released, host_id, num_hosts, match):
    config = make_config("adagrad", eu.DIV, num_hosts)
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        ops.configure_tpu_embedding_host_shard(config.SerializeToString(), host_id)
    assert not eu.is_initialized()


def test_core_configure_ignores_num_hosts(engine_released):
    """TF's core ConfigureTPUEmbedding keeps meaning one host holding every row."""
    config = make_config("adagrad", eu.DIV, 4)
    tf.raw_ops.ConfigureTPUEmbedding(config=config.SerializeToString())
    params, _ = eu.retrieve_table(config.table_descriptor[0])
    assert params.shape == (11, 4)


@pytest.mark.parametrize("vocab, num_hosts", [(13, 5), (12, 4), (7, 2), (5, 5), (100, 3)])
@pytest.mark.parametrize("mod", [False, True], ids=["div", "mod"])
def test_owner_and_local_follow_the_shard_layout(vocab, num_hosts, mod):
    host, local = routing.owner_and_local(np.arange(vocab), vocab, num_hosts, mod)
    for k in range(num_hosts):
        rows = eu.shard_rows(vocab, num_hosts, k, mod)  # the spec's layout (§2.7)
        np.testing.assert_array_equal(host.numpy()[rows], k)
        np.testing.assert_array_equal(local.numpy()[rows], np.arange(len(rows)))


def test_route_rejects_bad_ids_before_any_host(lib):
    router = routing.Router([routing.FeatureRoute("watched", [2], 10, "mean")], 2, mod=True)
    for ids, match in [([3, 10], r"feature watched: an embedding id is outside .*\[0, 10\)"),
                       ([-1, 2], r"feature watched: an embedding id is outside")]:
        with pytest.raises(tf.errors.InvalidArgumentError, match=match):
            router.route([tf.zeros([0], tf.int32)], [tf.constant(ids, tf.int64)],
                         [tf.zeros([0])])
    with pytest.raises(tf.errors.InvalidArgumentError, match="weight is not finite"):
        router.route([tf.constant([0, 1, 2])], [tf.constant([1, 2], tf.int64)],
                     [tf.constant([1.0, np.nan])])
    with pytest.raises(ValueError, match="feature tiny: a table of vocabulary_size 1 cannot "
                                         "be sharded over 2 hosts"):
        routing.Router([routing.FeatureRoute("tiny", [2], 1, "sum")], 2, mod=False)


def test_route_keeps_positions_and_folds_the_combiner(lib):
    """Two bags [1, 2, 5] (weights 1, 2, 1) and [] over 2 MOD hosts, mean."""
    router = routing.Router([routing.FeatureRoute("f", [2], 6, "mean")], 2, mod=True)
    per_host = router.route([tf.constant([[0, 0], [0, 1], [0, 2]])],
                            [tf.constant([1, 2, 5], tf.int64)], [tf.constant([1., 2., 1.])])
    (s0,), (i0,), (w0,) = per_host[0]
    (s1,), (i1,), (w1,) = per_host[1]
    np.testing.assert_array_equal(s0, [0, 1, 1])  # id 2 -> host 0, local 1
    np.testing.assert_array_equal(i0, [1])
    np.testing.assert_array_equal(w0, np.float32(2) * np.float32(1 / np.float32(4)))
    np.testing.assert_array_equal(s1, [0, 2, 2])  # ids 1, 5 -> host 1, local 0, 2
    np.testing.assert_array_equal(i1, [0, 2])
    np.testing.assert_array_equal(w1, [0.25, 0.25])
    assert router.host_combiners == ["sum"]
