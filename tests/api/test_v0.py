"""tf_tpu_emb.TPUEmbeddingV0: TF's V0 surface on plain variables, any strategy.

* forward: equal to TF's own ``TPUEmbeddingV0`` code (run on CPU with its
  TPUStrategy check bypassed) for every input kind, combiner and weighting;
  the divergences (zero padding of gathered ragged sequences) are pinned;
* gradients: ``tf.IndexedSlices`` equal to ``tf.nn.safe_embedding_lookup_sparse``'s
  (the bare fused op: one row per id; V0: unique rows per table);
* training with Keras SGD / Adagrad / Adam equals a dense-gradient reference
  (tf.nn lookups on plain variables + the same Keras optimizer);
* TF's error texts; the ``slot_variable_creation_fn`` hook; checkpoints in
  TF's layout.  MirroredStrategy runs in tests/common/v0_strategy_script.py.
"""
import numpy as np
import pytest
import tensorflow as tf
import keras
from tensorflow.python.tpu import tpu_embedding_base
from tensorflow.python.tpu import tpu_embedding_v1

import tf_tpu_emb
from tf_tpu_emb import embedding_bag as bag_lib
from tf_tpu_emb.v0 import TPUEmbeddingV0, keras_slot_variable_creation_fn
import harness  # tests/common: the one way to start a child process

E = tf.tpu.experimental.embedding
B = 6
L = 3
COMBINERS = ["sum", "mean", "sqrtn"]


# ------------------------------------------------------------------ helpers

def tf_v0(feature_config, optimizer=None):
    """TF's own TPUEmbeddingV0, minus its TPUStrategy check (its lookups are
    plain TF ops; outside a TPU context outside_compilation just calls)."""
    emb = tpu_embedding_v1.TPUEmbeddingV0.__new__(tpu_embedding_v1.TPUEmbeddingV0)
    tpu_embedding_base.TPUEmbeddingBase.__init__(emb, feature_config, optimizer)
    emb._strategy = tf.distribute.get_strategy()
    emb._built = False
    return emb


def copy_tables(src, dst):
    for (ts, vs), (td, vd) in zip(src.embedding_tables.items(), dst.embedding_tables.items()):
        assert ts.name == td.name
        vd.assign(vs)


def random_sparse(rng, rows, width, vocab, weighted=False, min_len=0, max_len=None):
    max_len = width if max_len is None else max_len
    lens = rng.integers(min_len, max_len + 1, rows)
    lens[0] = 0  # an empty bag
    idx = np.array([[b, j] for b in range(rows) for j in range(lens[b])], np.int64).reshape(-1, 2)
    ids = tf.SparseTensor(idx, rng.integers(0, vocab, len(idx)).astype(np.int64), [rows, width])
    if not weighted:
        return ids, None
    w = tf.SparseTensor(idx, rng.uniform(0.5, 2.0, len(idx)).astype(np.float32), [rows, width])
    return ids, w


def random_ragged(rng, rows, vocab, weighted=False, max_len=4):
    lens = rng.integers(0, max_len + 1, rows).astype(np.int64)
    lens[1] = 0
    n = int(lens.sum())
    ids = tf.RaggedTensor.from_row_lengths(rng.integers(0, vocab, n).astype(np.int64), lens)
    if not weighted:
        return ids, None
    return ids, tf.RaggedTensor.from_row_lengths(
        rng.uniform(0.5, 2.0, n).astype(np.float32), lens)


def make_config(combiner, init_seed=0):
    video = E.TableConfig(13, 4, combiner=combiner, name="video",
                          initializer=tf.keras.initializers.RandomUniform(-1, 1, seed=init_seed))
    user = E.TableConfig(9, 3, combiner=combiner, name="user",
                         initializer=tf.keras.initializers.RandomUniform(-1, 1, seed=init_seed + 1))
    fc = {
        "watched": E.FeatureConfig(video),                       # weighted SparseTensor
        "liked": E.FeatureConfig(video),                         # dense [B]
        "friends": E.FeatureConfig(user),                        # weighted RaggedTensor
        "seq": {"history": E.FeatureConfig(user, max_sequence_length=L)},  # sparse sequence
    }
    return fc, video, user


def make_batch(rng):
    watched, watched_w = random_sparse(rng, B, 5, 13, weighted=True)
    friends, friends_w = random_ragged(rng, B, 9, weighted=True)
    history, _ = random_sparse(rng, B, 5, 9, min_len=1)
    features = {"watched": watched, "liked": tf.constant(rng.integers(0, 13, B), tf.int32),
                "friends": friends, "seq": {"history": history}}
    weights = {"watched": watched_w, "liked": None, "friends": friends_w,
               "seq": {"history": None}}
    return features, weights


def reference_lookup(video, user, features, weights, combiner):
    """Stock-op activations (tf.nn.* lookups), dense equivalents of V0's."""
    out = {
        "watched": tf.nn.safe_embedding_lookup_sparse(
            video, features["watched"], weights["watched"], combiner=combiner),
        "liked": tf.nn.embedding_lookup(video, features["liked"]),
        "friends": tf.nn.safe_embedding_lookup_sparse(
            user, features["friends"].to_sparse(), weights["friends"].to_sparse(),
            combiner=combiner),
    }
    hist = features["seq"]["history"]
    ids = tf.sparse.to_dense(hist)
    mask = tf.cast(tf.sparse.to_dense(tf.SparseTensor(hist.indices, tf.ones_like(hist.values),
                                                      hist.dense_shape)), tf.float32)
    rows = tf.nn.embedding_lookup(user, ids) * mask[..., None]
    width = rows.shape[1]
    rows = rows[:, :L] if width >= L else tf.pad(rows, [[0, 0], [0, L - width], [0, 0]])
    out["seq"] = {"history": rows}
    return out


def loss_of(acts, coefs):
    return tf.add_n([tf.reduce_sum(a * c) for a, c in zip(tf.nest.flatten(acts),
                                                          tf.nest.flatten(coefs))])


def coefficients(rng):
    def c(*shape):
        return tf.constant(rng.normal(size=shape), tf.float32)
    return {"watched": c(B, 4), "liked": c(B, 4), "friends": c(B, 3),
            "seq": {"history": c(B, L, 3)}}


# ------------------------------------------------------------------ forward

@pytest.mark.parametrize("combiner", COMBINERS)
def test_forward_equals_tf_v0(combiner):
    rng = np.random.default_rng(1)
    t = E.TableConfig(11, 4, combiner=combiner, name="t")
    fc = {"sparse": E.FeatureConfig(t), "sparse_w": E.FeatureConfig(t),
          "rank3": E.FeatureConfig(t), "dense": E.FeatureConfig(t),
          "dense2d": E.FeatureConfig(t), "ragged": E.FeatureConfig(t),
          "ragged_w": E.FeatureConfig(t), "ragged_out": E.FeatureConfig(t, output_shape=[3, 2]),
          "seq_short": E.FeatureConfig(t, max_sequence_length=2),
          "seq_long": E.FeatureConfig(t, max_sequence_length=7)}
    ours = TPUEmbeddingV0(fc)
    theirs = tf_v0(fc)
    copy_tables(ours, theirs)

    sp, _ = random_sparse(rng, B, 4, 11)
    sp_w, w = random_sparse(rng, B, 4, 11, weighted=True)
    # A bag whose weights sum to 0: mean/sqrtn use div_no_nan on both sides.
    zero = tf.SparseTensor([[0, 0], [0, 1]], tf.constant([1, 2], tf.int64), [B, 4])
    w = tf.sparse.add(w, tf.SparseTensor([[0, 0], [0, 1]], [1.0, -1.0], [B, 4]))
    sp_w = tf.sparse.add(sp_w, zero)
    r3 = tf.sparse.reorder(tf.SparseTensor([[0, 0, 0], [0, 0, 2], [1, 1, 1], [2, 0, 0]],
                                           tf.constant([3, 4, 5, 6], tf.int64), [3, 2, 3]))
    rg, _ = random_ragged(rng, B, 11)
    rg_w, rw = random_ragged(rng, B, 11, weighted=True)
    features = {"sparse": sp, "sparse_w": sp_w, "rank3": r3,
                "dense": tf.constant(rng.integers(0, 11, B)),
                "dense2d": tf.constant(rng.integers(0, 11, (B, 2)), tf.int32),
                "ragged": rg, "ragged_w": rg_w, "ragged_out": rg,
                "seq_short": sp, "seq_long": sp}
    weights = {k: None for k in features}
    weights.update(sparse_w=w, ragged_w=rw)
    got = ours(features, weights)
    want = theirs(features, weights)
    for key in features:
        assert got[key].shape == want[key].shape, key
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)

    @tf.function
    def traced(f, w):
        return ours(f, w)
    got = traced(features, weights)
    for key in features:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=key)


def test_gathered_ragged_sequences_pad_with_zeros():
    """TF's V0 pads ragged sequences with id 0 at weight 1 (table[0]); we pad
    with zeros, as TF's sparse sequences, the engine and TF's serving lookup."""
    t = E.TableConfig(5, 2, name="t", initializer=tf.keras.initializers.Constant(1.0))
    fc = {"seq": E.FeatureConfig(t, max_sequence_length=3),
          "pairs": E.FeatureConfig(t, output_shape=[2, 2])}
    ours = TPUEmbeddingV0(fc)
    theirs = tf_v0(fc)
    ours.embedding_tables[t].assign(tf.reshape(tf.range(10, dtype=tf.float32), [5, 2]))
    copy_tables(ours, theirs)
    features = {"seq": tf.ragged.constant([[1, 2, 3, 4], [2]], tf.int64),
                "pairs": tf.ragged.constant([[3], [4, 1, 2]], tf.int64)}
    got = ours(features)
    want_seq = [[[2, 3], [4, 5], [6, 7]], [[4, 5], [0, 0], [0, 0]]]
    np.testing.assert_array_equal(got["seq"], want_seq)
    np.testing.assert_array_equal(got["pairs"], [[[6, 7], [0, 0]], [[8, 9], [2, 3]]])
    serving = E.serving_embedding_lookup(features, None, ours.embedding_tables, fc)
    np.testing.assert_array_equal(got["seq"], serving["seq"])
    np.testing.assert_array_equal(got["pairs"], serving["pairs"])
    # TF's V0: table[0] = [0, 1] in the padding.
    np.testing.assert_array_equal(theirs(features)["seq"][1, 1], [0, 1])


def test_serving_lookup_matches_v0():
    rng = np.random.default_rng(2)
    for combiner in COMBINERS:
        fc, _, _ = make_config(combiner)
        emb = TPUEmbeddingV0(fc)
        features, weights = make_batch(rng)
        got = emb(features, weights)
        want = E.serving_embedding_lookup(features, weights, emb.embedding_tables, fc)
        for a, b in zip(tf.nest.flatten(got), tf.nest.flatten(want)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize("combiner", COMBINERS)
def test_fused_gradient_equals_safe_embedding_lookup_sparse(combiner):
    rng = np.random.default_rng(3)
    table = tf.Variable(rng.normal(size=(10, 3)).astype(np.float32))
    ids, w = random_sparse(rng, 7, 5, 10, weighted=True, min_len=1)
    ids = tf.sparse.concat(1, [ids, tf.SparseTensor([[1, 0], [1, 1]], tf.constant([4, 4], tf.int64),
                                                    [7, 2])])
    w = tf.sparse.concat(1, [w, tf.SparseTensor([[1, 0], [1, 1]], [0.5, 1.5], [7, 2])])
    coef = tf.constant(rng.normal(size=(7, 3)), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        ours = bag_lib.embedding_bag(table, ids, w, combiner=combiner)
        ref = tf.nn.safe_embedding_lookup_sparse(table, ids, w, combiner=combiner)
        l_ours, l_ref = tf.reduce_sum(ours * coef), tf.reduce_sum(ref * coef)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    g_ours, g_ref = tape.gradient(l_ours, table), tape.gradient(l_ref, table)
    assert isinstance(g_ours, tf.IndexedSlices) and isinstance(g_ref, tf.IndexedSlices)
    assert g_ours.values.shape[0] == ids.values.shape[0]  # one row per id
    np.testing.assert_allclose(tf.convert_to_tensor(g_ours), tf.convert_to_tensor(g_ref),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_v0_gradients_are_indexed_slices_with_unique_rows(traced):
    rng = np.random.default_rng(4)
    fc, video, user = make_config("mean")
    emb = TPUEmbeddingV0(fc)
    ref_tables = {t: tf.Variable(v) for t, v in emb.embedding_tables.items()}
    features, weights = make_batch(rng)
    coefs = coefficients(rng)

    def grads():
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(emb.embedding_tables.values())
            loss = loss_of(emb(features, weights), coefs)
            ref = loss_of(reference_lookup(ref_tables[video], ref_tables[user], features,
                                           weights, "mean"), coefs)
        return (tape.gradient(loss, list(emb.embedding_tables.values())),
                tape.gradient(ref, list(ref_tables.values())))

    ours, ref = tf.function(grads)() if traced else grads()
    for g, r in zip(ours, ref):
        assert isinstance(g, tf.IndexedSlices)
        idx = g.indices.numpy()
        assert len(np.unique(idx)) == len(idx)
        np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(r),
                                   rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------- training

OPTIMIZERS = {
    "sgd": (lambda: keras.optimizers.SGD(0.3), lambda fn: E.SGD(0.3)),
    "adagrad": (lambda: keras.optimizers.Adagrad(0.3),
                lambda fn: E.Adagrad(0.3, slot_variable_creation_fn=fn)),
    "adam": (lambda: keras.optimizers.Adam(0.05),
             lambda fn: E.Adam(0.05, slot_variable_creation_fn=fn)),
}


@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_matches_dense_reference(name, combiner):
    make_keras, make_embedding_opt = OPTIMIZERS[name]
    rng = np.random.default_rng(5)
    fc, video, user = make_config(combiner)
    opt = make_keras()
    emb = TPUEmbeddingV0(fc, make_embedding_opt(keras_slot_variable_creation_fn(opt)))
    ref_opt = make_keras()
    # Plain variables in embedding_tables order (user first: sorted feature keys).
    ref_vars = [tf.Variable(v, name="ref_" + t.name) for t, v in emb.embedding_tables.items()]
    ref = {t.name: v for t, v in zip(emb.embedding_tables, ref_vars)}

    @tf.function
    def step(features, weights, coefs):
        # TF's documented V0 training step.
        with tf.GradientTape() as tape:
            tape.watch(emb.embedding_tables.values())
            loss = loss_of(emb(features, weights), coefs)
        tables = list(emb.embedding_tables.values())
        opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss

    def ref_step(features, weights, coefs):
        with tf.GradientTape() as tape:
            loss = loss_of(reference_lookup(ref["video"], ref["user"], features, weights,
                                            combiner), coefs)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, ref_vars)]  # dense
        ref_opt.apply_gradients(zip(grads, ref_vars))
        return loss

    for _ in range(3):
        features, weights = make_batch(rng)
        coefs = coefficients(rng)
        np.testing.assert_allclose(step(features, weights, coefs),
                                   ref_step(features, weights, coefs), rtol=1e-4, atol=1e-4)
    for v, r in zip(emb.embedding_tables.values(), ref_vars):
        np.testing.assert_allclose(v, r, rtol=1e-5, atol=1e-6)
    # The hook made the embedding optimizer's slots the Keras optimizer's own.
    own = {id(v) for v in opt.variables}
    ref_slots = [v for v in ref_opt.variables if "ref_" in v.path]
    slots = [s for t in emb.embedding_tables for k, s in sorted(emb._variables[t.name].items())
             if k != "parameters"]
    assert len(slots) == len(ref_slots) == {"sgd": 0, "adagrad": 2, "adam": 4}[name]
    assert all(id(s) in own for s in slots)
    assert len(opt.variables) == len(ref_opt.variables)
    for s, r in zip(slots, ref_slots):
        np.testing.assert_allclose(s, r, rtol=1e-5, atol=1e-6)


def test_slot_variable_creation_fn_as_in_tf_docstring():
    """TF's docstring hook, written for Keras 3 (``add_slot`` is Keras 2's
    name; Keras 3 has ``add_variable_from_reference``)."""
    optimizer = keras.optimizers.Adagrad(learning_rate=0.1)

    def slot_variable_creation_fn(table, slot_names, slot_initializers):
        slots = {}
        for slot, initializer in zip(slot_names, slot_initializers):
            slots[slot] = optimizer.add_variable_from_reference(table, slot, initializer)
        return slots

    embedding_optimizer = E.Adagrad(learning_rate=0.1,
                                    slot_variable_creation_fn=slot_variable_creation_fn)
    t = E.TableConfig(8, 2, name="t")
    emb = TPUEmbeddingV0({"f": E.FeatureConfig(t)}, embedding_optimizer)
    emb.build()
    slot = emb._variables["t"]["accumulators"]
    assert any(slot is v for v in optimizer.variables)
    np.testing.assert_allclose(slot, np.full((8, 2), 0.1))
    with tf.GradientTape() as tape:
        tape.watch(emb.embedding_tables.values())
        loss = tf.reduce_sum(emb({"f": tf.constant([1, 1, 2])})["f"])
    tables = list(emb.embedding_tables.values())
    before = tables[0].numpy()
    optimizer.apply_gradients(zip(tape.gradient(loss, tables), tables))
    assert not np.allclose(before, tables[0].numpy())

    # keras_slot_variable_creation_fn: the same slot *is* Keras' accumulator.
    opt2 = keras.optimizers.Adagrad(0.1)
    t2 = E.TableConfig(8, 2, name="t2")
    slots2 = keras_slot_variable_creation_fn(opt2)
    emb2 = TPUEmbeddingV0({"f": E.FeatureConfig(t2)},
                          E.Adagrad(0.1, slot_variable_creation_fn=slots2))
    tables2 = list(emb2.embedding_tables.values())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb2({"f": tf.constant([1, 1, 2])})["f"])
    opt2.apply_gradients(zip(tape.gradient(loss, tables2), tables2))
    assert emb2._variables["t2"]["accumulators"] is opt2._accumulators[0]
    np.testing.assert_allclose(opt2._accumulators[0].numpy()[[0, 1, 2]],
                               [[0.1, 0.1], [4.1, 4.1], [1.1, 1.1]], rtol=1e-6)
    with pytest.raises(ValueError, match="already built"):
        TPUEmbeddingV0({"f": E.FeatureConfig(E.TableConfig(4, 2, name="t3"))},
                       E.Adagrad(0.1, slot_variable_creation_fn=slots2)).build()


# ------------------------------------------------------------------- errors

def _error(fn):
    try:
        fn()
    except Exception as e:  # pylint: disable=broad-except
        return type(e), str(e)
    return None


def test_errors_match_tf_v0():
    t = E.TableConfig(10, 2, name="t")
    fc = {"a": E.FeatureConfig(t), "s": E.FeatureConfig(t, max_sequence_length=2),
          "o": E.FeatureConfig(t, output_shape=[5])}
    ours, theirs = TPUEmbeddingV0(fc), tf_v0(fc)
    sp = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), [2, 3])
    rg = tf.ragged.constant([[1], [2, 3]], tf.int64)
    ok = {"a": sp, "s": sp, "o": tf.ragged.constant([[1]] * 5, tf.int64)}
    cases = {
        "weight_for_dense": ({**ok, "a": tf.constant([1, 2])},
                             {"a": sp, "s": None, "o": None}),
        "weight_type": (ok, {"a": rg, "s": None, "o": None}),
        "weight_for_sequence": (ok, {"a": None, "s": sp, "o": None}),
        "dense_for_sequence": ({**ok, "s": tf.constant([1, 2])}, None),
        "ragged_rank_3": ({**ok, "a": tf.ragged.constant([[[1]], [[2], [3]]], tf.int64)}, None),
        "output_shape_not_factor": ({**ok, "o": tf.ragged.constant([[1], [2]] * 3, tf.int64)},
                                    None),
        "input_type": ({**ok, "a": np.array([1, 2])}, None),
        "structure": ({"a": sp, "s": sp}, None),
        "weights_structure": (ok, {"a": None}),
    }
    for name, (features, weights) in cases.items():
        want = _error(lambda: theirs(features, weights))
        assert want is not None, name
        assert _error(lambda: ours(features, weights)) == want, name
    assert "Weight specified for a, but input is dense." == _error(
        lambda: ours(*cases["weight_for_dense"]))[1]
    assert "Feature s is a sequence feature but a dense tensor was passed." == _error(
        lambda: ours(*cases["dense_for_sequence"]))[1]

    t.combiner = "max"
    assert _error(lambda: ours(ok)) == _error(lambda: theirs(ok)) == (
        ValueError, "combiner must be one of 'mean', 'sqrtn' or 'sum', got max")

    # TPUEmbeddingBase's constructor checks.
    dup = {"a": E.FeatureConfig(E.TableConfig(4, 2, name="x")),
           "b": E.FeatureConfig(E.TableConfig(4, 2, name="x"))}
    assert _error(lambda: TPUEmbeddingV0(dup)) == (
        ValueError, "Tables must have a unique name. Multiple tables with name x found.")
    bad = E.FeatureConfig(E.TableConfig(4, 2, name="y"))
    assert _error(lambda: TPUEmbeddingV0(bad, keras.optimizers.SGD()))[1].endswith(
        "is an unsupported optimizer class. Please pass an instance of one of the optimizer "
        "classes under tf.tpu.experimental.embedding.")
    # Unlike TF's class, any strategy works (TF's refuses the default one).
    fresh = E.FeatureConfig(E.TableConfig(4, 2, name="y"))
    assert "should be created under TPUStrategy" in _error(
        lambda: tpu_embedding_v1.TPUEmbeddingV0(fresh, None))[1]
    assert TPUEmbeddingV0(E.FeatureConfig(E.TableConfig(4, 2, name="z"))).embedding_tables


def test_surface_and_checkpoint_layout(tmp_path):
    assert tf_tpu_emb.TPUEmbeddingV0 is TPUEmbeddingV0
    assert issubclass(TPUEmbeddingV0, tpu_embedding_base.TPUEmbeddingBase)
    fc, video, user = make_config("sum")
    emb = TPUEmbeddingV0(fc, E.Adagrad(0.1))
    assert list(emb.embedding_tables) == [user, video]  # first appearance in sorted-key order
    single = TPUEmbeddingV0(E.FeatureConfig(E.TableConfig(4, 2, name="single")))
    out = single(tf.constant([[1], [2]]))
    assert out.shape == (2, 1, 2)
    # Checkpoint keys are TF's V0 ones: <table>, <table>/<slot>.
    fc2, _, _ = make_config("sum")
    theirs = tf_v0(fc2, E.Adagrad(0.1))
    theirs.build()
    path = str(tmp_path / "ckpt")
    saved = tf.train.Checkpoint(embedding=emb).write(path)
    keys = sorted(k for k, _ in tf.train.list_variables(saved) if k.startswith("embedding/"))
    their_saved = tf.train.Checkpoint(embedding=theirs).write(path + "_tf")
    their_keys = sorted(k for k, _ in tf.train.list_variables(their_saved)
                        if k.startswith("embedding/"))
    assert keys == their_keys and any("video.Saccumulators" in k for k in keys)
    # ... so TF's class restores what ours wrote.
    tf.train.Checkpoint(embedding=theirs).read(saved).assert_consumed()
    for a, b in zip(emb.embedding_tables.values(), theirs.embedding_tables.values()):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------- MirroredStrategy

@pytest.mark.system
def test_mirrored_strategy_two_cpus():
    proc = harness.run_python([harness.common_script("v0_strategy_script.py"), "v0"],
                              timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
