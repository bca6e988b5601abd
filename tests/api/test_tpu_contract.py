"""The program contract of TF 2.21's TPU embedding classes, held by ours.

A model written for ``tf.tpu.experimental.embedding.TPUEmbedding`` (v2
mid-level API) or ``TPUEmbeddingV0`` must run on CPU unchanged (strategy
aside): every argument form TF's methods accept is accepted here, with the
same defaults, and every documented error comes with TF's type and text.
Organised by TF method.  Where TF's own class can run the same call off TPU
(its constructor, its ``build``/``embedding_tables`` under a CPU strategy),
the test runs both and compares; where TF's path is TPU-only, the expected
text is checked against TF's installed source, so a TF upgrade that changes
it fails here.

Numerics are tested elsewhere (tests/test_mid_level.py, tests/test_v0.py);
the lookups here only check which rows/replica a form reaches, against
tables whose values are known.
"""
import ast
import gc
import inspect
import logging
import re
import weakref

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v1
from tensorflow.python.tpu import tpu_embedding_v2

import tf_tpu_emb
from tf_tpu_emb import engine_registry
from tf_tpu_emb import gradients as gradients_lib
from tf_tpu_emb import ops as tte_ops

import harness  # tests/common: the one way to start a child process

E = tf.tpu.experimental.embedding
TF_V2_SOURCE = inspect.getsource(tpu_embedding_v2)
TF_V1_SOURCE = inspect.getsource(tpu_embedding_v1)


pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("engine_released")]


def arange_init(shape, dtype=tf.float32):
    """Row r of a table is [r, r + 1/8, ...]: a lookup tells which rows it summed."""
    rows, dim = shape
    return tf.constant(np.arange(rows)[:, None] + np.arange(dim)[None, :] / 8.0, dtype)


def tuple_config(output_shape=None):
    """A tuple-shaped feature config (two features sharing one table, one on its own)."""
    video = E.TableConfig(16, 4, name="video", combiner="sum", initializer=arange_init)
    user = E.TableConfig(8, 2, name="user", combiner="sum", initializer=arange_init)
    return (E.FeatureConfig(video, name="watched", output_shape=output_shape),
            (E.FeatureConfig(video, name="liked"), E.FeatureConfig(user, name="friend")))


def ids(values):
    return tf.constant(values, tf.int64)


def tf_error(cls_or_fn, *args, **kwargs):
    """(type, message) TF's own code raises for the call."""
    with pytest.raises(Exception) as info:
        cls_or_fn(*args, **kwargs)
    return type(info.value), str(info.value)


def _message_patterns(source):
    """Regexes of every string literal in `source` (adjacent literals joined by
    the parser; ``{}`` fields and f-string values match anything)."""
    patterns = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            parts = [re.escape(v.value) if isinstance(v, ast.Constant) else ".*"
                     for v in node.values]
            patterns.append("".join(parts))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            literal = re.split(r"(\{[^{}]*\})", node.value)
            patterns.append("".join(".*" if i % 2 else re.escape(t)
                                    for i, t in enumerate(literal)))
    return [re.compile(p, re.S) for p in patterns if len(p) > 12]


TF_V2_MESSAGES = _message_patterns(TF_V2_SOURCE)
TF_V1_MESSAGES = _message_patterns(TF_V1_SOURCE)


def assert_tf_message(message, patterns=None):
    """`message` is one of TF's texts (for TF paths that only run on a TPU,
    where TF's class cannot raise it here)."""
    patterns = TF_V2_MESSAGES if patterns is None else patterns
    assert any(p.fullmatch(message) for p in patterns), message


def assert_same_signature(ours, theirs, extra=()):
    """Same parameter names, order, kinds and defaults as TF's method; ours may
    add the keyword-only parameters `extra` after them (TPUEmbedding's
    ``cluster=`` and its companions), so every call TF accepts means the same."""
    ours, theirs = inspect.signature(ours), inspect.signature(theirs)
    added = list(ours.parameters)[len(theirs.parameters):]
    assert added == list(extra)
    assert all(ours.parameters[n].kind is inspect.Parameter.KEYWORD_ONLY for n in added)
    ours = [ours.parameters[n] for n in list(ours.parameters)[:len(theirs.parameters)]]
    assert [p.name for p in ours] == list(theirs.parameters)
    assert [p.default for p in ours] == [p.default for p in theirs.parameters.values()]
    assert [p.kind for p in ours] == [p.kind for p in theirs.parameters.values()]


# ================================================================ __init__

class TestInit:

    def test_unsupported_optimizer_same_error_as_tf(self):
        ours = tf_error(tf_tpu_emb.TPUEmbedding, tuple_config(), "adagrad")
        theirs = tf_error(E.TPUEmbedding, tuple_config(), "adagrad")
        assert ours[0] is theirs[0] is ValueError
        # Ours names our optimizer classes too.
        assert ours[1].startswith(theirs[1][:-1]), (ours, theirs)

    def test_duplicate_table_names_same_error_as_tf(self):
        def config():
            return [E.FeatureConfig(E.TableConfig(4, 2, name="t")),
                    E.FeatureConfig(E.TableConfig(4, 2, name="t"))]
        assert (tf_error(tf_tpu_emb.TPUEmbedding, config(), E.SGD(0.1))
                == tf_error(E.TPUEmbedding, config(), E.SGD(0.1)))

    def test_table_names_and_optimizers_are_filled_in_as_tf_does(self):
        ours_cfg = [E.FeatureConfig(E.TableConfig(4, 2)),
                    E.FeatureConfig(E.TableConfig(4, 2, optimizer=E.Adam(0.5)))]
        tf_cfg = [E.FeatureConfig(E.TableConfig(4, 2)),
                  E.FeatureConfig(E.TableConfig(4, 2, optimizer=E.Adam(0.5)))]
        opt = E.SGD(0.1)
        tf_tpu_emb.TPUEmbedding(ours_cfg, opt)
        E.TPUEmbedding(tf_cfg, opt)
        for ours, theirs in zip(ours_cfg, tf_cfg):
            assert ours.table.name == theirs.table.name
            assert type(ours.table.optimizer) is type(theirs.table.optimizer)
        assert [f.table.name for f in ours_cfg] == ["table_0", "table_1"]
        assert ours_cfg[0].table.optimizer is opt

    def test_positional_and_keyword_forms(self):
        assert_same_signature(tf_tpu_emb.TPUEmbedding.__init__, E.TPUEmbedding.__init__,
                              extra=("cluster", "sharding_strategy", "workers"))
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1), True)
        emb.build(2)
        from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
        assert pb.TPUEmbeddingConfiguration.FromString(
            emb.config_proto).pipeline_execution_with_tensor_core
        emb.shutdown()

    def test_optimizer_none_is_the_serving_form(self, tmp_path):
        """TF (off TPU) accepts optimizer=None and creates no slot variables."""
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), None)
        theirs = E.TPUEmbedding(tuple_config(), None)
        emb.build(2)
        theirs.build(2)
        assert sorted(emb._variables["video"]) == sorted(theirs._variables["video"]) \
            == ["parameters"]  # pylint: disable=protected-access
        emb.enqueue((ids([1, 2]), (ids([3, 4]), ids([5, 6]))), training=False)
        watched, _ = emb.dequeue()
        np.testing.assert_allclose(watched.numpy()[:, 0], [1.0, 2.0])
        emb.enqueue((ids([1, 2]), (ids([3, 4]), ids([5, 6]))), training=True)
        act = emb.dequeue()
        with pytest.raises(ValueError, match=r"optimizer=None.*\['video', 'user'\]"):
            emb.apply_gradients(tf.nest.map_structure(tf.zeros_like, act))
        emb.shutdown()


# =================================================================== build

class TestBuild:

    def config_of(self, emb):
        from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
        return pb.TPUEmbeddingConfiguration.FromString(emb.config_proto)

    def input_shapes(self, emb):
        return [list(f.input_shape) for f in self.config_of(emb).feature_descriptor]

    def test_int_positional_is_the_batch_size(self, caplog):
        """TF: ``build(64)`` (TensorFlow Recommenders' call) = per_replica_batch_size."""
        for args, kwargs in [((3,), {}), ((), {"per_replica_input_shapes": 3}),
                             ((), {"per_replica_batch_size": 3})]:
            emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
            with caplog.at_level(logging.WARNING):
                emb.build(*args, **kwargs)
            assert self.input_shapes(emb) == [[3], [3], [3]], (args, kwargs)
            emb.shutdown()
        warning = next(m for m in caplog.messages if m.startswith("Passing batch size"))
        assert_tf_message(warning)

    def test_flat_list_of_shapes_for_a_nested_config(self):
        """TF compares *flattened* structures: a flat list fits a tuple config."""
        for shapes in [[[2], [2], [2]],                                   # flat list
                       ([2], ([2], [2])),                                 # same structure
                       [tf.TensorShape([2, 1]), [2, 5], tf.TensorShape([2])]]:
            emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
            emb.build(shapes)
            assert self.input_shapes(emb) == [[2], [2], [2]], shapes
            emb.shutdown()
        # TF's own class (off TPU) accepts the same flat list.
        E.TPUEmbedding(tuple_config(), E.SGD(0.1)).build([[2], [2], [2]])

    def test_wrong_number_of_shapes_is_tf_structure_error(self):
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        with pytest.raises(ValueError, match="same nested structure|same number of elements"):
            emb.build([[2], [2]])
        assert not engine_registry.engines()

    def test_shapes_must_agree_with_feature_config(self):
        """TF checks shapes given at build against ``FeatureConfig.output_shape``."""
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(output_shape=[4]), E.SGD(0.1))
        with pytest.raises(ValueError) as info:
            emb.build(per_replica_batch_size=2)
        assert str(info.value) == ("Inconsistent shape founded for input feature 0, Output "
                                   "shape is set to be (4,), But got incoming output shape (2,)")
        assert_tf_message(str(info.value))
        assert not engine_registry.engines()
        emb.build([[4], [2], [2]])   # agreeing shapes build
        assert self.input_shapes(emb) == [[4], [2], [2]]
        emb.shutdown()

    def test_not_fully_defined(self):
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        with pytest.raises(ValueError) as info:
            emb.build()
        assert str(info.value).startswith("Input Feature 0 has output shape set as")
        assert_tf_message(str(info.value))

    def test_rank_0_input_shape(self):
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        with pytest.raises(ValueError, match=r"^Received input tensor of shape \(\)\. Rank must "
                           r"be 1 and above$") as info:
            emb.build([[], [2], [2]])
        assert_tf_message(str(info.value))

    def test_both_arguments(self):
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        with pytest.raises(ValueError, match="Only one of per_replica_input_shapes"):
            emb.build([[2], [2], [2]], 2)

    def test_second_build_is_a_no_op_and_a_second_object_has_its_own_engine(self):
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        emb.build(2)
        emb.build(5)                      # TF: returns at once when built
        assert self.input_shapes(emb) == [[2], [2], [2]]
        other = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        # (On a TPU system: "TPU is already initialized"; here engines are per object.)
        other.build(2)
        assert engine_registry.engines() == [emb.layout.engine, other.layout.engine]
        other.shutdown()
        emb.shutdown()

    def test_failure_after_configure_releases_the_engine(self):
        """A table initializer that raises fails build after configure: the
        engine is released, and a fresh object builds and looks up."""
        def broken(shape, dtype=tf.float32):
            raise RuntimeError("initializer broke")
        table = E.TableConfig(8, 2, name="t", initializer=broken)
        emb = tf_tpu_emb.TPUEmbedding([E.FeatureConfig(table)], E.Adagrad(0.1))
        with pytest.raises(RuntimeError, match="initializer broke"):
            emb.build(2)
        assert not engine_registry.engines()
        assert not emb._built  # pylint: disable=protected-access
        fresh = tf_tpu_emb.TPUEmbedding(tuple_config(), E.Adagrad(0.1))
        fresh.build(2)
        fresh.enqueue((ids([3, 4]), (ids([1, 1]), ids([7, 0]))), training=False)
        np.testing.assert_allclose(fresh.dequeue()[1][1].numpy(), [[7, 7.125], [0, 0.125]])
        fresh.shutdown()


# ================================================================= enqueue

class TestEnqueue:

    def test_signature_and_defaults(self):
        assert_same_signature(tf_tpu_emb.TPUEmbedding.enqueue, E.TPUEmbedding.enqueue)

    def test_positional_weights_training_name(self):
        """``enqueue(features, weights, training, name)`` positionally; weights
        only for composite inputs; ``training=False`` is an inference batch
        (a Send after it is refused by the engine)."""
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        sp = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64))
        w = tf.SparseTensor(sp.indices, [2.0, 1.0, 3.0], sp.dense_shape)
        emb.enqueue((sp, (ids([0, 0]), ids([0, 0]))), (w, (None, None)), False, "my_enqueue")
        watched = emb.dequeue()[0].numpy()
        np.testing.assert_allclose(watched[:, 0], [2 * 1 + 1 * 2, 3 * 3])
        emb.enqueue((sp, (ids([0, 0]), ids([0, 0]))), training=False)
        act = emb.dequeue()
        with pytest.raises(tf.errors.FailedPreconditionError):
            emb.apply_gradients(tf.nest.map_structure(tf.zeros_like, act))
        emb.shutdown()

    def test_training_as_tensor_in_tf_function(self):
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(1.0))
        emb.build(2)
        features = (ids([1, 2]), (ids([3, 4]), ids([5, 6])))

        @tf.function
        def step(training):
            emb.enqueue(features, training=training)
            act = emb.dequeue()
            return act

        before = emb.embedding_tables
        video0 = before[emb._table_config[0]].numpy().copy()  # pylint: disable=protected-access
        step(tf.constant(False))
        np.testing.assert_array_equal(
            emb.embedding_tables[emb._table_config[0]].numpy(), video0)  # pylint: disable=protected-access
        emb.shutdown()

    def test_device_non_tpu_type(self):
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        with pytest.raises(ValueError,
                           match=r"^Non-TPU device /GPU:0 passed to enqueue\.$") as info:
            emb.enqueue((ids([1, 2]), (ids([3, 4]), ids([5, 6]))), device="/GPU:0")
        assert_tf_message(str(info.value))

    def test_device_single_replica(self):
        """One replica: ``/CPU:0``, its full name and ``/TPU:0`` (as TPU code
        writes it) all feed replica 0; an index past the replicas is refused."""
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        features = (ids([1, 2]), (ids([3, 4]), ids([5, 6])))
        for device in ["/CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0", "/TPU:0"]:
            emb.enqueue(features, training=False, device=device)
            np.testing.assert_allclose(emb.dequeue()[0].numpy()[:, 0], [1, 2])
        for device in ["/TPU:1", "/CPU:3"]:
            with pytest.raises(ValueError, match="is not a replica of this strategy"):
                emb.enqueue(features, training=False, device=device)
        emb.shutdown()

    def test_device_maps_to_replica_under_mirrored_strategy(self):
        """``enqueue(device=...)`` with 2 replicas (own process: logical CPUs):
        each device's batch reaches that replica's dequeue, training updates
        over both replicas' batches."""
        proc = harness.run_python(
            [harness.script(__file__, "tpu_contract_mirrored_script.py")], timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(
            proc, 3000, 5000)


# ================================================ dequeue / apply_gradients

class TestDequeueAndApplyGradients:

    def test_signatures(self):
        for method in ["dequeue", "apply_gradients"]:
            assert_same_signature(getattr(tf_tpu_emb.TPUEmbedding, method),
                                  getattr(E.TPUEmbedding, method))
        # build adds the keyword-only takeover= of cluster= (README "Running on
        # several machines").
        assert_same_signature(tf_tpu_emb.TPUEmbedding.build, E.TPUEmbedding.build,
                              extra=("takeover",))

    def test_texts_are_tfs(self):
        """The unbuilt / gradient errors are TF's texts (TF's class raises them
        only under TPUStrategy)."""
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        grads = (None, (None, None))
        for call in [emb.dequeue, lambda: emb.apply_gradients(grads)]:
            with pytest.raises(RuntimeError) as info:
                call()
            assert_tf_message(str(info.value))
        emb.build(2)
        emb.enqueue((ids([1, 2]), (ids([3, 4]), ids([5, 6]))))
        act = emb.dequeue()
        for bad in [(np.zeros([2, 4], np.float32), (None, None)),
                    (tf.zeros([2, 3]), (None, None))]:
            with pytest.raises(ValueError) as info:
                emb.apply_gradients(bad)
            assert_tf_message(str(info.value))
        emb.apply_gradients(tf.nest.map_structure(tf.zeros_like, act))
        emb.shutdown()

    def test_none_gradient_is_zeros(self):
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(1.0))
        features = (ids([1, 2]), (ids([3, 4]), ids([5, 6])))
        emb.enqueue(features, training=True)
        act = emb.dequeue()
        video = emb._table_config[0]  # pylint: disable=protected-access
        before = emb.embedding_tables[video].numpy().copy()
        emb.apply_gradients((tf.ones_like(act[0]), (None, None)), name="send")
        after = emb.embedding_tables[video].numpy()
        changed = np.nonzero(np.any(after != before, axis=1))[0]
        np.testing.assert_array_equal(changed, [1, 2])   # only "watched" moved
        np.testing.assert_allclose(after[1] - before[1], -1.0)
        emb.shutdown()


# ========================================================= embedding_tables

class TestEmbeddingTables:

    def test_before_build_gives_host_variables_as_tf(self):
        """TF (off TPU) builds its variables on first access; so do we,
        without configuring the engine, and build then loads them."""
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.SGD(0.1))
        theirs = E.TPUEmbedding(tuple_config(), E.SGD(0.1))
        ours_tables = emb.embedding_tables
        their_tables = theirs.embedding_tables
        assert [t.name for t in ours_tables] == [t.name for t in their_tables]
        for a, b in zip(ours_tables.values(), their_tables.values()):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
        assert not engine_registry.engines()
        user = list(ours_tables)[1]
        ours_tables[user].assign(tf.fill([8, 2], 5.0))
        emb.build(2)
        emb.enqueue((ids([1, 2]), (ids([3, 4]), ids([5, 6]))), training=False)
        np.testing.assert_allclose(emb.dequeue()[1][1].numpy(), 5.0)
        emb.shutdown()


# ============================================================ checkpoints

class TestCheckpoints:

    def test_tf_class_checkpoint_restores_into_ours_and_back(self, tmp_path):
        """TF's own class (CPU strategy) writes the layout ours reads, and the
        other way round, slots included."""
        theirs = E.TPUEmbedding(tuple_config(), E.Adagrad(0.1))
        theirs.build(2)
        for var in theirs.embedding_tables.values():
            var.assign(var + 3.0)
        path = tf.train.Checkpoint(embedding=theirs).save(str(tmp_path / "tf"))
        emb = tf_tpu_emb.TPUEmbedding(tuple_config(), E.Adagrad(0.1))
        tf.train.Checkpoint(embedding=emb).restore(path).assert_existing_objects_matched()
        emb.build(2)
        emb.enqueue((ids([1, 2]), (ids([3, 4]), ids([5, 6]))), training=False)
        np.testing.assert_allclose(emb.dequeue()[0].numpy()[:, 0], [4.0, 5.0])
        path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "ours"))
        emb.shutdown()
        back = E.TPUEmbedding(tuple_config(), E.Adagrad(0.1))
        back.build(2)
        tf.train.Checkpoint(embedding=back).restore(path).assert_consumed()
        np.testing.assert_allclose(list(back.embedding_tables.values())[0].numpy()[1, 0], 4.0)


# ================================================================== hook_step

class TestHookStep:
    """The rough edges of ``gradients.hook_step`` behind ``TPUEmbeddingLayer``."""

    def setup_step(self, learning_rate_fn):
        from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
        config = pb.TPUEmbeddingConfiguration(mode=pb.TPUEmbeddingConfiguration.TRAINING)
        table = config.table_descriptor.add(name="t", vocabulary_size=4, dimension=2)
        table.optimization_parameters.stochastic_gradient_descent.SetInParent()
        table.optimization_parameters.learning_rate.dynamic.tag = 0
        config.feature_descriptor.add(name="f", table_id=0, input_shape=[2])
        layout = gradients_lib.Layout.from_config(config)
        config = config.SerializeToString()
        tte_ops.configure_tpu_embedding(config)
        dummies = gradients_lib.create_dummy_variables(layout)
        return config, layout, dummies

    def test_no_user_object_kept_alive(self):
        """After a step traced in a tf.function (whose custom gradients TF
        keeps for the life of the process), neither a bound-method
        learning-rate callable's object nor one a closure captured is alive."""
        config, layout, dummies = self.setup_step(None)

        class Schedule:
            def rate(self):
                return [tf.constant(0.5)]

        def run():
            # Its own frame: tracing reads the caller's frame locals, which
            # Python caches on the frame until it ends.
            schedule = Schedule()

            @tf.function
            def step(fn):
                tte_ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                    [tf.zeros([0], tf.int32)], [ids([1, 2])], [tf.zeros([0])],
                    device_ordinal=0, combiners=["sum"], mode_override="train")
                with tf.GradientTape() as tape:
                    recv = tte_ops.recv_tpu_embedding_activations(num_outputs=1, config=config)
                    act = gradients_lib.hook_step(dummies, layout, recv, fn)
                    loss = tf.reduce_sum(act["f"])
                return tape.gradient(loss, dummies)

            step(schedule.rate)                              # bound method
            step(lambda s=schedule: s.rate())                # closure over the object
            return weakref.ref(schedule)

        ref = run()
        gc.collect()
        assert ref() is None
        # Both steps ran: SGD with rate 0.5 twice on rows 1 and 2.
        table = tte_ops.table_ops("stochastic_gradient_descent").retrieve(
            table_name="t", num_shards=1, shard_id=0)
        table = (table[0] if isinstance(table, (list, tuple)) else table).numpy()
        np.testing.assert_allclose(table, [[0, 0], [-1, -1], [-1, -1], [0, 0]])

    def test_send_survives_grappler_in_nested_functions(self):
        """hook_step from an inner tf.function whose dummy gradient feeds a
        Keras optimizer in the outer one: the dummy gradient passes through a
        scratch-variable assignment (which grappler cannot fold, so the Send
        is never pruned) and the Send runs (the table trains).  The pruning
        itself shows in Keras' fit: tests/test_keras_layer.py's
        ``test_keras_adam_with_zero_dummy_gradients_and_engine_adagrad``
        fails without the barrier."""
        import keras
        config, layout, dummies = self.setup_step(None)
        opt = keras.optimizers.AdamW(0.01, weight_decay=0.1)

        @tf.function
        def inner():
            tte_ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                [tf.zeros([0], tf.int32)], [ids([1, 2])], [tf.zeros([0])],
                device_ordinal=0, combiners=["sum"], mode_override="train")
            with tf.GradientTape() as tape:
                recv = tte_ops.recv_tpu_embedding_activations(num_outputs=1, config=config)
                act = gradients_lib.hook_step(dummies, layout, recv, lambda: [0.5])
                loss = tf.reduce_sum(act["f"])
            return tape.gradient(loss, dummies)

        @tf.function
        def outer():
            for _ in tf.range(2):
                opt.apply_gradients(zip(inner(), dummies))

        outer()
        graph = inner.get_concrete_function().graph
        assert "AssignVariableOp" in {op.type for op in graph.get_operations()}
        table = tte_ops.table_ops("stochastic_gradient_descent").retrieve(
            table_name="t", num_shards=1, shard_id=0)
        table = (table[0] if isinstance(table, (list, tuple)) else table).numpy()
        # Two SGD steps, lr 0.5, gradient 1 on rows 1 and 2 (tables start at 0).
        np.testing.assert_allclose(table, [[0, 0], [-1, -1], [-1, -1], [0, 0]])


# ===================================================== TPUEmbeddingV0

class TestV0:

    def test_call_is_embedding_lookup_with_positional_weights(self):
        table = E.TableConfig(8, 2, name="t", combiner="sum", initializer=arange_init)
        emb = tf_tpu_emb.TPUEmbeddingV0({"f": E.FeatureConfig(table)}, E.SGD(0.1))
        sp = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64))
        w = tf.SparseTensor(sp.indices, [2.0, 1.0, 3.0], sp.dense_shape)
        out = emb({"f": sp}, {"f": w})["f"].numpy()
        np.testing.assert_allclose(out[:, 0], [4.0, 9.0])
        np.testing.assert_allclose(emb.embedding_lookup({"f": sp}, {"f": w})["f"], out)

    def test_build_twice_and_signatures(self):
        table = E.TableConfig(8, 2, name="t")
        emb = tf_tpu_emb.TPUEmbeddingV0([E.FeatureConfig(table)], E.Adagrad(0.1))
        emb.build()
        first = emb.embedding_tables[table]
        emb.build()
        assert emb.embedding_tables[table] is first
        for method in ["__call__", "build", "embedding_lookup"]:
            assert_same_signature(getattr(tf_tpu_emb.TPUEmbeddingV0, method),
                                  getattr(tpu_embedding_v1.TPUEmbeddingV0, method))

    def test_v0_error_texts_are_tfs(self):
        table = E.TableConfig(8, 2, name="t")
        emb = tf_tpu_emb.TPUEmbeddingV0({"f": E.FeatureConfig(table)}, None)
        cases = [({"f": ids([1])}, {"f": tf.ones([1])},
                  "Weight specified for f, but input is dense."),
                 ({"f": "x"}, None, "Input f is type"),
                 ({"f": tf.ragged.constant([[[1]]], dtype=tf.int64)}, None,
                  "Only rank 2 ragged tensor is supported")]
        for features, weights, text in cases:
            with pytest.raises(ValueError) as info:
                emb(features, weights)
            assert str(info.value).startswith(text), str(info.value)
            assert_tf_message(str(info.value), TF_V1_MESSAGES)
