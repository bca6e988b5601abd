"""The CPU stand-in for the TPU system (tf_tpu_emb.tpu) in this process, one
replica: TF's public TPU names, what the strategy answers, the TPU system's
rules and the four places where TF's own TPU-embedding tests differed from a
CPU run.  Several replicas and the runner: test_runner.py."""
import inspect

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.distribute import tpu_strategy
from tensorflow.python.distribute.cluster_resolver.tpu import tpu_cluster_resolver
from tensorflow.python.tpu import tpu_embedding_v2
from tensorflow.python.tpu import tpu_replication

import tf_tpu_emb
from tf_tpu_emb import engine_registry
from tf_tpu_emb import tpu
from tf_tpu_emb.tpu import system as system_lib

E = tf.tpu.experimental.embedding
TF_CLASSES = {
    "TPUClusterResolver": tf.distribute.cluster_resolver.TPUClusterResolver,
    "TPUStrategy": tf.distribute.TPUStrategy,
    "experimental.TPUStrategy": tf.distribute.experimental.TPUStrategy,
    "TPUEmbedding": tf.tpu.experimental.embedding.TPUEmbedding,
    "initialize_tpu_system": tf.tpu.experimental.initialize_tpu_system,
    "connect": tf.config.experimental_connect_to_cluster,
}

pytestmark = pytest.mark.usefixtures("engine_released")


@pytest.fixture
def strategy():
    """The stand-in installed (one replica), a TPUStrategy made as TPU code makes it."""
    tpu.install(replicas=1)
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        yield tf.distribute.TPUStrategy(resolver)
    finally:
        tpu.uninstall()


def table(value=1.0, rows=4, name="table"):
    return E.TableConfig(rows, 4, name=name, combiner="sum",
                         initializer=tf.constant_initializer(np.full((rows, 4), value)))


def embedding(strategy, value=1.0, optimizer=None):
    with strategy.scope():
        return E.TPUEmbedding((E.FeatureConfig(table(value), name="feature"),),
                              optimizer or E.SGD(0.1))


def test_public_names_on_every_api_module_and_restored(strategy):
    import tensorflow.compat.v2 as tf2
    for api in (tf, tf2):
        assert api.tpu.experimental.embedding.TPUEmbedding is tf_tpu_emb.TPUEmbedding
        assert api.distribute.TPUStrategy is type(strategy)
        assert api.distribute.experimental.TPUStrategy is type(strategy)
        assert issubclass(api.distribute.cluster_resolver.TPUClusterResolver,
                          tpu_cluster_resolver.TPUClusterResolver)
    tpu.uninstall()
    assert tf.tpu.experimental.embedding.TPUEmbedding is tpu_embedding_v2.TPUEmbedding
    assert tf2.tpu.experimental.embedding.TPUEmbedding is tpu_embedding_v2.TPUEmbedding
    assert tf.distribute.TPUStrategy is tpu_strategy.TPUStrategyV2
    assert tf.tpu.experimental.initialize_tpu_system is TF_CLASSES["initialize_tpu_system"]
    assert tf.config.experimental_connect_to_cluster is TF_CLASSES["connect"]
    assert tpu.installed() is None


def test_resolver_any_tpu_name():
    tpu.install(replicas=1)
    try:
        for name in ["", "local", "my-tpu", "grpc://10.240.1.2:8470", None]:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)
            assert isinstance(resolver, TF_CLASSES["TPUClusterResolver"])
            assert resolver.master() == "" and resolver.num_accelerators() == {"TPU": 1}
            assert resolver.get_tpu_system_metadata().num_cores == 1
            tf.config.experimental_connect_to_cluster(resolver)
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver.connect(tpu="x")
        assert tpu.installed().initialized and resolver.cluster_spec().as_dict() == {}
    finally:
        tpu.uninstall()


def test_strategy_answers_what_tpu_code_asks(strategy):
    for cls in (tpu_strategy.TPUStrategyV2, tpu_strategy.TPUStrategy,
                TF_CLASSES["TPUStrategy"], TF_CLASSES["experimental.TPUStrategy"]):
        assert isinstance(strategy, cls)
    feature = strategy.extended.tpu_hardware_feature
    assert feature.embedding_feature == tf.tpu.experimental.HardwareFeature.EmbeddingFeature.V1
    assert feature.num_embedding_devices_per_chip == 1
    assert strategy.num_replicas_in_sync == 1 and strategy.extended.num_hosts == 1
    assert strategy.cluster_resolver.tpu_hardware_feature.embedding_feature == 1
    # Class-name heuristics (TPU compilation paths) see a CPU strategy.
    assert not tpu_replication.is_tpu_strategy(strategy)
    assert not strategy.__class__.__name__.startswith("TPUStrategy")
    assert tf.distribute.experimental.TPUStrategy(strategy.cluster_resolver) is not None
    x = tf.constant(3.0)
    assert strategy.experimental_assign_to_logical_device(x, 0) is x
    with pytest.raises(ValueError, match="one logical device per replica"):
        strategy.experimental_assign_to_logical_device(x, 1)
    result = tf.function(lambda: strategy.run(lambda: tf.constant(2.0)))()
    assert float(strategy.reduce("SUM", result, axis=None)) == 2.0


def test_public_embedding_name_builds_ours_and_ours_does_not_recurse(strategy):
    ours = embedding(strategy)
    assert type(ours) is tf_tpu_emb.TPUEmbedding
    assert isinstance(ours, tf.tpu.experimental.embedding.TPUEmbedding)
    with strategy.scope():
        direct = tf_tpu_emb.TPUEmbedding((E.FeatureConfig(table(), name="feature"),), E.SGD(0.1))
    assert type(direct) is tf_tpu_emb.TPUEmbedding
    assert "_TF_TPU_EMBEDDING" in inspect.getsource(tf_tpu_emb.TPUEmbedding.__new__)


def test_one_embedding_per_tpu_system(strategy):
    """TF's test_multiple_creation: the second build raises TF's RuntimeError."""
    first, second = embedding(strategy), embedding(strategy)
    first.build(2)
    with pytest.raises(RuntimeError) as info:
        second.build(2)
    assert str(info.value) == system_lib.ALREADY_INITIALIZED
    assert system_lib.ALREADY_INITIALIZED in inspect.getsource(tpu_embedding_v2)
    assert not second._built  # pylint: disable=protected-access
    first.shutdown()
    second.build(2)           # the system's embedding is free again
    second.enqueue((tf.constant([1, 2]),), training=False)
    np.testing.assert_array_equal(second.dequeue()[0].numpy(), np.ones((2, 4)))


def checkpointed_table(obj, path):
    """What a checkpoint of `obj` holds as its table (TF's test helper)."""
    saved = tf.train.Checkpoint(model=obj).save(path)
    names = [n for n, shape in tf.train.list_variables(saved) if shape == [4, 4]]
    assert len(names) == 1, names
    return tf.train.load_variable(saved, names[0])


def test_reinitialize_then_older_object_retrieves_what_the_newer_loaded(strategy, tmp_path):
    """TF's test_checkpoint_save_retrieves: the tables live in the TPU system."""
    first = embedding(strategy, 1.0)
    first.build(2)
    first._load_variables()  # pylint: disable=protected-access
    np.testing.assert_array_equal(checkpointed_table(first, str(tmp_path / "a")), 1.0)
    tf.tpu.experimental.initialize_tpu_system(strategy.cluster_resolver)
    assert first._built and not engine_registry.engines()  # pylint: disable=protected-access
    second = embedding(strategy, 2.0)
    second.build(2)
    second._load_variables()  # pylint: disable=protected-access
    np.testing.assert_array_equal(checkpointed_table(first, str(tmp_path / "b")), 2.0)
    # Restoring the first checkpoint into the second object loads it into the system.
    tf.train.Checkpoint(model=second).restore(str(tmp_path / "a-1"))
    second._retrieve_variables()  # pylint: disable=protected-access
    np.testing.assert_array_equal(
        second._variables["table"]["parameters"].variables[0].numpy(), 1.0)  # pylint: disable=protected-access
    tf.tpu.experimental.shutdown_tpu_system()
    assert not engine_registry.engines()


def test_slot_of_a_slot_creation_fn_reads_through_variables_0(strategy):
    """TF's test_optimizer_with_slot_creation_fn: slots the user's function
    makes with tf.Variable are the TPU system's (``.variables[0]``)."""
    def slot_creation_fn(table_var, slot_names, _):
        return {slot: tf.Variable(name="%s_%s" % (table_var.name.split(":")[0], slot),
                                  initial_value=tf.zeros(table_var.shape), trainable=False)
                for slot in slot_names}
    emb = embedding(strategy, optimizer=E.Adagrad(0.1, slot_variable_creation_fn=slot_creation_fn))
    emb.build(2)
    accumulator = emb._variables["table"]["accumulators"].variables[0]  # pylint: disable=protected-access
    np.testing.assert_array_equal(accumulator.numpy(), np.zeros((4, 4)))
    emb.enqueue((tf.constant([1, 1]),), training=True)
    with tf.GradientTape() as tape:
        act = emb.dequeue()
        tape.watch(act)
        loss = tf.reduce_sum(act[0])
    emb.apply_gradients(tape.gradient(loss, act))
    emb._retrieve_variables()  # pylint: disable=protected-access
    # Adagrad from a zero accumulator: row 1 got gradient 2 (two lookups), a = 4.
    np.testing.assert_array_equal(accumulator.numpy()[1], 4.0)
    np.testing.assert_allclose(emb.embedding_tables["table"].values[0].numpy()[1],
                               1.0 - 0.1 * 2 / 2)


def test_checkpoint_serves_partial_feature_structure_with_tfs_class(strategy, tmp_path):
    """A checkpoint of the stand-in's embedding restores into TF's
    TPUEmbeddingForServing (made off the TPU strategy, as TF requires), whose
    lookup takes a subset of the features."""
    with strategy.scope():
        video = table(0.0, name="video")
        user = E.TableConfig(4, 2, name="user",
                             initializer=tf.constant_initializer(np.arange(8).reshape(4, 2)))
        config = {"watched": E.FeatureConfig(video), "user": E.FeatureConfig(user)}
        trained = E.TPUEmbedding(config, E.SGD(0.5))
    trained.build(2)
    trained.enqueue({"watched": tf.constant([3, 3]), "user": tf.constant([0, 1])})
    trained.apply_gradients(tf.nest.map_structure(tf.ones_like, trained.dequeue()))
    path = tf.train.Checkpoint(embedding=trained).save(str(tmp_path / "ckpt"))
    serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(config, E.SGD(0.5))
    assert type(serving) is tf.tpu.experimental.embedding.TPUEmbeddingForServing
    tf.train.Checkpoint(embedding=serving).restore(path).expect_partial()
    out = serving.embedding_lookup({"watched": tf.constant([3, 0])})
    assert list(out) == ["watched"]
    # SGD 0.5, gradient 1 from each of the two lookups of row 3.
    np.testing.assert_array_equal(out["watched"].numpy(), [[-1.0] * 4, [0.0] * 4])


def test_outside_the_standin_several_engines_per_process():
    tpu.install(replicas=1)
    tpu.uninstall()
    a = tf_tpu_emb.TPUEmbedding((E.FeatureConfig(table(1.0)),), E.SGD(0.1))
    b = tf_tpu_emb.TPUEmbedding((E.FeatureConfig(table(2.0)),), E.SGD(0.1))
    a.build(2)
    b.build(2)
    assert len(engine_registry.engines()) == 2 and "" not in engine_registry.engines()
    b.enqueue((tf.constant([0, 1]),), training=False)
    np.testing.assert_array_equal(b.dequeue()[0].numpy(), 2.0)
    a.shutdown()
    b.shutdown()


def test_learning_rate_variables_are_created_at_build(strategy):
    """A learning-rate callable whose variable is created on first use (Keras'
    optimizer.iterations) has it after build, before any step is traced."""
    created = []

    def learning_rate():
        if not created:
            created.append(tf.Variable(0.25))
        return created[0]

    emb = embedding(strategy, optimizer=E.SGD(learning_rate))
    emb.build(2)
    assert len(created) == 1
