"""The training path's Python side (tf_tpu_emb.gradients) against the engine.

Every training test runs real steps (enqueue -> Recv -> hooked activations ->
loss -> gradient -> SendTPUEmbeddingGradients), retrieves the tables and
compares them with a numpy SGD reference written from the spec (§4.3: row
``id`` moves by ``-lr * sum over occurrences of (w_k / N_bag) * dL/da_bag``),
with ``dL/da`` computed in numpy from the activations the step really used.
A step that reached the engine twice, or not at all, or with a gradient in
the wrong rows, cannot match.

Modes covered: TF1 graphs (tf.compat.v1 Graph + Session, the graph-collection
protocol, our op and TF's core op), TF2 eager GradientTape, tf.function,
Keras optimizer loops (eager and tf.function), hook_step inside a TF1 graph
with a v1 optimizer; table configs (v1 slicing, a sequence feature and two
features on one table) and feature-descriptor configs; dynamic learning rates;
Send-after-Recv ordering with a loss linear in the activations; two replicas.
"""
import collections
import os
import sys
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from tf_tpu_emb import gradients as G
from tf_tpu_emb import ops as tte_ops
import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.usefixtures("lib")

B = 4
L = 2                # sequence length of the table-mode sequence feature
LR = 0.1             # engine_util's constant learning rate
SGD = "stochastic_gradient_descent"

# Feature-mode scenario: two features share the video table, with disjoint id
# ranges so the rows of each feature are known.
FEATURES = [("watched", 0, (0, 6)), ("friends", 1, (0, 16)), ("favorited", 0, (6, 10))]
COMBINERS = {0: "mean", 1: "sqrtn"}  # per table


def _tables(video_lr_tag=None):
    return [TableSpec("video", 10, 4, SGD, lr_tag=video_lr_tag), TableSpec("user", 16, 3, SGD)]


def _feature_config(video_lr_tag=None):
    return eu.feature_mode_config(_tables(video_lr_tag),
                                  [FeatureSpec(n, t, [B]) for n, t, _ in FEATURES])


def _bags(rng, lo, hi, n=B):
    bags = eu.random_bags(rng, n, hi - lo, weighted=True)
    return [[(i + lo, w) for i, w in bag] for bag in bags]


def _feature_batch(rng):
    """{feature: bags} and the ArbitraryTensorBatch enqueue arguments."""
    bags = collections.OrderedDict((n, _bags(rng, lo, hi)) for n, _, (lo, hi) in FEATURES)
    args = [eu.sparse_to_enqueue(*eu.bags_to_sparse(b)) for b in bags.values()]
    return bags, args


def _enqueue_features(args):
    eu.enqueue_arbitrary(args, combiners=[COMBINERS[0], COMBINERS[1]])


def _graph_enqueue(args):
    """The enqueue as an op of the current TF1 graph (arguments as constants)."""
    return tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
        sample_indices_or_row_splits=[np.asarray(a[0]) for a in args],
        embedding_indices=[np.asarray(a[1]) for a in args],
        aggregation_weights=[np.asarray(a[2]) for a in args], combiners=["mean", "sqrtn"],
        mode_override="unspecified")


def _recv(layout):
    return tf.raw_ops.RecvTPUEmbeddingActivations(
        num_outputs=len(layout.output_shapes), config=layout.config)


def _targets(layout, seed):
    """Random R_f per feature for the loss sum(R_f * a_f) + 0.5 * sum(a_f^2),
    whose gradient is R_f + a_f."""
    rng = np.random.default_rng(seed)
    return {f.name: rng.standard_normal(f.shape).astype(np.float32) for f in layout.features}


def _loss(acts, targets, use=None):
    use = list(acts) if use is None else use
    return tf.add_n([tf.reduce_sum(targets[n] * acts[n]) + 0.5 * tf.reduce_sum(acts[n] ** 2)
                     for n in use])


def _sgd(table, contributions, lr=LR):
    """numpy SGD: contributions = [(bags, dL/da per bag [n_bags, D], combiner)]."""
    grad = np.zeros(table.shape, np.float64)
    for bags, g, combiner in contributions:
        g = np.asarray(g, np.float64).reshape(len(bags), -1)
        for bag, gb in zip(bags, g):
            if not bag:
                continue
            w = np.array([wk for _, wk in bag], np.float64)
            norm = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
            for (i, wk) in bag:
                grad[i] += wk / norm * gb
    return table - lr * grad


def _expected_feature_mode(before, bags, grads, lrs=(LR, LR)):
    """Expected {table: parameters} after one step of the feature scenario."""
    out = {}
    for t, name in enumerate(("video", "user")):
        contributions = [(bags[n], grads[n], COMBINERS[t]) for n, tt, _ in FEATURES
                         if tt == t and grads.get(n) is not None]
        out[name] = _sgd(before[name][0], contributions, lrs[t])
    return out


def _retrieve(config):
    return {d.name: eu.retrieve_table(d)[0] for d in config.table_descriptor}


def _assert_tables(config, want):
    got = _retrieve(config)
    for name in want:
        eu.assert_close(got[name], want[name], rtol=1e-5, atol=1e-5, what="table " + name)


# ================================================================== layout

def test_layout_feature_mode_lookup_ids_and_shapes():
    config = eu.feature_mode_config(
        [TableSpec("a", 5, 2, SGD), TableSpec("b", 5, 3, SGD, lr_tag=0)],
        [FeatureSpec("x", 0, [4]), FeatureSpec("y", 1, [4, 3]), FeatureSpec("z", 0, [2, 2])])
    layout = G.Layout.from_config(config)
    assert layout.feature_mode and layout.num_dynamic_inputs == 1
    assert [(f.name, f.table_id, f.lookup_id, f.output, f.shape) for f in layout.features] == [
        ("x", 0, 0, 0, (4, 2)), ("y", 1, 0, 1, (4, 3, 3)), ("z", 0, 1, 2, (2, 2, 2))]
    assert layout.output_tables == (0, 1, 0)
    assert [list(s) for s in layout.output_shapes] == eu.output_shapes(config)
    assert layout.config == config.SerializeToString()
    assert G.Layout.from_config(config.SerializeToString()) == layout
    with pytest.raises(ValueError, match="table_features is only for"):
        G.Layout.from_config(config, [["x"]])


def test_layout_table_mode():
    config = eu.table_mode_config([TableSpec("a", 5, 2, SGD, num_features=L + 1),
                                   TableSpec("b", 5, 3, SGD, num_features=1)], B)
    layout = G.Layout.from_config(config, {"a": [("s", L), "p"], "b": ["q"]})
    assert not layout.feature_mode and layout.batch_size == B
    assert [(f.name, f.table_id, f.lookup_id, f.offset, f.width, f.shape)
            for f in layout.features] == [("s", 0, 0, 0, L, (B, L, 2)),
                                          ("p", 0, 1, L, 1, (B, 2)),
                                          ("q", 1, 0, 0, 1, (B, 3))]
    assert layout.output_shapes == ((B * (L + 1), 2), (B, 3))
    assert G.Layout.from_config(config, [[("s", L), "p"], ["q"]]) == layout
    with pytest.raises(ValueError, match="needs table_features"):
        G.Layout.from_config(config)
    with pytest.raises(ValueError, match="num_features 3 but .* take 2 rows"):
        G.Layout.from_config(config, [["s", "p"], ["q"]])
    with pytest.raises(ValueError, match="unique"):
        G.Layout.from_config(config, [[("s", L), "q"], ["q"]])
    with pytest.raises(ValueError, match="unknown table"):
        G.Layout.from_config(config, {"a": [("s", L), "p"], "c": ["q"]})


def test_send_inputs_are_the_inverse_of_slicing():
    """send_gradients_op(slice_activations(x)) hands the Send exactly x, in
    both modes (checked on the built op's inputs; the Send is not run)."""
    table_config = eu.table_mode_config([TableSpec("a", 5, 2, SGD, num_features=L + 2),
                                         TableSpec("b", 5, 3, SGD, num_features=1)], B)
    layouts = [G.Layout.from_config(table_config, [["p0", ("s", L), "p1"], ["q"]]),
               G.Layout.from_config(_feature_config())]
    rng = np.random.default_rng(0)
    for layout in layouts:
        x = [rng.standard_normal(s).astype(np.float32) for s in layout.output_shapes]
        with tf.Graph().as_default() as g:
            acts = G.slice_activations(layout, [tf.constant(a) for a in x])
            for f in layout.features:
                assert acts[f.name].shape == f.shape
            send = G.send_gradients_op(layout, acts)
            assert send.type == tte_ops.SEND_TPU_EMBEDDING_GRADIENTS
            assert send.get_attr("config") == layout.config
            with tf.compat.v1.Session(graph=g) as sess:
                got = sess.run(list(send.inputs))
        for a, b in zip(got, x):
            np.testing.assert_array_equal(a, b)


def test_send_gradients_op_checks_arguments():
    layout = G.Layout.from_config(_feature_config(video_lr_tag=0))
    with tf.Graph().as_default():
        grads = {f.name: tf.zeros(f.shape) for f in layout.features}
        with pytest.raises(ValueError, match="1 dynamic learning rate tag.*0 learning rates"):
            G.send_gradients_op(layout, grads)
        with pytest.raises(ValueError, match="unknown feature"):
            G.send_gradients_op(layout, dict(grads, nope=tf.zeros([1])), [0.1])
        with pytest.raises(ValueError, match="Found gradient of shape .* 'friends'"):
            G.send_gradients_op(layout, dict(grads, friends=tf.zeros([B, 4])), [0.1])
        send = G.send_gradients_op(layout, grads, [0.5])
        assert len(send.inputs) == 3 + 1


# ============================================ TF1 graphs: the collection protocol

NON_TRAINING = ("Gradients for TPUEmbedding have been generated in non-training mode.This is "
                "not expected. Consider putting your Optimizer.minimize code behind the "
                "training mode condition check\n")
OUT_OF_RANGE = ("Gradients (w.r.t. TPUEmbedding activations) generated for table_id 0 and "
                "lookup_id 1. The lookup_id attribute is outside the expected range [0, 1).")
DUPLICATE = ("Duplicate gradients (w.r.t. TPUEmbedding activations) generated for table_id 0 "
             "and lookup_id 0. This happens when there are multiple calls to tf.gradients in "
             "a graph containing TPU embeddings. TF cannot identify which gradient to use for "
             "updating the embedding variables. Consider placing tf.StopGradient around "
             "tensors where variable update is not required. Previous gradients were "
             "generated by the following callstack: ")

OP_KINDS = ["prefixed", "core"]


def _activation_op(kind, variable, activation, lookup_id):
    if kind == "core":
        return tf.raw_ops.TPUEmbeddingActivations(
            embedding_variable=variable, sliced_activations=activation, table_id=0,
            lookup_id=lookup_id)
    return tte_ops.tpu_embedding_activations(variable, activation, table_id=0,
                                             lookup_id=lookup_id)


def test_gradient_is_registered_for_the_prefixed_op(lib):
    """Loading the library registers it (every op wrapper loads the library first)."""
    del lib
    fn = tf_ops.gradient_registry.lookup(tte_ops.TPU_EMBEDDING_ACTIVATIONS)
    assert fn.__module__ == "tf_tpu_emb.activation_gradient"


@pytest.mark.system
def test_importing_the_package_loads_no_tensorflow():
    """`import tf_tpu_emb` is light (the command lines answer before TF loads);
    the public names import on first access, the library loads on first use."""
    proc = harness.run_python(["-c", "import sys, tf_tpu_emb; "
                               "assert 'tensorflow' not in sys.modules, 'tf imported'; "
                               "import tf_tpu_emb.ops; "
                               "assert 'tensorflow' not in sys.modules, 'ops imported tf'; "
                               "print(tf_tpu_emb.TPUEmbedding.__name__, tf_tpu_emb.Lion.__name__)"],
                              timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["TPUEmbedding", "Lion"], \
        harness.describe(proc)


@pytest.mark.parametrize("kind", OP_KINDS)
def test_collection_protocol(kind):
    """Identity(grad) stored at [lookup_id], zeros for both inputs, and TF's
    three errors with TF's exact text (for the core op TF itself raises them,
    so passing for both kinds shows parity)."""
    with tf.Graph().as_default() as g:
        act = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
        var = tf.compat.v1.get_variable("dummy", [1], use_resource=True)
        out = _activation_op(kind, var, act, 0)
        assert out.op.type == (tte_ops.TPU_EMBEDDING_ACTIVATIONS if kind == "prefixed"
                               else "TPUEmbeddingActivations")
        loss = tf.reduce_sum(out * out)
        with pytest.raises(RuntimeError) as e:
            tf.gradients(loss, [var])
        assert str(e.value) == NON_TRAINING

        g.get_collection_ref(G.gradient_collection_name(0)).extend([None])
        grads = tf.gradients(loss, [var, act])
        stored = g.get_collection(G.gradient_collection_name(0))
        assert len(stored) == 1 and stored[0].op.type == "Identity"
        with pytest.raises(RuntimeError) as e:
            tf.gradients(loss, [var])
        assert str(e.value).startswith(DUPLICATE)

        out1 = _activation_op(kind, var, act, 1)
        with pytest.raises(RuntimeError) as e:
            tf.gradients(tf.reduce_sum(out1), [var])
        assert str(e.value) == OUT_OF_RANGE
        with tf.compat.v1.Session() as sess:
            sess.run(var.initializer)
            dvar, dact, got = sess.run([grads[0], grads[1], stored[0]])
    np.testing.assert_array_equal(dvar, [0.0])
    np.testing.assert_array_equal(dact, np.zeros((2, 3)))
    np.testing.assert_array_equal(got, 2 * np.arange(6).reshape(2, 3))


def test_create_dummy_table_variables():
    layout = G.Layout.from_config(_feature_config())
    with tf.Graph().as_default() as g:
        dummies, init = G.create_dummy_table_variables(layout)
        assert list(dummies) == ["video", "user"]
        for name, v in dummies.items():
            assert v.name == "tpu_embedding_dummy_table_variable_%s:0" % name
            assert v.shape == [1] and v.dtype == tf.float32 and v.trainable
            assert "ResourceVariable" in type(v).__name__
        assert g.get_collection(G.DUMMY_TABLE_VARIABLES_COLLECTION) == list(dummies.values())
        assert not g.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)  # Saver ignores
        assert g.get_collection(G.gradient_collection_name(0)) == [None, None]
        assert g.get_collection(G.gradient_collection_name(1)) == [None]
        assert init.name == "tpu_embedding_dummy_table_variables_init"
        with pytest.raises(RuntimeError, match="^tpu_embedding_gradients_table_0 is not empty.$"):
            G.create_dummy_table_variables({"other": 1})
    with tf.Graph().as_default() as g:  # an ordered mapping works too
        dummies, _ = G.create_dummy_table_variables(collections.OrderedDict(t=3))
        assert g.get_collection(G.gradient_collection_name(0)) == [None] * 3


@pytest.mark.parametrize("kind", OP_KINDS)
def test_tf1_graph_session_training_step(kind):
    """The v1 flow in a tf.compat.v1 Graph + Session: dummy variables, hooked
    activations, tf.gradients, collected gradients (an unused feature gets
    zeros and a warning), one Send built by send_gradients_op, run in the
    same session.run as the enqueue and Recv."""
    config = _feature_config()
    layout = G.Layout.from_config(config)
    rng = np.random.default_rng(11)
    bags, args = _feature_batch(rng)
    targets = _targets(layout, 11)
    with eu.engine(config):
        before = eu.load_random_tables(config, 11)
        with tf.Graph().as_default() as g:
            enqueue = _graph_enqueue(args)
            with tf.control_dependencies([enqueue]):
                recv = _recv(layout)
            dummies, init = G.create_dummy_table_variables(layout)
            acts = G.slice_activations(layout, recv)
            hooked = G.hook_dummy_table_variables_to_activations(layout, acts, dummies,
                                                                 use_core_op=kind == "core")
            loss = _loss(hooked, targets, use=["watched", "friends"])
            dgrads = tf.gradients(loss, list(dummies.values()))
            assert [x is None for x in g.get_collection(G.gradient_collection_name(0))] == \
                [False, True]
            with pytest.warns(G.MissingGradientWarning, match=r"\['favorited'\]"):
                feature_grads = G.get_gradients_through_dummy_table_variables(layout)
            assert list(feature_grads) == ["watched", "friends", "favorited"]
            send = G.send_gradients_op(layout, feature_grads, control_inputs=recv)
            with tf.compat.v1.Session(graph=g) as sess:
                sess.run(init)
                got_acts, got_dgrads, _ = sess.run([dict(acts), dgrads, send])
        grads = {n: targets[n] + got_acts[n] for n in ("watched", "friends")}
        want = _expected_feature_mode(before, bags, grads)
        _assert_tables(config, want)
    for d in got_dgrads:
        np.testing.assert_array_equal(d, [0.0])
    np.testing.assert_array_equal(want["video"][6:], before["video"][0][6:])  # favorited rows


def test_hook_step_in_tf1_graph_with_v1_optimizer():
    """hook_step also works with tf.gradients: a v1 optimizer's minimize over
    a dense variable and the dummy variables trains both, the Send riding on
    the dummy variables' (zero) gradient."""
    config = _feature_config()
    layout = G.Layout.from_config(config)
    bags, args = _feature_batch(np.random.default_rng(12))
    targets = _targets(layout, 12)
    with eu.engine(config):
        before = eu.load_random_tables(config, 12)
        with tf.Graph().as_default() as g:
            enqueue = _graph_enqueue(args)
            with tf.control_dependencies([enqueue]):
                recv = _recv(layout)
            scale = tf.compat.v1.get_variable("scale", [], initializer=tf.ones_initializer(),
                                              use_resource=True)
            dummies = [tf.compat.v1.get_variable("d%d" % t, [1], use_resource=True,
                                                 initializer=tf.zeros_initializer())
                       for t in range(2)]
            acts = G.hook_step(dummies, layout, recv)
            loss = scale * _loss(acts, targets)
            train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(
                loss, var_list=[scale] + dummies)
            with tf.compat.v1.Session(graph=g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                got_acts, _ = sess.run([dict(acts), train])
                new_scale = sess.run(scale)
        grads = {n: targets[n] + got_acts[n] for n in got_acts}
        _assert_tables(config, _expected_feature_mode(before, bags, grads))
    assert new_scale != 1.0


# ===================================================================== TF2

def test_eager_gradient_tape():
    config = _feature_config()
    layout = G.Layout.from_config(config)
    bags, args = _feature_batch(np.random.default_rng(21))
    targets = _targets(layout, 21)
    with eu.engine(config):
        before = eu.load_random_tables(config, 21)
        dummies = G.create_dummy_variables(layout)
        assert [v.name for v in dummies] == ["tpu_embedding_dummy_table_variable_video:0",
                                             "tpu_embedding_dummy_table_variable_user:0"]
        _enqueue_features(args)
        recv = _recv(layout)
        with tf.GradientTape() as tape:
            acts = G.hook_step(dummies, layout, recv)
            loss = _loss(acts, targets)
        for n, a in acts.items():
            assert a.dtype == tf.float32 and tuple(a.shape) == layout.feature(n).shape
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # every feature has a gradient: no warning
            dgrads = tape.gradient(loss, dummies)
        grads = {n: targets[n] + acts[n].numpy() for n in acts}
        _assert_tables(config, _expected_feature_mode(before, bags, grads))
    for d in dgrads:
        np.testing.assert_array_equal(d.numpy(), [0.0])


def test_tf_function_steps():
    """Recv, hook_step and the tape inside one tf.function, traced once and
    run for three steps; each step updates the tables exactly once."""
    config = _feature_config()
    layout = G.Layout.from_config(config)
    targets = _targets(layout, 22)
    traces = []

    with eu.engine(config):
        tables = eu.load_random_tables(config, 22)
        dummies = G.create_dummy_variables(layout)

        @tf.function
        def step():
            traces.append(1)
            recv = _recv(layout)
            with tf.GradientTape() as tape:
                acts = G.hook_step(dummies, layout, recv)
                loss = _loss(acts, targets)
            tape.gradient(loss, dummies)
            return acts

        rng = np.random.default_rng(22)
        for _ in range(3):
            bags, args = _feature_batch(rng)
            _enqueue_features(args)
            acts = step()
            grads = {n: targets[n] + acts[n].numpy() for n in acts}
            want = _expected_feature_mode(tables, bags, grads)
            _assert_tables(config, want)
            tables = {n: [w] for n, w in want.items()}
    assert len(traces) == 1


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf_function"])
def test_gradient_for_model_variables_only_still_sends(use_function):
    """The tape does not prune by sources: a gradient taken for the model's
    variables alone still runs the activations' and F's gradients, so the
    Send happens even when the dummy variables are not among the sources."""
    config = _feature_config()
    layout = G.Layout.from_config(config)
    bags, args = _feature_batch(np.random.default_rng(31))
    targets = _targets(layout, 31)
    scale = tf.Variable(1.0)
    with eu.engine(config):
        before = eu.load_random_tables(config, 31)
        dummies = G.create_dummy_variables(layout)

        def step(recv):
            with tf.GradientTape() as tape:
                acts = G.hook_step(dummies, layout, recv)
                loss = scale * _loss(acts, targets)
            return acts, tape.gradient(loss, [scale])[0]

        if use_function:
            step = tf.function(step)
        _enqueue_features(args)
        acts, dscale = step(_recv(layout))
        grads = {n: targets[n] + acts[n].numpy() for n in acts}
        _assert_tables(config, _expected_feature_mode(before, bags, grads))
    assert dscale.numpy() != 0


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf_function"])
def test_keras_optimizer_loop(use_function):
    """tape.gradient(loss, model vars + dummy vars) and keras SGD's
    apply_gradients: the dense layers train, and the engine applies each
    step's embedding gradient once (checked against dL/da from a separate
    tape over the raw activations with the pre-step weights)."""
    config = _feature_config()
    layout = G.Layout.from_config(config)
    names = [n for n, _, _ in FEATURES]
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4 + 3 + 4,)), keras.layers.Dense(3, "tanh"),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.05)
    y = tf.constant(np.linspace(-1, 1, B, dtype=np.float32).reshape(B, 1))

    def loss_fn(acts):
        x = tf.concat([acts[n] for n in names], axis=1)
        return tf.reduce_mean((model(x) - y) ** 2)

    with eu.engine(config):
        tables = eu.load_random_tables(config, 23)
        dummies = G.create_dummy_variables(layout)

        def train_step(recv):
            with tf.GradientTape() as tape:
                acts = G.hook_step(dummies, layout, recv)
                loss = loss_fn(acts)
            variables = model.trainable_variables + dummies
            grads = tape.gradient(loss, variables)
            optimizer.apply_gradients(zip(grads, variables))
            return grads

        if use_function:
            train_step = tf.function(train_step)
        rng = np.random.default_rng(23)
        for _ in range(3):
            bags, args = _feature_batch(rng)
            _enqueue_features(args)
            recv = _recv(layout)
            raw = [tf.constant(r) for r in recv]
            with tf.GradientTape() as ref_tape:
                ref_tape.watch(raw)
                ref_loss = loss_fn(dict(zip(names, raw)))
            ref_grads = dict(zip(names, [g.numpy() for g in ref_tape.gradient(ref_loss, raw)]))
            dense_before = [v.numpy() for v in model.trainable_variables]
            grads = train_step(recv)
            for v, w0, g in zip(model.trainable_variables, dense_before, grads):
                eu.assert_close(v.numpy(), w0 - 0.05 * g.numpy(), what="dense " + v.name)
            assert any(np.abs(g.numpy()).max() > 0 for g in grads[:-2])
            for g in grads[-2:]:
                np.testing.assert_array_equal(g.numpy(), [0.0])
            want = _expected_feature_mode(tables, bags, ref_grads)
            _assert_tables(config, want)
            tables = {n: [w] for n, w in want.items()}


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf_function"])
def test_missing_feature_gradient_sends_zeros(use_function):
    """A feature the loss does not use: zeros are sent (its rows untouched
    under SGD) with a MissingGradientWarning naming it."""
    config = _feature_config()
    layout = G.Layout.from_config(config)
    bags, args = _feature_batch(np.random.default_rng(24))
    targets = _targets(layout, 24)
    with eu.engine(config):
        before = eu.load_random_tables(config, 24)
        dummies = G.create_dummy_variables(layout)

        def step(recv):
            with tf.GradientTape() as tape:
                acts = G.hook_step(dummies, layout, recv)
                loss = _loss(acts, targets, use=["watched", "friends"])
            tape.gradient(loss, dummies)
            return acts

        if use_function:
            step = tf.function(step)
        _enqueue_features(args)
        with pytest.warns(G.MissingGradientWarning,
                          match="No gradient passed for feature favorited, sending zero "
                                "gradient"):
            acts = step(_recv(layout))
        grads = {n: targets[n] + acts[n].numpy() for n in ("watched", "friends")}
        want = _expected_feature_mode(before, bags, grads)
        _assert_tables(config, want)
    np.testing.assert_array_equal(want["video"][6:], before["video"][0][6:])
    assert not np.allclose(want["video"][:6], before["video"][0][:6])


def test_duplicate_gradient_in_one_step_raises():
    config = _feature_config()
    layout = G.Layout.from_config(config)
    bags, args = _feature_batch(np.random.default_rng(25))
    targets = _targets(layout, 25)
    with eu.engine(config):
        before = eu.load_random_tables(config, 25)
        dummies = G.create_dummy_variables(layout)
        _enqueue_features(args)
        with tf.GradientTape(persistent=True) as tape:
            acts = G.hook_step(dummies, layout, _recv(layout))
            loss = _loss(acts, targets)
            other = _loss(acts, targets, use=["friends"])
        tape.gradient(loss, dummies)
        with pytest.raises(RuntimeError,
                           match=r"Duplicate gradients \(w\.r\.t\. TPUEmbedding activations\) "
                                 r"generated for table_id \d and lookup_id \d \(feature '\w+'\)"):
            tape.gradient(loss, dummies)
        with pytest.raises(RuntimeError, match="table_id 1 and lookup_id 0 .feature 'friends'"):
            tape.gradient(other, dummies)
        grads = {n: targets[n] + acts[n].numpy() for n in acts}
        _assert_tables(config, _expected_feature_mode(before, bags, grads))  # applied once


def test_gradients_after_the_send_raise():
    """Two losses of one step on a persistent tape, touching different lookups:
    the second gradient would need a second Send, which is refused."""
    config = _feature_config()
    layout = G.Layout.from_config(config)
    _, args = _feature_batch(np.random.default_rng(26))
    with eu.engine(config):
        eu.load_random_tables(config, 26)
        dummies = G.create_dummy_variables(layout)
        _enqueue_features(args)
        with tf.GradientTape(persistent=True) as tape:
            acts = G.hook_step(dummies, layout, _recv(layout))
            first = tf.reduce_sum(acts["watched"])
            second = tf.reduce_sum(acts["friends"])
        with pytest.warns(G.MissingGradientWarning):
            tape.gradient(first, dummies)
        with pytest.raises(RuntimeError, match="after this step's SendTPUEmbeddingGradients"):
            tape.gradient(second, dummies)


def _seq_position_bags(seqs, length):
    """Sequence positions as size-1 'sum' bags, row-major over [B, length]."""
    return [[seq[p]] if p < len(seq) else [] for seq in seqs for p in range(length)]


@pytest.mark.parametrize("use_function", [False, True], ids=["eager", "tf_function"])
def test_table_mode_with_sequence_feature(use_function):
    """Table config: video holds a length-L sequence feature then a plain one
    (v1 row layout), user one plain feature. Sliced activations match the
    forward references and the update matches numpy."""
    config = eu.table_mode_config([TableSpec("video", 10, 4, SGD, num_features=L + 1),
                                   TableSpec("user", 16, 3, SGD, num_features=1)], B)
    layout = G.Layout.from_config(config, [[("hist", L), "watched"], ["friends"]])
    rng = np.random.default_rng(27)
    seqs = [[(int(i), 1.0) for i in rng.integers(0, 10, n)] for n in (2, 0, 1, 3)]
    watched = eu.random_bags(rng, B, 10, weighted=True)
    friends = eu.random_bags(rng, B, 16, weighted=True)
    targets = _targets(layout, 27)
    with eu.engine(config):
        before = eu.load_random_tables(config, 27)
        dummies = G.create_dummy_variables(layout)

        def step(recv):
            with tf.GradientTape() as tape:
                acts = G.hook_step(dummies, layout, recv)
                loss = _loss(acts, targets)
            tape.gradient(loss, dummies)
            return acts

        if use_function:
            step = tf.function(step)
        eu.enqueue_sparse_tensor(
            [eu.sparse_to_enqueue(eu.bags_to_sparse(seqs)[0]),
             eu.sparse_to_enqueue(*eu.bags_to_sparse(watched)),
             eu.sparse_to_enqueue(*eu.bags_to_sparse(friends))],
            table_ids=[0, 0, 1], combiners=["sum", "mean", "sqrtn"],
            max_sequence_lengths=[L, 0, 0])
        acts = {n: a.numpy() for n, a in step(_recv(layout)).items()}
        video, user = before["video"][0], before["user"][0]
        eu.assert_close(acts["hist"], eu.reference_sequence(video, seqs, L), what="hist")
        eu.assert_close(acts["watched"], eu.reference_lookup(video, watched, "mean"))
        eu.assert_close(acts["friends"], eu.reference_lookup(user, friends, "sqrtn"))
        g = {n: targets[n] + acts[n] for n in acts}
        want = {"video": _sgd(video, [(_seq_position_bags(seqs, L), g["hist"], "sum"),
                                      (watched, g["watched"], "mean")]),
                "user": _sgd(user, [(friends, g["friends"], "sqrtn")])}
        _assert_tables(config, want)


def test_dynamic_learning_rate_tag():
    """video takes its learning rate from tag 0, read from a variable by
    learning_rate_fn inside tf.function (so a new value needs no retrace);
    user keeps its constant 0.1."""
    config = _feature_config(video_lr_tag=0)
    layout = G.Layout.from_config(config)
    assert layout.num_dynamic_inputs == 1
    targets = _targets(layout, 28)
    rate = tf.Variable(0.5)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 28)
        dummies = G.create_dummy_variables(layout)
        with pytest.raises(ValueError, match="pass learning_rate_fn"):
            G.hook_step(dummies, layout, [tf.zeros(s) for s in layout.output_shapes])

        @tf.function
        def step():
            recv = _recv(layout)
            with tf.GradientTape() as tape:
                acts = G.hook_step(dummies, layout, recv, learning_rate_fn=lambda: [rate])
                loss = _loss(acts, targets)
            tape.gradient(loss, dummies)
            return acts

        rng = np.random.default_rng(28)
        for value in (0.5, 0.25):
            rate.assign(value)
            bags, args = _feature_batch(rng)
            _enqueue_features(args)
            acts = step()
            grads = {n: targets[n] + acts[n].numpy() for n in acts}
            want = _expected_feature_mode(tables, bags, grads, lrs=(value, LR))
            _assert_tables(config, want)
            tables = {n: [w] for n, w in want.items()}


def test_send_is_ordered_after_recv_for_a_linear_loss():
    """A loss linear in the activations: the Send's inputs do not depend on
    the Recv. Inside tf.function, TF's automatic control dependencies chain
    resource-less stateful ops in program order (Recv -> Send), except TF's
    core-named enqueue ops, which it lists as order-insensitive: the enqueue
    needs its explicit control dependency, the Send is ordered twice over
    (hook_step adds its own, which is what matters in TF1 graphs below)."""
    config = _feature_config()
    layout = G.Layout.from_config(config)
    targets = _targets(layout, 29)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 29)
        dummies = G.create_dummy_variables(layout)

        @tf.function
        def step(args):
            enqueue = tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
                sample_indices_or_row_splits=[a[0] for a in args],
                embedding_indices=[a[1] for a in args],
                aggregation_weights=[a[2] for a in args], combiners=["mean", "sqrtn"],
                mode_override="unspecified")
            with tf.control_dependencies([enqueue]):
                recv = _recv(layout)
            with tf.GradientTape() as tape:
                acts = G.hook_step(dummies, layout, recv)
                loss = tf.add_n([tf.reduce_sum(targets[n] * a) for n, a in acts.items()])
            tape.gradient(loss, dummies)

        rng = np.random.default_rng(29)
        for _ in range(20):
            bags, args = _feature_batch(rng)
            step(args)
            want = _expected_feature_mode(tables, bags, targets)
            _assert_tables(config, want)
            tables = {n: [w] for n, w in want.items()}


@pytest.mark.parametrize("api", ["hook_step", "send_gradients_op"])
def test_send_is_ordered_after_recv_in_a_tf1_graph(api):
    """A TF1 graph has no automatic control dependencies at all: with a loss
    linear in the activations nothing but the Send's control dependency on
    the Recv (hook_step's own, or send_gradients_op's control_inputs) keeps
    session.run from running the Send first."""
    config = _feature_config()
    layout = G.Layout.from_config(config)
    targets = _targets(layout, 30)
    rng = np.random.default_rng(30)
    batches = [_feature_batch(rng) for _ in range(10)]
    with eu.engine(config):
        tables = eu.load_random_tables(config, 30)
        with tf.Graph().as_default() as g:
            placeholders = [(tf.compat.v1.placeholder(tf.int32, [None, 2]),
                             tf.compat.v1.placeholder(tf.int64, [None]),
                             tf.compat.v1.placeholder(tf.float32, [None]))
                            for _ in FEATURES]
            enqueue = tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
                sample_indices_or_row_splits=[p[0] for p in placeholders],
                embedding_indices=[p[1] for p in placeholders],
                aggregation_weights=[p[2] for p in placeholders],
                combiners=["mean", "sqrtn"], mode_override="unspecified")
            with tf.control_dependencies([enqueue]):
                recv = _recv(layout)
            if api == "hook_step":
                dummies = [tf.compat.v1.get_variable("d%d" % t, [1], use_resource=True)
                           for t in range(2)]
                acts = G.hook_step(dummies, layout, recv)
                loss = tf.add_n([tf.reduce_sum(targets[n] * a) for n, a in acts.items()])
                run = tf.gradients(loss, dummies)
                init = [v.initializer for v in dummies]
            else:
                dummies, init = G.create_dummy_table_variables(layout)
                acts = G.hook_dummy_table_variables_to_activations(
                    layout, G.slice_activations(layout, recv), dummies)
                loss = tf.add_n([tf.reduce_sum(targets[n] * a) for n, a in acts.items()])
                tf.gradients(loss, list(dummies.values()))
                run = G.send_gradients_op(
                    layout, G.get_gradients_through_dummy_table_variables(layout),
                    control_inputs=recv)
        # Not `with Session`: that would make g the default graph, and the
        # Retrieve below must run eagerly.
        sess = tf.compat.v1.Session(graph=g)
        try:
            sess.run(init)
            for bags, args in batches:
                feed = {p: np.asarray(a) for ps, arg in zip(placeholders, args)
                        for p, a in zip(ps, arg)}
                sess.run(run, feed)
                want = _expected_feature_mode(tables, bags, targets)
                _assert_tables(config, want)
                tables = {n: [w] for n, w in want.items()}
        finally:
            sess.close()


_MULTI_REPLICA_SCRIPT = r'''
import os, sys
import numpy as np
import tensorflow as tf
R, B = 2, 3
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * R)
sys.path.insert(0, sys.argv[1])
import engine_util as eu
from tf_tpu_emb import gradients as G

config = eu.feature_mode_config(
    [eu.TableSpec("video", 10, 4, "stochastic_gradient_descent")],
    [eu.FeatureSpec("a", 0, [B])], num_tensor_cores=R)
layout = G.Layout.from_config(config)
rng = np.random.default_rng(5)
bags = [eu.random_bags(rng, B, 10, weighted=True, allow_empty=False) for _ in range(R)]
with eu.engine(config):
    table = eu.load_random_tables(config, 5)["video"][0]
    dummies = G.create_dummy_variables(layout)
    for k in range(R):
        eu.enqueue_arbitrary([eu.sparse_to_enqueue(*eu.bags_to_sparse(bags[k]))],
                             combiners=["mean"], device_ordinal=k)
    steps = []
    for k in range(R):
        with tf.device("/CPU:%d" % k):
            recv = tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=1, config=layout.config)
            with tf.GradientTape() as tape:
                act = G.hook_step(dummies, layout, recv)["a"]
                loss = 0.5 * tf.reduce_sum(act ** 2)
        steps.append((tape, loss, act.numpy()))
    for tape, loss, _ in steps:  # outside any device scope
        tape.gradient(loss, dummies)
    got = eu.retrieve_table(config.table_descriptor[0])[0]
want = table.astype(np.float64)
for k, (_, _, act) in enumerate(steps):
    for bag, g in zip(bags[k], act):
        total = sum(w for _, w in bag)
        for i, w in bag:
            want[i] -= 0.1 * w / total * g
eu.assert_close(got, want)
print("OK")
'''


@pytest.mark.system
def test_multi_replica_sends_go_to_their_replica():
    """Two replicas (logical CPUs, so a fresh process): each replica's
    hook_step sends from its Recv's device even when tape.gradient runs
    outside that device scope; the update is the sum over both replicas."""
    proc = harness.run_python(["-c", _MULTI_REPLICA_SCRIPT, harness.COMMON], timeout=180)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
