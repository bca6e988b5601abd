"""The training path's Python side (tf_tpu_emb.gradients) in TF2: eager
GradientTape, tf.function, Keras optimizer loops (eager and tf.function), a
gradient taken for the model's variables only, a feature the loss does not
use, duplicate gradients and gradients after the Send, a table config (v1
slicing, a sequence feature and two features on one table), dynamic learning
rates, Send-after-Recv ordering with a loss linear in the activations, and
two replicas.  Every training test runs real steps (enqueue -> Recv ->
hooked activations -> loss -> gradient -> SendTPUEmbeddingGradients),
retrieves the tables and compares them with the numpy SGD reference of
gradients_common.py (spec §4.3), with ``dL/da`` computed in numpy from the
activations the step really used: a step that reached the engine twice, or
not at all, or with a gradient in the wrong rows, cannot match.
"""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
import harness  # tests/common: the one way to start a child process
from engine_util import TableSpec
from gradients_common import (B, FEATURES, L, LR, SGD, _assert_tables, _enqueue_features,
                              _expected_feature_mode, _feature_batch, _feature_config, _loss,
                              _recv, _sgd, _targets)
from tf_tpu_emb import gradients as G

pytestmark = pytest.mark.usefixtures("lib")


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
