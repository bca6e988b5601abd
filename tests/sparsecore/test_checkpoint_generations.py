"""SparseCore checkpoints in the per-table form (tf_tpu_emb/sparsecore_checkpoint.py):
a table's rows out of a stacked, sharded variable, against TF's own
``unshuffle_from_sc_to_cpu`` + ``remove_padding_from_sc``
(tensorflow/python/tpu/tpu_embedding_v3_utils.py) on layouts made by TF's
``SparseCoreLayoutStacker``; and a whole checkpoint of stacked variables
with TF's layouts proto, read back per table with its slots and loaded into
TF's ``TPUEmbeddingForServing`` and into our V1 object."""
import numpy as np
import pytest
import tensorflow as tf

from tf_tpu_emb import sparsecore_checkpoint as scc

# TF's SparseCore layout stacker and utilities arrived after 2.16 (the old-TF lane).
_pywrap_sparse_core_layout = pytest.importorskip(
    "tensorflow.python.tpu._pywrap_sparse_core_layout",
    reason="this TensorFlow has no SparseCore layout stacker")
sparse_core_layout_pb2 = pytest.importorskip("tensorflow.core.tpu.kernels.sparse_core_layout_pb2")
v3_utils = pytest.importorskip("tensorflow.python.tpu.tpu_embedding_v3_utils")

TABLES = [("alpha", 37, 8), ("beta", 100, 8), ("gamma", 12, 4)]  # name, rows, width


def _layouts(num_partitions, num_sc, stacking=True):
    stacker = _pywrap_sparse_core_layout.SparseCoreLayoutStacker(
        num_partitions=num_partitions, sparse_cores_per_partition=num_sc,
        disable_table_stacking=not stacking)
    for name, rows, width in TABLES:
        stacker.AddTable(table_name=name, table_height=rows, table_width=width, group="g",
                         output_samples=16, num_features=1)
    return {layout.table_name: layout for layout in stacker.GetLayouts().tables}


def _stack_heights(layouts):
    heights = {}
    for layout in layouts.values():
        shard = layout.sparse_core_shard_row_offset + (
            layout.unsharded_padded_shape[0] // layout.num_sparse_cores)
        heights[layout.stacked_table_name] = max(heights.get(layout.stacked_table_name, 0),
                                                 shard)
    return {k: (v, layouts_width(layouts, k)) for k, v in heights.items()}


def layouts_width(layouts, stack):
    return next(layout.unsharded_padded_shape[1] for layout in layouts.values()
                if layout.stacked_table_name == stack)


def _tfs_unstack(stacked, layout):
    """A table's rows out of a stacked value by TF's own functions."""
    return v3_utils.remove_padding_from_sc(
        v3_utils.unshuffle_from_sc_to_cpu(
            tf.constant(stacked), num_sparse_cores=layout.num_sparse_cores,
            offset_in_shard=layout.sparse_core_shard_row_offset,
            size_in_shard=layout.unsharded_padded_shape[0] // layout.num_sparse_cores,
            shard_rotation=layout.sparse_core_shard_rotation),
        tuple(layout.unsharded_shape)).numpy()


@pytest.mark.parametrize("num_partitions,num_sc,stacking", [(1, 4, True), (2, 4, True),
                                                            (8, 4, True), (2, 4, False)])
def test_unstack_matches_tfs_unshuffle(num_partitions, num_sc, stacking):
    layouts = _layouts(num_partitions, num_sc, stacking)
    rng = np.random.default_rng(num_partitions)
    n = num_partitions * num_sc
    for stack, (per_shard, width) in _stack_heights(layouts).items():
        stacked = rng.normal(size=(n * per_shard, width)).astype(np.float32)
        for layout in layouts.values():
            if layout.stacked_table_name != stack:
                continue
            want = _tfs_unstack(stacked, layout)
            got = scc.unstack_table(stacked, layout)
            assert got.shape == tuple(layout.unsharded_shape)
            np.testing.assert_array_equal(got, want)
    if stacking and num_partitions > 1:  # the case the stacking rotates
        assert any(layout.sparse_core_shard_rotation for layout in layouts.values())


@pytest.mark.parametrize("num_partitions,num_sc,stacking", [(1, 4, True), (2, 4, True),
                                                            (8, 4, True), (2, 4, False)])
def test_stack_table_writes_what_tfs_unshuffle_reads(num_partitions, num_sc, stacking):
    """stack_table (a logical table into its stacked variable: how a JAX
    program's table enters TPUEmbeddingV2) is read back by TF's unshuffle,
    and touches no entry outside the table's rows."""
    layouts = _layouts(num_partitions, num_sc, stacking)
    rng = np.random.default_rng(10 + num_partitions)
    n = num_partitions * num_sc
    for stack, (per_shard, width) in _stack_heights(layouts).items():
        stacked = rng.normal(size=(n * per_shard, width)).astype(np.float32)
        before = stacked.copy()
        untouched = np.ones(stacked.shape, bool)
        for layout in layouts.values():
            if layout.stacked_table_name != stack:
                continue
            table = rng.normal(size=tuple(layout.unsharded_shape)).astype(np.float32)
            stacked = scc.stack_table(stacked, table, layout)
            got = _tfs_unstack(stacked, layout)
            np.testing.assert_array_equal(got, table)
            marks = scc.stack_table(np.zeros_like(stacked),
                                    np.ones(tuple(layout.unsharded_shape), np.float32), layout)
            untouched &= marks == 0
        # Padding and other stacks' rows keep their values.
        np.testing.assert_array_equal(stacked[untouched], before[untouched])
    with pytest.raises(ValueError, match="values of shape"):
        scc.stack_table(np.zeros((n * 64, 8), np.float32), np.zeros((3, 8), np.float32),
                        layouts["alpha"])


def test_unstack_refuses_a_variable_of_the_wrong_height():
    layout = _layouts(1, 4)["alpha"]
    with pytest.raises(ValueError, match="SparseCore shards"):
        scc.unstack_table(np.zeros((7, 8), np.float32), layout)
    with pytest.raises(ValueError, match="outside the stacked table"):
        scc.unstack_table(np.zeros((4, 8), np.float32), layout)


def _write_v2_like_checkpoint(tmp_path, layouts, logical, slots=("accumulators",)):
    """A checkpoint with TF's V2 object layout: the embedding object holds the
    layouts proto (TF's SparseCoreLayoutsTrackable), each stack's variable
    and "<stack>/<slot>" slot variables, filled from `logical` tables by the
    inverse of the rule (each row placed where TF's unshuffle reads it)."""
    stacks = _stack_heights(layouts)
    n = next(iter(layouts.values())).num_sparse_cores
    values = {stack: {s: np.zeros((n * h, w), np.float32) for s in ("parameters",) + slots}
              for stack, (h, w) in stacks.items()}
    for name, layout in layouts.items():
        rows, cols = layout.unsharded_shape
        for state, table in logical[name].items():
            target = values[layout.stacked_table_name][state]
            for i in range(rows):
                shard = (i % n + layout.sparse_core_shard_rotation) % n
                h = len(target) // n
                target[shard * h + layout.sparse_core_shard_row_offset + i // n, :cols] = table[i]
    obj = tf.Module()
    proto = sparse_core_layout_pb2.SparseCoreTableLayouts()
    proto.tables.extend(layouts.values())
    obj._track_trackable(v3_utils.SparseCoreLayoutsTrackable(
        tf.constant(proto.SerializeToString())), v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY)
    for stack, states in values.items():
        for state, value in states.items():
            name = stack if state == "parameters" else stack + "/" + state
            obj._track_trackable(tf.Variable(value), name)
    return tf.train.Checkpoint(embedding=obj).save(str(tmp_path / "ckpt"))


def _logical(rng, slots=("accumulators",)):
    return {name: {s: rng.normal(size=(rows, width)).astype(np.float32)
                   for s in ("parameters",) + slots} for name, rows, width in TABLES}


def test_read_tables_gives_every_table_and_slot(tmp_path):
    layouts = _layouts(2, 4)
    logical = _logical(np.random.default_rng(3))
    path = _write_v2_like_checkpoint(tmp_path, layouts, logical)
    got = scc.read_tables(path)
    assert sorted(got) == sorted(logical)
    for name in logical:
        assert sorted(got[name]) == ["accumulators", "parameters"]
        for state in logical[name]:
            np.testing.assert_array_equal(got[name][state], logical[name][state])
    # A directory finds its latest checkpoint.
    assert sorted(scc.read_tables(str(tmp_path))) == sorted(logical)


def test_read_tables_refuses_a_v1_checkpoint(tmp_path):
    path = tf.train.Checkpoint(v=tf.Variable([1.0])).save(str(tmp_path / "v1"))
    with pytest.raises(ValueError, match="not written by TPUEmbeddingV2"):
        scc.read_tables(path)


def test_tables_of_takes_only_a_v2_object():
    serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(_configs(None), None)
    with pytest.raises(TypeError, match="takes a TPUEmbeddingV2 object, got "
                                        "TPUEmbeddingForServing"):
        scc.tables_of(serving)


def _configs(optimizer):
    tables = {name: tf.tpu.experimental.embedding.TableConfig(
        vocabulary_size=rows, dim=width, name=name, optimizer=optimizer)
        for name, rows, width in TABLES}
    return {name: tf.tpu.experimental.embedding.FeatureConfig(table=t, name="f_" + name)
            for name, t in tables.items()}


def test_load_into_tfs_serving_object(tmp_path):
    layouts = _layouts(2, 4)
    logical = _logical(np.random.default_rng(4))
    tables = scc.read_tables(_write_v2_like_checkpoint(tmp_path, layouts, logical))
    serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
        _configs(tf.tpu.experimental.embedding.SGD(0.1)), optimizer=None)
    serving.build()
    scc.load_into(serving, tables)
    for config, var in serving.embedding_tables.items():
        np.testing.assert_array_equal(var.numpy(), logical[config.name]["parameters"])


@pytest.mark.usefixtures("lib")
def test_load_into_our_v1_object_and_its_checkpoint(tmp_path):
    import tf_tpu_emb
    layouts = _layouts(2, 4)
    logical = _logical(np.random.default_rng(5))
    tables = scc.read_tables(_write_v2_like_checkpoint(tmp_path, layouts, logical))
    opt = tf.tpu.experimental.embedding.Adagrad(0.1)
    v1 = tf_tpu_emb.TPUEmbedding(_configs(opt), opt)
    try:
        v1.build(per_replica_batch_size=4)
        scc.load_into(v1, tables)
        for config in v1._table_config:
            for state, value in zip(v1.table_state_names(config), v1.retrieve_table(config)):
                np.testing.assert_array_equal(value, logical[config.name][state])
        # The per-table (V1) checkpoint of it restores into a fresh V1 object.
        path = tf.train.Checkpoint(embedding=v1).save(str(tmp_path / "v1"))
    finally:
        v1.shutdown()
    fresh = tf_tpu_emb.TPUEmbedding(_configs(opt), opt)
    try:
        fresh.build(per_replica_batch_size=4)
        tf.train.Checkpoint(embedding=fresh).restore(path).assert_consumed()
        for config in fresh._table_config:
            np.testing.assert_array_equal(fresh.retrieve_table(config)[0],
                                          logical[config.name]["parameters"])
    finally:
        fresh.shutdown()


@pytest.mark.usefixtures("lib")
def test_load_into_refuses_mismatches(tmp_path):
    import tf_tpu_emb
    layouts = _layouts(1, 4)
    logical = _logical(np.random.default_rng(6), slots=())
    tables = scc.read_tables(_write_v2_like_checkpoint(tmp_path, layouts, logical, slots=()))
    opt = tf.tpu.experimental.embedding.Adagrad(0.1)
    v1 = tf_tpu_emb.TPUEmbedding(_configs(opt), opt)
    try:
        v1.build(per_replica_batch_size=4)
        with pytest.raises(ValueError, match="no accumulators"):
            scc.load_into(v1, tables)
        del tables["gamma"]
        with pytest.raises(ValueError, match="no table named 'gamma'"):
            scc.load_into(v1, tables)
    finally:
        v1.shutdown()
