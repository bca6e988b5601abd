"""Table layout conversion across host counts (tf_tpu_emb.sharding),
checked against the engine's own Load/Retrieve(num_shards=S, shard_id=k) (the
rows TF's TPU layout gives shard k, docs/tpu_embedding_semantics.md), against
host-shard engines for tables smaller than the host count (empty shards),
and against TF's TPUEmbeddingForServing full tables.  Exact (bit for bit)."""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from tf_tpu_emb import ops
from tf_tpu_emb import sharding

DIV, MOD = sharding.Sharding.DIV_DEFAULT, sharding.Sharding.MOD

CASES = [(vocab, optimizer) for vocab in (7, 12, 13) for optimizer in ("adagrad", "adam")]


def _config(vocab, optimizer, mod, dim=3):
    return eu.table_mode_config([eu.TableSpec("t", vocab, dim, optimizer, num_features=1)], 2,
                                sharding=eu.MOD if mod == MOD else eu.DIV)


@pytest.mark.parametrize("mod", [DIV, MOD], ids=["div", "mod"])
@pytest.mark.parametrize("vocab,optimizer", CASES)
def test_shards_are_the_engines_shards(lib, mod, vocab, optimizer):
    """shard_rows(full, S, k) == Retrieve(num_shards=S, shard_id=k) of an engine
    holding `full`; assemble(those shards) == full; loading shard_rows(...) of
    another table shard by shard and retrieving it whole gives that table."""
    del lib
    config = _config(vocab, optimizer, mod)
    desc = config.table_descriptor[0]
    rng = np.random.default_rng(vocab)
    with eu.engine(config):
        full = eu.random_state(rng, desc)
        eu.load_table(desc, full)
        for S in (1, 2, 3, 4, 5):
            got = [eu.retrieve_table(desc, num_shards=S, shard_id=k) for k in range(S)]
            for k in range(S):
                for i, state in enumerate(full):
                    want_rows = eu.shard_rows(vocab, S, k, mod)  # the spec's reference
                    np.testing.assert_array_equal(sharding.shard_row_ids(vocab, S, k, mod),
                                                  want_rows)
                    np.testing.assert_array_equal(sharding.shard_rows(state, S, k, mod), got[k][i])
            for i, state in enumerate(full):
                np.testing.assert_array_equal(sharding.assemble([g[i] for g in got], mod), state)
        other = eu.random_state(rng, desc)
        for S in (2, 3, 4):
            for k in range(S):
                eu.load_table(desc, [sharding.shard_rows(s, S, k, mod) for s in other],
                              num_shards=S, shard_id=k)
            for i, state in enumerate(eu.retrieve_table(desc)):
                np.testing.assert_array_equal(state, other[i])


@pytest.mark.parametrize("mod,new_mod", [(DIV, DIV), (MOD, MOD), (DIV, MOD), (MOD, DIV)])
@pytest.mark.parametrize("S,S2", [(2, 3), (3, 2), (4, 1), (1, 4), (2, 2)])
def test_reshard_is_the_engines_shards_at_the_new_count(lib, mod, new_mod, S, S2):
    """reshard(S shards, S') == what an engine with the new layout retrieves at S'."""
    del lib
    vocab = 13
    rng = np.random.default_rng(S * 10 + S2)
    full = rng.standard_normal((vocab, 3)).astype(np.float32)
    old = [sharding.shard_rows(full, S, k, mod) for k in range(S)]
    new = sharding.reshard(old, mod, S2, new_mod)
    config = _config(vocab, "stochastic_gradient_descent", new_mod)
    desc = config.table_descriptor[0]
    with eu.engine(config):
        eu.load_table(desc, [full])
        for k in range(S2):
            np.testing.assert_array_equal(new[k], eu.retrieve_table(desc, num_shards=S2,
                                                                    shard_id=k)[0])


@pytest.mark.parametrize("mod", [DIV, MOD], ids=["div", "mod"])
def test_tf_tensors_and_variables_give_the_numpy_result(mod):
    full = np.arange(11 * 2, dtype=np.float32).reshape(11, 2)
    var = tf.Variable(full)
    shards = [sharding.shard_rows(var, 3, k, mod) for k in range(3)]
    assert all(tf.is_tensor(s) for s in shards)
    for k in range(3):
        np.testing.assert_array_equal(shards[k].numpy(), sharding.shard_rows(full, 3, k, mod))
    out = sharding.assemble(shards, mod)
    assert tf.is_tensor(out)
    np.testing.assert_array_equal(out.numpy(), full)
    graph_fn = tf.function(lambda t: sharding.assemble([sharding.shard_rows(t, 4, k, mod)
                                                    for k in range(4)], mod))
    np.testing.assert_array_equal(graph_fn(tf.constant(full)).numpy(), full)


@pytest.mark.parametrize("call,message", [
    (lambda: sharding.rows_in_shard(10, 0, 0),
     "number of shards for the embedding layer must be > 0"),
    (lambda: sharding.rows_in_shard(10, 2, 2),
     "shard_id must be >= 0 and < 2. Currently set to: 2"),
    (lambda: sharding.rows_in_shard(0, 3, 2), "vocabulary_size must be > 0"),
    (lambda: sharding.shard_rows(np.zeros(5), 2, 0, DIV), "must be a \\[vocabulary_size"),
    (lambda: sharding.assemble([np.zeros((2, 3)), np.zeros((3, 3))], MOD),
     "shard 0 of 2 has 2 rows; a table of 5 rows gives it 3"),
    (lambda: sharding.assemble([np.zeros((0, 3)), np.zeros((1, 3))], MOD),
     "shard 0 of 2 has 0 rows; a table of 1 rows gives it 1"),
    (lambda: sharding.assemble([np.zeros((2, 3)), np.zeros((2, 4))], MOD), "one dimension"),
    (lambda: sharding.assemble([], MOD), "at least one shard"),
    (lambda: sharding.sharding_of("ROUND_ROBIN"), "must be one of \\['DIV_DEFAULT', 'MOD'\\]"),
])
def test_bad_layouts_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("mod", [DIV, MOD], ids=["div", "mod"])
def test_tpu_embedding_for_serving_tables_round_trip_through_host_shards(lib, mod):
    """TF's TPUEmbeddingForServing full tables, cut into S host shards, loaded
    shard by shard into the engine (Load num_shards=S, shard_id=k) give the
    same whole table back (Retrieve num_shards=1), and the shards the engine
    retrieves assemble into the serving table bit for bit."""
    del lib
    from tensorflow.python.tpu import tpu_embedding_v2_utils as tpu_utils
    from tensorflow.python.tpu.tpu_embedding_for_serving import TPUEmbeddingForServing

    vocab, dim = 13, 4
    initial = np.random.default_rng(5).standard_normal((vocab, dim)).astype(np.float32)
    table = tpu_utils.TableConfig(vocabulary_size=vocab, dim=dim, name="t",
                                  initializer=tf.constant_initializer(initial))
    fc = tpu_utils.FeatureConfig(table=table, name="f")
    serving = TPUEmbeddingForServing(fc, tpu_utils.SGD(learning_rate=0.1))
    serving.build()
    served = serving.embedding_tables[table].numpy()
    np.testing.assert_array_equal(served, initial)
    config = _config(vocab, "stochastic_gradient_descent", mod, dim)
    desc = config.table_descriptor[0]
    with eu.engine(config):
        for S in (2, 3, 4):
            eu.load_table(desc, [np.zeros((vocab, dim), np.float32)])
            for k in range(S):
                eu.load_table(desc, [sharding.shard_rows(served, S, k, mod)],
                              num_shards=S, shard_id=k)
            np.testing.assert_array_equal(eu.retrieve_table(desc)[0], served)
            shards = [eu.retrieve_table(desc, num_shards=S, shard_id=k)[0] for k in range(S)]
            np.testing.assert_array_equal(sharding.assemble(shards, mod), served)


def test_sharding_names_and_numbers():
    assert sharding.sharding_of("MOD") is MOD and sharding.sharding_of(0) is DIV
    assert int(MOD) == eu.MOD and int(DIV) == eu.DIV  # the proto's values


@pytest.mark.parametrize("mod", [DIV, MOD], ids=["div", "mod"])
@pytest.mark.parametrize("vocab, S", [(3, 4), (1, 3), (2, 5), (5, 3)])
def test_tables_smaller_than_the_host_count_round_trip(engine_released, mod, vocab, S):
    """TF's layout of a table over more hosts than rows: hosts k >= vocab hold
    an empty shard.  What host-shard engines retrieve assembles into the
    whole table; a whole table cut into S shards loads into them; S -> S'."""
    config = _config(vocab, "adagrad", mod)
    config.num_hosts = S
    desc = config.table_descriptor[0]
    full = eu.random_state(np.random.default_rng(vocab * 10 + S), desc)
    for k in range(S):
        assert sharding.rows_in_shard(vocab, S, k) == len(eu.shard_rows(vocab, S, k, mod == MOD))
    names = ["host%d" % k for k in range(S)]
    try:
        for k, name in enumerate(names):
            ops.configure_tpu_embedding_host_shard(config.SerializeToString(), k, engine=name)
            eu.load_table(desc, [sharding.shard_rows(s, S, k, mod) for s in full], num_shards=S,
                          shard_id=k, engine=name)
        got = [eu.retrieve_table(desc, num_shards=S, shard_id=k, engine=name)
               for k, name in enumerate(names)]
    finally:
        for name in names:
            ops.shutdown_tpu_embedding(engine=name)
    for k in range(S):
        assert got[k][0].shape == (sharding.rows_in_shard(vocab, S, k), 3)
    for i, state in enumerate(full):
        np.testing.assert_array_equal(sharding.assemble([g[i] for g in got], mod), state)
        for S2 in (1, 2, S + 1):
            again = sharding.assemble(sharding.reshard([g[i] for g in got], mod, S2), mod)
            np.testing.assert_array_equal(again, state)
