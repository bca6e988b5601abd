"""tf_tpu_emb.TPUEmbedding, TF's v2 mid-level API on the CPU engine (spec
§4.4, §3.4, §4.7), driven with TF's own TableConfig / FeatureConfig and
tf.tpu.experimental.embedding.SGD / Adagrad / Adam / FTRL objects.

The model, inputs, training loop and numpy reference live in
tests/common/mid_level_common.py: two tables (``video`` sum, ``user`` mean), five
features (weighted sparse, dense, ragged with ``output_shape``, weighted
ragged, sparse sequence), loss Σ act * c so dL/d(activations) = c, and
tests/common/optimizer_reference.py applied to the global batch.

* training numerics: default strategy, OneDeviceStrategy (in process) and
  MirroredStrategy over 2 and 4 logical CPUs (tests/api/mid_level_strategy_script.py),
  eagerly and in tf.function, enqueue inside / outside strategy.run; tables
  AND slots after every step; dynamic learning rate; per-table optimizers;
* errors (TF's texts where TF has them) and the one-engine-per-process rule;
* checkpoints: ours -> ours (bit-exact, slots included, and the engine
  really uses what was restored), ours -> TPUEmbeddingForServing, TF layout
  (TPUEmbeddingForServing's checkpoint, plain variables named as TF names
  them) -> ours, also restored before build;
* export_serving from a trained TPUEmbedding, loaded in a process that never
  imports tf_tpu_emb (tests/common/serving_load_script.py).

Every test releases the engine (only one exists per process).
"""
import json
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.trackable import autotrackable

import tf_tpu_emb
from tf_tpu_emb import engine_registry
from tf_tpu_emb import ops as tte_ops

import mid_level_common as mc  # noqa: E402
import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.tf_version

E = tf.tpu.experimental.embedding
B = mc.GLOBAL_BATCH
HERE = os.path.dirname(os.path.abspath(__file__))
OPTIMIZERS = ["sgd", "adagrad", "adam", "ftrl"]
SLOTS = {name: mc.optimizer_case(name)[2] for name in OPTIMIZERS}


@pytest.fixture(autouse=True)
def release_engine():
    """No test may leave an engine configured."""
    tf_tpu_emb.load_library()
    try:
        yield
    finally:
        for owner in engine_registry.owners():
            owner.shutdown()
        tte_ops.shutdown_tpu_embedding()


def new_embedding(optimizer="adagrad", batch=B, lr=None, **table_optimizers):
    fc, tables = mc.make_feature_config(batch)
    for name, opt in table_optimizers.items():
        tables[name].optimizer = mc.optimizer_case(opt)[0]
    opt = mc.optimizer_case(optimizer, lr=lr)[0] if isinstance(optimizer, str) else optimizer
    return tf_tpu_emb.TPUEmbedding(fc, opt), fc, tables


def lookup(embedding, raw):
    """Inference enqueue + dequeue of one batch: {path: numpy} (global layout)."""
    features, weights = mc.to_tensors(raw)
    embedding.enqueue(features, weights, training=False)
    act = embedding.dequeue()
    return {p: mc.get(act, p).numpy().reshape([len(raw[p])] + mc.out_tail(p))
            for p in mc.PATHS}


def run_script(args, ok="OK", timeout=240):
    proc = harness.run_python(args, timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.strip().endswith(ok), harness.describe(
        proc, stderr_tail=6000)
    return proc.stdout


# =============================================================== training

@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_training_default_strategy(optimizer):
    """Default strategy: two eager steps then two tf.function steps; every
    step's activations and the tables + slots after it equal the reference."""
    emb, _, _ = new_embedding(optimizer)
    try:
        mc.run_training(tf.distribute.get_strategy(), emb, optimizer,
                        [("direct", False), ("direct", False), ("direct", True),
                         ("direct", True)], what="default")
    finally:
        emb.shutdown()


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_training_one_device_strategy(optimizer):
    """OneDeviceStrategy('/cpu:0'): enqueue inside strategy.run (replica-id
    path) and outside it, eagerly and in tf.function."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        emb, _, _ = new_embedding(optimizer)
    try:
        mc.run_training(strategy, emb, optimizer,
                        [("inside", False), ("outside", False), ("inside", True),
                         ("outside", True)], what="one device")
    finally:
        emb.shutdown()


@pytest.mark.parametrize("replicas", [2, pytest.param(4, marks=pytest.mark.long)])
def test_training_mirrored_strategy(replicas):
    """MirroredStrategy over 2 / 4 logical CPUs (own process): the per-replica
    batch is the global batch split contiguously; all replicas' gradients make
    one update that equals the single-replica reference on the global batch,
    for SGD, Adagrad, Adam, FTRL and a dynamic learning rate."""
    out = run_script([os.path.join(HERE, "mid_level_strategy_script.py"), str(replicas),
                      "sgd,adagrad,adam,ftrl,adagrad-dynamic"])
    for name in ("sgd", "adagrad", "adam", "ftrl", "adagrad-dynamic"):
        assert "%s R=%d ok" % (name, replicas) in out, out


def test_dynamic_learning_rate():
    """learning_rate = a callable reading a tf.Variable (dynamic tag 0):
    changing the variable between steps changes the update, eagerly and in
    tf.function."""
    lr_var = tf.Variable(0.0, name="lr")
    emb, _, _ = new_embedding("adagrad", lr=lambda: lr_var)
    try:
        reference = mc.run_training(
            tf.distribute.get_strategy(), emb, "adagrad",
            [("direct", False), ("direct", False), ("direct", True), ("direct", True)],
            lr_var=lr_var, lr_schedule=[0.1, 0.5, 0.02, 0.3], what="dynamic lr")
    finally:
        emb.shutdown()
    # The schedule mattered: a constant rate gives other tables.
    constant = mc.Reference({n: mc.optimizer_case("adagrad", lr=0.1)[1] for n in mc.TABLES},
                            {n: [0.2] for n in mc.TABLES})
    rng = np.random.default_rng(1)
    for _ in range(4):
        raw, c = mc.make_batch(rng), mc.make_grads(rng)
        constant.step(raw, c)
    assert np.abs(constant.state["video"][0] - reference.state["video"][0]).max() > 1e-2


def test_per_table_optimizers():
    """TableConfig(optimizer=Adam) on `video`, the global FTRL on `user`."""
    emb, _, tables = new_embedding("ftrl", video="adam")
    assert isinstance(tables["user"].optimizer, E.FTRL)  # filled in, as TF does
    try:
        mc.run_training(tf.distribute.get_strategy(), emb, {"video": "adam", "user": "ftrl"},
                        [("direct", False), ("direct", True), ("direct", False)],
                        what="per table")
    finally:
        emb.shutdown()


def test_inference_enqueue_does_not_train():
    """training=False: activations as usual, no update, and no gradient is
    expected before the next (training) step, which matches the reference
    started from the initial tables."""
    emb, _, _ = new_embedding("sgd")
    initial = mc.initial_tables()
    try:
        emb.build(per_replica_batch_size=B)
        raw = mc.make_batch(np.random.default_rng(5))
        mc.compare_activations(lookup(emb, raw), mc.reference_forward(initial, raw),
                               "inference")
        after = mc.engine_state(emb, [])
        for n in mc.TABLES:
            np.testing.assert_array_equal(after[n][0], initial[n])
        mc.run_training(tf.distribute.get_strategy(), emb, "sgd", [("direct", False)])
    finally:
        emb.shutdown()


def test_none_gradient_sends_zeros_with_warning(caplog):
    """A None gradient is a zeros tensor plus TF's warning: with SGD only the
    features that got a gradient move their rows."""
    emb, _, _ = new_embedding("sgd")
    rng = np.random.default_rng(7)
    raw, c = mc.make_batch(rng), mc.make_grads(rng)
    try:
        features, weights = mc.to_tensors(raw)
        emb.enqueue(features, weights, training=True)
        emb.dequeue()
        grads = mc.nested({p: tf.constant(c[p].reshape(mc.replica_output_shape(p, B)))
                           for p in mc.PATHS})
        grads["liked"] = None
        grads["seq"]["history"] = None
        with caplog.at_level(logging.WARNING, logger="tf_tpu_emb.mid_level"):
            emb.apply_gradients(grads)
        messages = [r.getMessage() for r in caplog.records if r.name == "tf_tpu_emb.mid_level"]
        for path in ("liked", "seq/history"):
            assert ("No gradient passed for feature %s, sending zero gradient. This may not "
                    "be correct behavior for certain optimizers like Adam." % path) in messages
        assert len(messages) == 2, messages
        got = mc.engine_state(emb, [])
    finally:
        emb.shutdown()
    reference = mc.Reference({n: mc.optimizer_case("sgd")[1] for n in mc.TABLES},
                             {n: [] for n in mc.TABLES})
    c["liked"] = np.zeros_like(c["liked"])
    c["seq/history"] = np.zeros_like(c["seq/history"])
    reference.step(raw, c)
    mc.compare_state(got, reference, "None gradients")

    # All None: nothing moves at all.
    emb, _, _ = new_embedding("sgd")
    try:
        emb.enqueue(*mc.to_tensors(raw), training=True)
        emb.dequeue()
        emb.apply_gradients(mc.nested({p: None for p in mc.PATHS}))
        got = mc.engine_state(emb, [])
    finally:
        emb.shutdown()
    for n in mc.TABLES:
        np.testing.assert_array_equal(got[n][0], mc.initial_tables()[n])


# =============================================================== errors

def test_enqueue_errors():
    emb, _, _ = new_embedding("sgd")
    rng = np.random.default_rng(3)
    features, weights = mc.to_tensors(mc.make_batch(rng))
    try:
        # Structure must match the feature config.
        bad = dict(features)
        del bad["liked"]
        with pytest.raises((ValueError, TypeError), match="same"):
            emb.enqueue(bad)
        with pytest.raises((ValueError, TypeError), match="same"):
            emb.enqueue(features, {"watched": None})
        assert not emb._built  # pylint: disable=protected-access  (nothing happened)

        # Weights for a dense input.
        w = dict(weights, liked=tf.ones([B]))
        with pytest.raises(ValueError, match=r"^Weight specified for dense input liked, which "
                           r"is not allowed\. Weight will always be 1 in this case\.$"):
            emb.enqueue(features, w)
        # Weight of another composite type than the input.
        w = dict(weights, watched=tf.RaggedTensor.from_row_splits(tf.ones([2]), [0, 1, 2]))
        with pytest.raises(ValueError, match=r"^Weight for watched is type .*RaggedTensor.* "
                           r"which does not match type input which is SparseTensor\.$"):
            emb.enqueue(features, w)
        w = dict(weights, friends=tf.SparseTensor([[0, 0]], [1.0], [B, 1]))
        with pytest.raises(ValueError, match=r"^Weight for friends is type .*SparseTensor.* "
                           r"which does not match type input which is RaggedTensor\.$"):
            emb.enqueue(features, w)
        # Unknown input type.
        with pytest.raises(ValueError, match=r"^Input liked is of unknown type .*str.*Please "
                           r"only pass Tensor, SparseTensor or RaggedTensor as input to "
                           r"enqueue\.$"):
            emb.enqueue(dict(features, liked="ids"), weights)

        # A first good step fixes the shapes; a later batch of another size fails.
        emb.enqueue(features, weights)
        emb.dequeue()
        small, small_w = mc.to_tensors(mc.make_batch(rng, batch=B // 2))
        with pytest.raises(ValueError, match=r"^Inconsistent shape founded for input feature "
                           r"friends, Output shape is set to be \(8,\), But got incoming "
                           r"output shape \(4,\)$"):
            emb.enqueue(small, small_w)
    finally:
        emb.shutdown()


def test_unbuilt_object_errors():
    emb, _, _ = new_embedding("sgd")
    for what, call in [("dequeue", emb.dequeue),
                       ("apply_gradients",
                        lambda: emb.apply_gradients(mc.nested({p: None for p in mc.PATHS})))]:
        with pytest.raises(RuntimeError, match=r"^%s called on unbuilt TPUEmbedding object\. "
                           r"Please either call enqueue first or manually call the build "
                           r"method\.$" % what):
            call()
    assert not engine_registry.engines()


def test_gradient_errors():
    emb, _, _ = new_embedding("sgd")
    rng = np.random.default_rng(4)
    try:
        emb.enqueue(*mc.to_tensors(mc.make_batch(rng)), training=True)
        act = emb.dequeue()
        grads = tf.nest.map_structure(tf.zeros_like, act)
        with pytest.raises(ValueError, match=r"^Found gradient of shape \(8, 3\) at path "
                           r"liked\. Expected shape \[8, 4\]\.$"):
            emb.apply_gradients(dict(grads, liked=tf.zeros([8, 3])))
        with pytest.raises(ValueError, match=r"^Found gradient of shape \(8, 2, 4\) at path "
                           r"pair\. Expected shape \[4, 2, 4\]\.$"):
            emb.apply_gradients(dict(grads, pair=tf.zeros([8, 2, 4])))
        with pytest.raises(ValueError, match=r"^found non-tensor type: <class 'numpy\.ndarray'> "
                           r"at path watched\.$"):
            emb.apply_gradients(dict(grads, watched=np.zeros([8, 4], np.float32)))
        with pytest.raises((ValueError, TypeError), match="same"):
            emb.apply_gradients({"liked": grads["liked"]})
        emb.apply_gradients(grads)  # the step can still complete
    finally:
        emb.shutdown()


def test_constructor_errors():
    fc, tables = mc.make_feature_config(B)
    with pytest.raises(ValueError, match=r"is an unsupported optimizer class\. Please pass an "
                       r"instance of one of the optimizer classes under "
                       r"tf\.tpu\.experimental\.embedding"):
        tf_tpu_emb.TPUEmbedding(fc, tf.keras.optimizers.SGD(0.1))
    # optimizer=None is TF's serving form off TPU: tests/test_tpu_contract.py.

    a = E.TableConfig(10, 4, name="video")
    b = E.TableConfig(10, 4, name="video")
    fc = {"x": E.FeatureConfig(a), "y": E.FeatureConfig(b)}
    with pytest.raises(ValueError, match=r"^Tables must have a unique name\. Multiple tables "
                       r"with name video found\.$"):
        tf_tpu_emb.TPUEmbedding(fc, E.SGD(0.1))

    # Unnamed tables get table_<i>, as in TF.
    a = E.TableConfig(10, 4)
    b = E.TableConfig(6, 2)
    emb = tf_tpu_emb.TPUEmbedding({"x": E.FeatureConfig(a), "y": E.FeatureConfig(b)},
                                  E.SGD(0.1))
    assert (a.name, b.name) == ("table_0", "table_1")
    assert not emb._built  # pylint: disable=protected-access


def test_build_rules():
    emb, _, _ = new_embedding("adagrad")
    try:
        # Nothing gives friends/watched/... a batch size: not fully defined.
        with pytest.raises(ValueError, match=r"^Input Feature friends has output shape set as "
                           r".* which is not fully defined\. Please specify the fully defined "
                           r"shape in either FeatureConfig or for the build method\.$"):
            emb.build()
        with pytest.raises(ValueError, match="Only one of"):
            emb.build(per_replica_input_shapes=mc.nested(
                {p: tf.TensorShape([B]) for p in mc.PATHS}), per_replica_batch_size=B)
        assert not engine_registry.engines()

        emb.build(per_replica_batch_size=B)
        config = emb.config_proto
        variables = {n: dict(v) for n, v in emb._variables.items()}  # pylint: disable=protected-access
        # Output shapes: batch from build, FeatureConfig.output_shape wins,
        # sequence length from max_sequence_length.
        from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
        proto = pb.TPUEmbeddingConfiguration.FromString(config)
        shapes = {f.name: list(f.input_shape) for f in proto.feature_descriptor}
        assert shapes == {"friends": [B], "liked": [B], "pair": [B // 2, 2],
                          "seq/history": [B, mc.SEQ_L], "watched": [B]}
        # Tables in order of first use in tf.nest order (friends comes first).
        assert [t.name for t in proto.table_descriptor] == ["user", "video"]
        assert proto.num_tensor_cores == 1

        emb.build(per_replica_batch_size=3)  # no-op: already built
        assert emb.config_proto == config
        assert all(emb._variables[n][k] is v  # pylint: disable=protected-access
                   for n, d in variables.items() for k, v in d.items())

        # A second object builds an engine of its own while this one holds its
        # engine (README "Several engines per process") ...
        other, _, _ = new_embedding("sgd")
        other.build(per_replica_batch_size=B)
        assert engine_registry.engines() == [emb.layout.engine, other.layout.engine]
        mc.run_training(tf.distribute.get_strategy(), other, "sgd", [("direct", False)])
        # ... and shutting this one down leaves the other's engine alone.
        emb.shutdown()
        emb.shutdown()  # a second shutdown is a no-op
        assert engine_registry.engines() == [other.layout.engine]
        other.shutdown()
    finally:
        emb.shutdown()


def test_build_from_input_shapes():
    """per_replica_input_shapes: sparse [B, W] -> [B]; dense [B] -> [B];
    sequence [B, L] -> [B, L]; output_shape wins for `pair`."""
    emb, _, _ = new_embedding("sgd")
    try:
        shapes = {"watched": [B, mc.WIDTH], "liked": [B], "pair": [B, None],
                  "friends": [B, None], "seq/history": [B, 5]}
        emb.build(per_replica_input_shapes=mc.nested(
            {p: tf.TensorShape(s) for p, s in shapes.items()}))
        mc.run_training(tf.distribute.get_strategy(), emb, "sgd",
                        [("direct", False), ("direct", True)])
    finally:
        emb.shutdown()


# =============================================================== checkpoints

def _ckpt_values(path):
    reader = tf.train.load_checkpoint(path)
    return {k: reader.get_tensor(k) for k, _ in tf.train.list_variables(path)
            if k.startswith("embedding/")}


def _key(table, slot=None):
    return "embedding/%s%s/.ATTRIBUTES/VARIABLE_VALUE" % (table, "" if slot is None
                                                          else ".S" + slot)


def _assert_state_equal(got, want, what):
    for n in want:
        assert len(got[n]) == len(want[n]), (what, n)
        for k, (g, w) in enumerate(zip(got[n], want[n])):
            np.testing.assert_array_equal(g, w, err_msg="%s: %s state %d" % (what, n, k))


def test_checkpoint_ours_to_ours_bit_exact(tmp_path):
    """Save after two Adam steps; the file holds the engine's tables and slots
    (TF's names); train on; restore: tables + slots are bit-exact the saved
    ones, lookups use them, and replaying the step after the save reproduces
    the same state bit for bit (so the slots reached the engine too)."""
    slots = SLOTS["adam"]
    emb, _, _ = new_embedding("adam")
    try:
        mc.run_training(tf.distribute.get_strategy(), emb, "adam",
                        [("direct", False), ("direct", True)])
        ckpt = tf.train.Checkpoint(embedding=emb)
        path = ckpt.save(str(tmp_path / "ours"))
        saved_engine = mc.engine_state(emb, slots)
        on_disk = _ckpt_values(path)
        assert sorted(on_disk) == sorted(_key(n, s) for n in mc.TABLES
                                         for s in [None] + slots)
        saved = {n: [on_disk[_key(n)]] + [on_disk[_key(n, s)] for s in slots]
                 for n in mc.TABLES}
        _assert_state_equal(saved_engine, saved, "engine vs file")
        assert np.abs(saved["video"][1]).max() > 0  # momenta were trained

        trainer = mc.Trainer(tf.distribute.get_strategy(), emb)
        rng = np.random.default_rng(11)
        step_x = (mc.make_batch(rng), mc.make_grads(rng))
        trainer.step(*step_x, "direct", False)
        after_x = mc.engine_state(emb, slots)
        trainer.step(mc.make_batch(rng), mc.make_grads(rng), "direct", True)
        assert not np.array_equal(mc.engine_state(emb, slots)["video"][2], saved["video"][2])

        ckpt.restore(path).assert_consumed()
        _assert_state_equal(mc.engine_state(emb, slots), saved, "after restore")
        raw = mc.make_batch(rng)
        got = lookup(emb, raw)
        mc.compare_activations(got, mc.reference_forward(
            {n: s[0] for n, s in saved.items()}, raw), "lookup after restore", 1e-6, 1e-6)
        trainer.step(*step_x, "direct", False)
        _assert_state_equal(mc.engine_state(emb, slots), after_x, "replayed step")
    finally:
        emb.shutdown()


def test_checkpoint_ours_to_tpu_embedding_for_serving(tmp_path):
    """TF's TPUEmbeddingForServing (same feature config, fresh objects)
    restores our checkpoint: its variables equal ours bit for bit and its
    CPU lookups equal our dequeue for the same inputs."""
    slots = SLOTS["ftrl"]
    emb, _, _ = new_embedding("ftrl")
    rng = np.random.default_rng(12)
    try:
        mc.run_training(tf.distribute.get_strategy(), emb, "ftrl",
                        [("direct", False), ("direct", False)])
        path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "ours"))
        ours = mc.engine_state(emb, slots)
        raw = mc.make_batch(rng)
        ours_act = lookup(emb, raw)
    finally:
        emb.shutdown()

    fc, tables = mc.make_feature_config(B, initial={n: np.zeros((v, d), np.float32)
                                                    for n, (v, d, _) in mc.TABLES.items()})
    serving = E.TPUEmbeddingForServing(fc, mc.optimizer_case("ftrl")[0])
    serving.build()
    tf.train.Checkpoint(embedding=serving).restore(path).assert_consumed()
    for n, table in tables.items():
        np.testing.assert_array_equal(serving.embedding_tables[table].numpy(), ours[n][0])
        for s, value in zip(slots, ours[n][1:]):
            np.testing.assert_array_equal(serving._variables[n][s].numpy(), value)  # pylint: disable=protected-access
    features, weights = mc.to_tensors(raw)
    for name, out in [("embedding_lookup", serving.embedding_lookup(features, weights)),
                      ("serving_embedding_lookup", E.serving_embedding_lookup(
                          features, weights, serving.embedding_tables, fc))]:
        for p in mc.PATHS:
            got = mc.get(out, p).numpy()
            assert_same_lookup(got.reshape(ours_act[p].shape), ours_act[p], p,
                               "%s %s" % (name, p))
            assert list(got.shape) == mc.replica_output_shape(p, B), (p, got.shape)


def assert_same_lookup(got, ours, path, what):
    """TF's serving lookups equal ours bit for bit for unweighted features;
    weighted bags round differently (other summation order, and for mean TF
    divides Σ w·E by Σ w where the engine scales each w by 1/Σ w): <= 2 ulp."""
    if path in mc.WEIGHTED:
        np.testing.assert_allclose(got, ours, rtol=1e-6, atol=1e-7, err_msg=what)
    else:
        np.testing.assert_array_equal(got, ours, err_msg=what)


def _tf_layout_values(seed):
    """Random parameters + Adagrad accumulators (positive), per table."""
    rng = np.random.default_rng(seed)
    return {n: [rng.uniform(-2, 2, (v, d)).astype(np.float32),
                rng.uniform(0.1, 3, (v, d)).astype(np.float32)]
            for n, (v, d, _) in mc.TABLES.items()}


def _check_restored_tf_layout(emb, values, raw, what):
    """The engine holds `values` (tables + accumulators): lookups use them and
    one Adagrad step from them matches the reference."""
    got = lookup(emb, raw)
    mc.compare_activations(got, mc.reference_forward({n: v[0] for n, v in values.items()},
                                                     raw), what + " lookup", 1e-6, 1e-6)
    _assert_state_equal(mc.engine_state(emb, ["accumulators"]), values, what + " state")
    _, params, _, _ = mc.optimizer_case("adagrad")
    reference = mc.Reference({n: params for n in mc.TABLES}, {n: [0] for n in mc.TABLES})
    for n in mc.TABLES:
        reference.state[n] = [v.astype(np.float64) for v in values[n]]
    rng = np.random.default_rng(21)
    raw2, c = mc.make_batch(rng), mc.make_grads(rng)
    mc.Trainer(tf.distribute.get_strategy(), emb).step(raw2, c, "direct", False)
    reference.step(raw2, c)
    mc.compare_state(mc.engine_state(emb, ["accumulators"]), reference, what + " training")


def test_checkpoint_tf_serving_layout_to_ours(tmp_path):
    """A checkpoint written by TF's own TPUEmbeddingForServing (parameters +
    Adagrad accumulators) restores into ours after build and, deferred,
    before build (restore, then the first enqueue builds)."""
    values = _tf_layout_values(30)
    fc, tables = mc.make_feature_config(B)
    serving = E.TPUEmbeddingForServing(fc, mc.optimizer_case("adagrad")[0])
    serving.build()
    for n, table in tables.items():
        serving.embedding_tables[table].assign(values[n][0])
        serving._variables[n]["accumulators"].assign(values[n][1])  # pylint: disable=protected-access
    path = tf.train.Checkpoint(embedding=serving).save(str(tmp_path / "tf"))
    raw = mc.make_batch(np.random.default_rng(31))

    emb, _, _ = new_embedding("adagrad")
    try:
        emb.build(per_replica_batch_size=B)
        tf.train.Checkpoint(embedding=emb).restore(path).assert_consumed()
        _check_restored_tf_layout(emb, values, raw, "after build")
    finally:
        emb.shutdown()

    emb, _, _ = new_embedding("adagrad")
    try:
        status = tf.train.Checkpoint(embedding=emb).restore(path)
        assert not emb._built  # pylint: disable=protected-access
        _check_restored_tf_layout(emb, values, raw, "deferred")   # enqueue builds
        status.assert_consumed()
    finally:
        emb.shutdown()


def test_checkpoint_plain_variables_named_as_tf_to_ours(tmp_path):
    """tf.train.Checkpoint over plain tf.Variables tracked as `<table>` and
    `<table>/accumulators` (TF's TPU embedding names) restores into a built
    TPUEmbedding of ours, and the engine then uses those values."""
    values = _tf_layout_values(40)
    holder = autotrackable.AutoTrackable()
    for n, (params, acc) in values.items():
        setattr(holder, n, tf.Variable(params))
        setattr(holder, n + "/accumulators", tf.Variable(acc))
    path = tf.train.Checkpoint(embedding=holder).save(str(tmp_path / "plain"))
    assert _key("video", "accumulators") in _ckpt_values(path)

    emb, _, _ = new_embedding("adagrad")
    try:
        emb.build(per_replica_batch_size=B)
        tf.train.Checkpoint(embedding=emb).restore(path).assert_consumed()
        _check_restored_tf_layout(emb, values, mc.make_batch(np.random.default_rng(41)),
                                  "plain variables")
    finally:
        emb.shutdown()


# =============================================================== serving export

def _flat_serving_inputs(raw, paths):
    """The flat signature inputs export_serving names (see serving.py)."""
    features, weights = mc.to_tensors(raw)
    data = {}
    for p in paths:
        n = p.replace("/", "_")
        x = mc.get(features, p)
        w = weights[p] if p in mc.WEIGHTED else None
        if isinstance(x, tf.SparseTensor):
            data[n + "_indices"] = x.indices.numpy()
            data[n + "_values"] = x.values.numpy()
            data[n + "_dense_shape"] = x.dense_shape.numpy()
            if w is not None:
                data[n + "_weights"] = w.values.numpy()
        elif isinstance(x, tf.RaggedTensor):
            data[n + "_values"] = x.values.numpy()
            data[n + "_row_splits"] = x.row_splits.numpy()
            if w is not None:
                data[n + "_weights"] = w.values.numpy()
        else:
            data[n] = x.numpy()
    return data


# TF's serving lookup cannot be traced for a ragged feature with
# output_shape (tpu_embedding_for_serving.py: `if reduce_prod(output_shape)
# == batch_size` on a symbolic tensor), so `pair` stays out of the exported
# signature (it is compared eagerly in the TPUEmbeddingForServing test).
SERVED = [p for p in mc.PATHS if p != "pair"]


def test_export_serving_from_trained_embedding(tmp_path):
    """Train (Adagrad, 3 steps), export with tf_tpu_emb.export_serving (the
    object itself: embedding_tables retrieves the engine's tables), load in a
    process that never imports tf_tpu_emb: its serving signature and lookup
    function return our dequeue activations (and the model_fn's score)."""
    emb, _, _ = new_embedding("adagrad")
    scale = tf.Variable(np.linspace(-1, 1, 4).astype(np.float32), name="scale")

    def model_fn(act):
        out = {p.replace("/", "_"): mc.get(act, p) for p in SERVED}
        out["score"] = (tf.reduce_sum(act["watched"] * scale, axis=1)
                        + tf.reduce_sum(act["friends"], axis=1))
        return out

    signature = {"watched": tf.SparseTensorSpec([None, mc.WIDTH], tf.int64),
                 "liked": tf.TensorSpec([None], tf.int64),
                 "friends": tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64),
                 "seq": {"history": tf.SparseTensorSpec([None, None], tf.int64)}}
    raw = mc.make_batch(np.random.default_rng(50))
    try:
        mc.run_training(tf.distribute.get_strategy(), emb, "adagrad",
                        [("direct", False), ("direct", True), ("direct", False)])
        export_dir = str(tmp_path / "export")
        module = tf_tpu_emb.export_serving(export_dir, emb, signature, model_fn=model_fn,
                                           weighted_features=list(mc.WEIGHTED))
        trained = mc.engine_state(emb, [])
        ours = lookup(emb, raw)
    finally:
        emb.shutdown()
    for n in mc.TABLES:
        np.testing.assert_array_equal(module.tables[n].numpy(), trained[n][0])

    np.savez(tmp_path / "in.npz", **_flat_serving_inputs(raw, SERVED))
    kinds = {"sparse": "sparse", "sequence": "sparse", "ragged": "ragged", "dense": "dense"}
    case = {"dir": export_dir, "inputs": str(tmp_path / "in.npz"),
            "output": str(tmp_path / "out.npz"),
            "features": [[p, kinds[mc.FEATURES[p][1]], p in mc.WEIGHTED] for p in SERVED]}
    with open(tmp_path / "cases.json", "w") as f:
        json.dump([case], f)
    run_script([harness.common_script("serving_load_script.py"), str(tmp_path / "cases.json")],
               ok="OK 1")
    with np.load(tmp_path / "out.npz") as z:
        loaded = dict(z.items())

    score = ((ours["watched"] * scale.numpy()).sum(1) + ours["friends"].sum(1))
    for prefix in ("sig/", "lookup/"):
        for p in SERVED:
            got = loaded[prefix + p.replace("/", "_")]
            assert list(got.shape) == mc.replica_output_shape(p, B), (prefix, p, got.shape)
            assert_same_lookup(got, ours[p], p, prefix + p)
        np.testing.assert_allclose(loaded[prefix + "score"], score, rtol=1e-5, atol=1e-5)
    assert sorted(loaded["tables"]) == ["user", "video"]
