"""Errors in the user's terms (README "Limits and errors"): errors raised
through the mid-level API and the Keras layers name the feature by the user's
key path and the table by name; a structure mismatch lists the missing and
unexpected keys first; hyper-parameters that cannot be right are refused
(our optimizer classes, at construction; a value that is not a number, at
build) or, where TF's own classes accept them, warned about at build, naming
the table, the class and the field."""
import warnings

import pytest
import tensorflow as tf

import tf_tpu_emb
import tf_tpu_emb.keras as tte_keras
from tf_tpu_emb.optimizers import HyperParameterWarning

E = tf.tpu.experimental.embedding


def _config(nested=False):
    video = E.TableConfig(vocabulary_size=1000, dim=8, name="video", combiner="mean")
    user = E.TableConfig(vocabulary_size=500, dim=4, name="user", combiner="sum")
    friends = {"friends": E.FeatureConfig(user)}
    return {"watched": E.FeatureConfig(video), "favorited": E.FeatureConfig(video),
            **({"user": friends} if nested else friends)}


def _features(nested=False, friend=4):
    ids = lambda *v: tf.constant(v, tf.int64)  # noqa: E731
    friends = {"friends": ids(friend, 8)}
    return {"watched": ids(3, 7), "favorited": ids(1, 2),
            **({"user": friends} if nested else friends)}


@pytest.fixture(params=[False, True], ids=["flat", "nested"])
def built(request):
    emb = tf_tpu_emb.TPUEmbedding(_config(request.param), E.Adagrad(learning_rate=0.1))
    emb.build(per_replica_batch_size=2)
    yield emb, request.param
    emb.shutdown()


def test_an_id_outside_the_vocabulary_names_the_key_path_and_table(built):
    emb, nested = built
    path = "user/friends" if nested else "friends"
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"\(feature '%s', table 'user'\): embedding id 600 at index 0 is "
                             r"outside the table's vocabulary \[0, 500\)" % path):
        emb.enqueue(_features(nested, friend=600))
    # Nothing was enqueued: the next step gets the next batch.
    emb.enqueue(_features(nested))
    assert emb.dequeue()["watched"].shape == (2, 8)


def test_a_misspelled_key_is_named_first(built):
    emb, nested = built
    features = _features(nested)
    if nested:
        features["user"] = {"freinds": features["user"]["friends"]}
        missing, unexpected = "'user/friends'", "'user/freinds'"
    else:
        features["freinds"] = features.pop("friends")
        missing, unexpected = "'friends'", "'freinds'"
    with pytest.raises(ValueError) as e:
        emb.enqueue(features)
    first = str(e.value).splitlines()[0]
    assert first == ("enqueue(features) does not match the feature config: missing %s; "
                     "unexpected %s." % (missing, unexpected))
    with pytest.raises(ValueError, match=r"^enqueue\(weights\) does not match .* missing"):
        emb.enqueue(_features(nested), weights={"watched": None})
    emb.enqueue(_features(nested))
    activations = emb.dequeue()
    gradients = dict(activations)
    gradients.pop("watched")
    with pytest.raises(ValueError, match=r"^apply_gradients\(gradients\) does not match the "
                                         r"feature config: missing 'watched'; unexpected none"):
        emb.apply_gradients(gradients)


def test_keras_layer_names_the_misspelled_key():
    table = E.TableConfig(100, 4, name="video")
    layer = tte_keras.TPUEmbeddingLayer({"watched": E.FeatureConfig(table)}, E.SGD(0.1),
                                        batch_size=2)
    try:
        # Keras wraps the message ("Exception encountered when calling ...").
        with pytest.raises(ValueError, match=r"the layer's features does not match the "
                                             r"feature config: missing 'watched'; "
                                             r"unexpected 'wached'"):
            layer({"wached": tf.constant([1, 2], tf.int64)})
        out = layer({"watched": tf.constant([1, 2], tf.int64)})
        assert out["watched"].shape == (2, 4)
    finally:
        layer.release()


def _build(optimizer):
    table = E.TableConfig(vocabulary_size=10, dim=4, name="video")
    emb = tf_tpu_emb.TPUEmbedding({"watched": E.FeatureConfig(table)}, optimizer)
    try:
        emb.build(per_replica_batch_size=2)
    finally:
        emb.shutdown()


@pytest.mark.parametrize("optimizer, field", [
    (lambda: E.Adagrad(learning_rate=-0.1), "`learning_rate` is -0.1: a negative rate"),
    (lambda: E.SGD(clipvalue=(1.0, -1.0)), r"`clipvalue` \(min, max\) is \(1.0, -1.0\)"),
    (lambda: E.SGD(0.1, weight_decay_factor=-0.5), "`weight_decay_factor` is -0.5"),
], ids=["negative_learning_rate", "inverted_clipvalue", "negative_weight_decay"])
def test_tf_classes_warn_about_what_cannot_be_right(optimizer, field):
    with pytest.warns(HyperParameterWarning, match=r"table 'video': \w+: %s" % field):
        _build(optimizer())


def test_a_hyper_parameter_that_is_no_number_is_refused_at_build():
    with pytest.raises(ValueError, match=r"table 'video': Adagrad: `learning_rate` must be a "
                                         r"number or a callable taking no arguments; got "
                                         r"'0.1' \(str\)"):
        _build(E.Adagrad(learning_rate="0.1"))


def test_sound_values_build_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", HyperParameterWarning)
        _build(E.Adagrad(learning_rate=0.1))
        _build(E.SGD(0.1, clipvalue=(-1.0, 1.0)))


@pytest.mark.parametrize("make, message", [
    (lambda: tf_tpu_emb.Lion(learning_rate=-0.1), "`learning_rate` must be >= 0"),
    (lambda: tf_tpu_emb.Momentum(0.1, weight_decay_factor=-1.0),
     "`weight_decay_factor` must be >= 0"),
    (lambda: tf_tpu_emb.RMSProp(0.1, clipvalue=(1.0, -1.0)), r"`clipvalue` \(min, max\) must"),
    (lambda: tf_tpu_emb.Momentum("0.1"), "`learning_rate` must be a float"),
])
def test_our_classes_refuse_them_at_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_keras_layer_build_warns_naming_the_table():
    table = E.TableConfig(100, 4, name="video")
    layer = tte_keras.TPUEmbeddingLayer({"watched": E.FeatureConfig(table)},
                                        E.Adagrad(learning_rate=-1.0), batch_size=2)
    try:
        with pytest.warns(HyperParameterWarning, match="table 'video': Adagrad: `learning_rate`"):
            layer({"watched": tf.constant([1, 2], tf.int64)})
    finally:
        layer.release()
