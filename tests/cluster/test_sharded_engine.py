"""The sharded data path without a cluster: S host-shard engines and a worker router.

The S hosts' engines are configured in this process under their own names
(``ConfigureTPUEmbeddingHostShard(config, k, engine="host<k>")``), loaded with
shard k of the tables (the spec's layout, ``engine_util.shard_rows``), and a
worker router (``tf_tpu_emb.cluster.routing.Router``, the ops of
``engine/routing.h``) sits between them: route the batch, enqueue each host's
packed part, Recv every host's part, combine, split the gradients, send each
host its part.  The combined activations must equal one engine's, and the
reassembled tables and slots its tables, for every optimizer, combiner,
sharding, weighted or not, one to four hosts (a table smaller than the host
count), and each form the router can send a table in.

Tolerances (engine/routing.h says why): tables and slots bit-identical (one
replica: every row's gradient contributions reach its host in the single
engine's order, or summed by the worker in that order), except rtol 1e-6 for
sqrtn (the engine's sum of squared weights may be fused (FMA) where the
reference's is not); activations bit-identical in the rows form, rtol 1e-5
in the bags form on several hosts (a bag is the sum of its hosts' partial
sums), and after a sqrtn step as the tables are.
"""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from tf_tpu_emb import ops
from tf_tpu_emb.cluster import routing
from tf_tpu_emb.features import Feature

pytestmark = pytest.mark.system  # child processes, servers or compilers

B, L = 4, 3          # batch, sequence length
OPTIMIZERS = ["stochastic_gradient_descent", "adagrad", "adam", "ftrl"]


def make_config(optimizer, sharding, num_hosts, vocab=(11, 7)):
    tables = [eu.TableSpec("users", vocab[0], 4, optimizer),
              eu.TableSpec("items", vocab[1], 3, optimizer)]
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


def make_inputs(rng, weighted, vocab=(11, 7)):
    """ArbitraryTensorBatch inputs (the mid-level API's form), one per feature."""
    def maybe(w):
        return w if weighted else None

    v0, v1 = vocab
    sp, sp_w = eu.bags_to_sparse(eu.random_bags(rng, B, v0, weighted=True, max_len=4))
    rg, rg_w = eu.bags_to_ragged(eu.random_bags(rng, B, v1, weighted=True, max_len=4))
    dense = eu.bags_to_dense(eu.random_bags(rng, 2 * B, v0, exactly_one=True), [B, 2])
    seq_bags = eu.random_bags(rng, B * L, v1, exactly_one=True)
    for p in range(0, B * L, 4):
        seq_bags[p] = []  # sequences shorter than L
    seq, seq_w = eu.bags_to_sparse(seq_bags, [B, L])
    seq_sp = (tf.SparseTensor(seq.indices[:, :2], seq.values, [B, L]),
              tf.SparseTensor(seq_w.indices[:, :2], seq_w.values, [B, L]))
    # Ragged sequences, some longer than L (the engine drops the tail).
    lengths = rng.integers(0, L + 2, B)
    rg_seq = tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.integers(0, v0, lengths.sum()), tf.int64), lengths)
    rg_seq_w = tf.RaggedTensor.from_row_lengths(
        tf.constant(rng.uniform(0.25, 2, lengths.sum()), tf.float32), lengths)
    b3, b3_w = eu.bags_to_sparse(eu.random_bags(rng, 4, v1, weighted=True), [2, 2])
    return [
        eu.sparse_to_enqueue(sp, maybe(sp_w)),
        eu.ragged_to_enqueue(rg, maybe(rg_w)),
        eu.dense_to_enqueue(dense),
        eu.sparse_to_enqueue(seq_sp[0], maybe(seq_sp[1]), pad_sequence=True),
        eu.ragged_to_enqueue(rg_seq, maybe(rg_seq_w)),
        eu.sparse_to_enqueue(b3, maybe(b3_w)),
    ]


def make_router(config, combiners, form="auto"):
    features = [Feature(f.name, f.input_shape,
                        config.table_descriptor[f.table_id].vocabulary_size,
                        combiners[f.table_id])
                for f in config.feature_descriptor]
    return routing.Router(config.SerializeToString(), features, config.num_hosts, form=form)


def one_engine(config, state, batches, grads, combiners):
    """One engine holding every table whole: activations per step, tables."""
    eu.shutdown()
    tf.raw_ops.ConfigureTPUEmbedding(config=config.SerializeToString())
    try:
        for desc in config.table_descriptor:
            eu.load_table(desc, state[desc.name])
        acts = []
        for batch, grad in zip(batches, grads):
            ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                *[list(x) for x in zip(*batch)],
                combiners=[combiners[f.table_id] for f in config.feature_descriptor],
                mode_override="train")
            acts.append(list(eu.recv(config)))
            ops.send_tpu_embedding_gradients(grad, config.SerializeToString())
        return acts, {d.name: eu.retrieve_table(d) for d in config.table_descriptor}
    finally:
        eu.shutdown()


class Hosts:
    """The S host-shard engines of `config` in this process (a context manager)."""

    def __init__(self, config, state):
        self.config, self.num_hosts = config, config.num_hosts
        self.names = ["host%d" % k for k in range(self.num_hosts)]
        self.mod = config.sharding_strategy == eu.MOD
        for k, name in enumerate(self.names):
            ops.configure_tpu_embedding_host_shard(config.SerializeToString(), k, engine=name)
            for d in config.table_descriptor:
                rows = eu.shard_rows(d.vocabulary_size, self.num_hosts, k, self.mod)
                eu.load_table(d, [s[rows] for s in state[d.name]], num_shards=self.num_hosts,
                              shard_id=k, engine=name)

    def step(self, router, batch, grad):
        """One training step through the router; the combined activations."""
        host_batches, _, _ = router.route(*[list(x) for x in zip(*batch)], "train", 0)
        for name, part in zip(self.names, host_batches):
            ops.enqueue_tpu_embedding_routed_batch(part, engine=name)
        parts = [ops.recv_tpu_embedding_routed_activations(engine=name) for name in self.names]
        acts = router.combine(parts, 0)
        for name, part in zip(self.names, router.split(grad, [], 0)):
            ops.send_tpu_embedding_routed_gradients(part, engine=name)
        return [a.numpy() for a in acts]

    def tables(self):
        """Every table and slot, reassembled from the hosts' shards."""
        out = {}
        for d in self.config.table_descriptor:
            full = None
            for k, name in enumerate(self.names):
                shard = eu.retrieve_table(d, num_shards=self.num_hosts, shard_id=k, engine=name)
                if full is None:
                    full = [np.zeros((d.vocabulary_size, d.dimension), np.float32)
                            for _ in shard]
                rows = eu.shard_rows(d.vocabulary_size, self.num_hosts, k, self.mod)
                for f, s in zip(full, shard):
                    f[rows] = s
            out[d.name] = full
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for name in self.names:
            ops.shutdown_tpu_embedding(engine=name)


def run_case(seed, weighted, sharding, combiner, optimizer, num_hosts, form, vocab=(11, 7)):
    rng = np.random.default_rng(seed)
    config = make_config(optimizer, getattr(eu, sharding[:3]), num_hosts, vocab)
    combiners = [combiner, "mean" if combiner == "sum" else "sum"]  # per table
    state = {d.name: eu.random_state(rng, d) for d in config.table_descriptor}
    batches = [make_inputs(rng, weighted, vocab) for _ in range(2)]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in eu.output_shapes(config)]
             for _ in batches]
    want_acts, want_state = one_engine(config, state, batches, grads, combiners)
    router = make_router(config, combiners, form)
    try:
        with Hosts(config, state) as hosts:
            got_acts = [hosts.step(router, b, g) for b, g in zip(batches, grads)]
            got_state = hosts.tables()
    finally:
        router.shutdown()
    for step in range(len(batches)):
        for o, f in enumerate(config.feature_descriptor):
            what = "seed %d: step %d feature %s" % (seed, step, f.name)
            # Bit for bit where the README promises it: a table sent as rows
            # (the worker combines the rows as one engine does); the other forms
            # sum a bag's partial products on the host, in an order that may
            # differ in the last bit (seen: sqrtn, host_filter, one host).
            # (After a sqrtn step the tables may differ in the last bit.)
            if form == "rows" and (step == 0 or combiner != "sqrtn"):
                np.testing.assert_array_equal(got_acts[step][o], want_acts[step][o], what)
            else:
                eu.assert_close(got_acts[step][o], want_acts[step][o], rtol=1e-5, atol=1e-6,
                                what=what)
    assert_tables(got_state, want_state, exact=combiner != "sqrtn", seed=seed)


def assert_tables(got, want, exact, seed):
    """Tables and slots: bit-identical, or (exact=False) within rtol 1e-6."""
    for name in want:
        for i, (g, w) in enumerate(zip(got[name], want[name])):
            what = "seed %d: table %s state %d" % (seed, name, i)
            if exact:
                np.testing.assert_array_equal(g, w, err_msg=what)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, err_msg=what)


# Every optimizer x combiner x sharding x weighted on 2 hosts in the bags and
# rows forms; 1 and 3 hosts (uneven DIV_DEFAULT shards), auto and the host
# filter, with Adagrad.
MATRIX = ([(w, s, c, o, 2, f) for w in (True, False) for s in ("DIV_DEFAULT", "MOD")
           for c in ("sum", "mean", "sqrtn") for o in OPTIMIZERS for f in ("bags", "rows")] +
          [(True, s, c, "adagrad", h, f) for s in ("DIV_DEFAULT", "MOD")
           for c in ("sum", "mean", "sqrtn") for h in (1, 3) for f in ("auto", "host_filter")])


@pytest.mark.parametrize("weighted, sharding, combiner, optimizer, num_hosts, form", MATRIX)
def test_sharded_step_equals_one_engine(engine_released, weighted, sharding, combiner,
                                        optimizer, num_hosts, form):
    # Seeded from the case (eu.stable_seed: the same in every run); every
    # assertion message of run_case names the seed.
    run_case(eu.stable_seed(weighted, sharding, combiner, optimizer, num_hosts, form),
             weighted, sharding, combiner, optimizer, num_hosts, form)


@pytest.mark.parametrize("sharding", ["DIV_DEFAULT", "MOD"])
@pytest.mark.parametrize("form", ["bags", "rows", "host_filter"])
def test_tables_smaller_than_the_host_count(engine_released, sharding, form):
    """Tables of 3 and 2 rows over 4 hosts: the last hosts hold empty shards
    (TF's layout) and get nothing to look up or update."""
    run_case(5, True, sharding, "mean", "adagrad", 4, form, vocab=(3, 2))


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


def test_empty_shard_loads_and_retrieves_zero_rows(engine_released):
    """Host 3 of 4 of a 3-row table holds no row: [0, dim] in, [0, dim] out."""
    config = make_config("adagrad", eu.DIV, 4, vocab=(3, 2))
    ops.configure_tpu_embedding_host_shard(config.SerializeToString(), 3)
    desc = config.table_descriptor[0]
    eu.load_table(desc, [np.zeros((0, 4), np.float32)] * 2, num_shards=4, shard_id=3)
    params, accum = eu.retrieve_table(desc, num_shards=4, shard_id=3)
    assert params.shape == (0, 4) and accum.shape == (0, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"should be \[0,4\]"):
        eu.load_table(desc, [np.zeros((1, 4), np.float32)] * 2, num_shards=4, shard_id=3)


@pytest.mark.parametrize("host_id, num_hosts, match", [
    (2, 2, "host_id 2 is not a host of the config's num_hosts 2"),
    (0, 0, "host_id 0 is not a host of the config's num_hosts 0"),
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


def _tiny(num_hosts=2):
    """One 10-row mean table over `num_hosts` hosts, one feature of 2 bags."""
    config = eu.feature_mode_config([eu.TableSpec("t", 10, 2, "adagrad")],
                                    [eu.FeatureSpec("watched", 0, [2])], sharding=eu.MOD)
    config.num_hosts = num_hosts
    return config


def test_route_refuses_bad_input_before_any_host(engine_released):
    """A bad id or weight fails the worker's route, naming the feature, and
    no host gets anything: the next valid step goes through (its sequence is
    the hosts' next batch)."""
    config = _tiny()
    state = {"t": eu.random_state(np.random.default_rng(1), config.table_descriptor[0])}
    router = make_router(config, ["mean"])
    try:
        with Hosts(config, state) as hosts:
            for ids, weights, match in [
                    ([3, 10], [], r"input 0 \(feature 'watched', table 't'\): embedding id 10 "
                                  r"at index 1 is outside"),
                    ([-1, 2], [], "embedding id -1"),
                    ([1, 2], [1.0, np.nan], "feature 'watched'.*weight at index 1 is not finite")]:
                with pytest.raises(tf.errors.InvalidArgumentError, match=match):
                    router.route([tf.constant([0, 1, 2], tf.int32)], [tf.constant(ids, tf.int64)],
                                 [tf.constant(weights, tf.float32)], "train", 0)
            batch = [(tf.constant([0, 1, 2], tf.int32), tf.constant([3, 4], tf.int64),
                      tf.zeros([0], tf.float32))]
            acts = hosts.step(router, batch, [np.ones([2, 2], np.float32)])
            np.testing.assert_array_equal(acts[0], state["t"][0][[3, 4]])
    finally:
        router.shutdown()


def test_the_hosts_and_the_worker_agree_on_the_batch(engine_released):
    """Every tensor of a step carries its batch's sequence: hosts answering
    different batches, or gradients for another batch, are refused (the
    latter fails the step on that host, as an invalid Send does)."""
    config = _tiny()
    state = {"t": eu.random_state(np.random.default_rng(2), config.table_descriptor[0])}
    router = make_router(config, ["sum"])
    inputs = ([tf.zeros([0], tf.int32)], [tf.constant([1, 2], tf.int64)], [tf.zeros([0])])
    try:
        with Hosts(config, state) as hosts:
            first, _, _ = router.route(*inputs, "train", 0)
            second, _, _ = router.route(*inputs, "train", 0)
            ops.enqueue_tpu_embedding_routed_batch(first[0], engine="host0")
            ops.enqueue_tpu_embedding_routed_batch(second[1], engine="host1")  # host 1 lost one
            parts = [ops.recv_tpu_embedding_routed_activations(engine=name)
                     for name in hosts.names]
            with pytest.raises(tf.errors.FailedPreconditionError,
                               match="the hosts answered different routed batches"):
                router.combine(parts, 0)
            acts = router.combine([parts[0], parts[0]], 0)  # host 0's answer twice: batch 1
            assert acts[0].shape == (2, 2)
            grads = router.split([tf.ones([2, 2])], [], 0)
            ops.send_tpu_embedding_routed_gradients(grads[0], engine="host0")
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=r"the gradients answer routed batch #1 but this host's "
                                     r"in-flight batch is #2"):
                ops.send_tpu_embedding_routed_gradients(grads[1], engine="host1")
    finally:
        router.shutdown()


def test_pipelined_host_looks_one_batch_ahead(engine_released):
    """With pipelining a host's engine may look up the next batch before the
    in-flight one is sent (engine/engine.h ``lookahead_``): that lookup does
    not see the in-flight step's update, the one after it waits for that
    step's Send and then sees its update, and the tables end as one plain
    engine's after the same updates (the gradients are fixed)."""
    import threading
    rng = np.random.default_rng(7)
    config = _tiny()
    config.pipeline_execution_with_tensor_core = True
    state = {"t": eu.random_state(rng, config.table_descriptor[0])}
    ids = [rng.integers(0, 10, 2) for _ in range(3)]
    grads = [rng.standard_normal([2, 2]).astype(np.float32) for _ in range(3)]

    def inputs(s):
        return ([tf.zeros([0], tf.int32)], [tf.constant(ids[s], tf.int64)], [tf.zeros([0])])

    # The reference: one plain engine; step 2's lookup after update 0 only.
    plain = _tiny()
    plain_batches = [[(tf.zeros([0], tf.int32), tf.constant(i, tf.int64), tf.zeros([0]))]
                     for i in ids]
    plain_grads = [[g] for g in grads]
    want0, _ = one_engine(plain, state, plain_batches[:1], plain_grads[:1], ["mean"])
    want2, _ = one_engine(plain, state, [plain_batches[0], plain_batches[2]],
                          [plain_grads[0], plain_grads[2]], ["mean"])
    _, want_tables = one_engine(plain, state, plain_batches, plain_grads, ["mean"])

    router = make_router(config, ["mean"])
    try:
        with Hosts(config, state) as hosts:
            for s in range(3):
                for name, part in zip(hosts.names, router.route(*inputs(s), "train", 0)[0]):
                    ops.enqueue_tpu_embedding_routed_batch(part, engine=name)

            def recv():
                return [ops.recv_tpu_embedding_routed_activations(engine=n) for n in hosts.names]

            def send(s):
                for name, part in zip(hosts.names, router.split([tf.constant(grads[s])], [], 0)):
                    ops.send_tpu_embedding_routed_gradients(part, engine=name)

            parts0 = recv()
            parts1 = recv()  # before step 0's Send: looked up ahead
            third = {}
            waiter = threading.Thread(target=lambda: third.setdefault("parts", recv()))
            waiter.start()
            waiter.join(1.0)
            assert waiter.is_alive(), "a second lookup ahead did not wait for the Send"
            acts0 = router.combine(parts0, 0)
            send(0)
            waiter.join(30)
            assert not waiter.is_alive()
            acts1 = router.combine(parts1, 0)
            send(1)
            acts2 = router.combine(third["parts"], 0)
            send(2)
            got_tables = hosts.tables()
    finally:
        router.shutdown()
    eu.assert_close(acts0[0].numpy(), want0[0][0], rtol=1e-6, atol=1e-7, what="step 0")
    # Step 1 on the initial tables (one id a bag): update 0 not seen.
    np.testing.assert_array_equal(acts1[0].numpy(), state["t"][0][ids[1]], "step 1")
    eu.assert_close(acts2[0].numpy(), want2[1][0], rtol=1e-6, atol=1e-7,
                    what="step 2 (sees update 0, not update 1)")
    assert_tables(got_tables, want_tables, exact=True, seed=7)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_update_puts_the_next_batches_rows_first(engine_released, optimizer):
    """Every batch enqueued before the first step (as a worker's multi-step
    call does): each host's background update finds the next batch queued,
    updates the rows it reads first and lets its Recv look up while the
    other rows are updated (engine/engine.h ``first_rows_``).  Activations
    and tables must still equal one engine's step by step (the batches share
    rows, so a row updated late would show)."""
    rng = np.random.default_rng(11)
    config = make_config(optimizer, eu.MOD, 2)
    combiners = ["mean", "sum"]
    state = {d.name: eu.random_state(rng, d) for d in config.table_descriptor}
    batches = [make_inputs(rng, True) for _ in range(4)]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in eu.output_shapes(config)]
             for _ in batches]
    want_acts, want_state = one_engine(config, state, batches, grads, combiners)
    router = make_router(config, combiners)
    try:
        with Hosts(config, state) as hosts:
            for batch in batches:
                for name, part in zip(hosts.names, router.route(
                        *[list(x) for x in zip(*batch)], "train", 0)[0]):
                    ops.enqueue_tpu_embedding_routed_batch(part, engine=name)
            got_acts = []
            for grad in grads:
                parts = [ops.recv_tpu_embedding_routed_activations(engine=n)
                         for n in hosts.names]
                got_acts.append([a.numpy() for a in router.combine(parts, 0)])
                for name, part in zip(hosts.names, router.split(grad, [], 0)):
                    ops.send_tpu_embedding_routed_gradients(part, engine=name)
            got_state = hosts.tables()
    finally:
        router.shutdown()
    for step in range(len(batches)):
        for o, f in enumerate(config.feature_descriptor):
            eu.assert_close(got_acts[step][o], want_acts[step][o], rtol=1e-5, atol=1e-6,
                            what="step %d feature %s" % (step, f.name))
    assert_tables(got_state, want_state, exact=True, seed=11)
