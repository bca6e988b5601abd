"""TPUEmbeddingV0 / TPUEmbeddingV0Layer under MirroredStrategy over 2
logical CPUs (run by tests/api/test_v0.py and tests/keras/test_keras_v0_layer.py; TF's
logical devices must be configured before its runtime starts, hence a
process of its own).

``v0``: TF's documented V0 training step inside ``strategy.run`` (first use,
hence the build, inside the replica function), Keras SGD; the tables are
MirroredVariables and end equal to a single-device run on the global batch.
Adagrad with ``keras_slot_variable_creation_fn``: the slots are mirrored and
are the Keras optimizer's own.
``keras``: ``model.fit`` of a model with a TPUEmbeddingV0Layer, created in
``strategy.scope()``, equals the same fit on the default strategy.

Exit code 0 and a last line "OK" = pass.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

R = 2
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * R)

import keras  # noqa: E402

from tf_tpu_emb.v0 import TPUEmbeddingV0, keras_slot_variable_creation_fn  # noqa: E402

E = tf.tpu.experimental.embedding
B = 4  # per replica


def feature_config():
    video = E.TableConfig(12, 4, combiner="mean", name="video",
                          initializer=tf.keras.initializers.RandomUniform(-1, 1, seed=1))
    user = E.TableConfig(7, 3, combiner="sum", name="user",
                         initializer=tf.keras.initializers.RandomUniform(-1, 1, seed=2))
    return {"watched": E.FeatureConfig(video), "liked": E.FeatureConfig(video),
            "friends": E.FeatureConfig(user),
            "history": E.FeatureConfig(user, max_sequence_length=3)}


def batch(rng, rows):
    def sparse(vocab, width, weighted):
        lens = rng.integers(0, width + 1, rows)
        idx = np.array([[b, j] for b in range(rows) for j in range(lens[b])],
                       np.int64).reshape(-1, 2)
        ids = tf.SparseTensor(idx, rng.integers(0, vocab, len(idx)).astype(np.int64),
                              [rows, width])
        w = tf.SparseTensor(idx, rng.uniform(0.5, 2, len(idx)).astype(np.float32),
                            [rows, width]) if weighted else None
        return ids, w

    watched, watched_w = sparse(12, 3, True)
    history, _ = sparse(7, 4, False)
    lens = rng.integers(0, 3, rows).astype(np.int64)
    friends = tf.RaggedTensor.from_row_lengths(
        rng.integers(0, 7, int(lens.sum())).astype(np.int64), lens)
    features = {"watched": watched, "liked": tf.constant(rng.integers(0, 12, rows), tf.int64),
                "friends": friends, "history": history}
    weights = {"watched": watched_w, "liked": None, "friends": None, "history": None}
    return features, weights


def split(features, weights, r):
    """Replica r's rows [r*B, (r+1)*B) of a global batch."""
    def rows(x):
        if x is None:
            return None
        if isinstance(x, tf.SparseTensor):
            return tf.sparse.slice(x, [r * B, 0], [B, x.dense_shape[1]])
        return x[r * B:(r + 1) * B]
    return tf.nest.map_structure(rows, features), {
        k: rows(v) for k, v in weights.items()}


def loss_of(acts, coefs):
    return tf.add_n([tf.reduce_sum(acts[k] * coefs[k]) for k in sorted(acts)])


def coefficients(rng, rows):
    return {"watched": tf.constant(rng.normal(size=(rows, 4)), tf.float32),
            "liked": tf.constant(rng.normal(size=(rows, 4)), tf.float32),
            "friends": tf.constant(rng.normal(size=(rows, 3)), tf.float32),
            "history": tf.constant(rng.normal(size=(rows, 3, 3)), tf.float32)}


def run_v0():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.2)
        embedding = TPUEmbeddingV0(feature_config(), E.SGD(0.2))
    single_opt = keras.optimizers.SGD(0.2)
    single = TPUEmbeddingV0(feature_config(), E.SGD(0.2))

    @tf.function
    def training_step(features, weights, coefs):
        def tpu_step(features, weights, coefs):
            with tf.GradientTape() as tape:
                tape.watch(embedding.embedding_tables.values())  # builds, in merge_call
                activations = embedding(features, weights)
                loss = loss_of(activations, coefs)
            gradients = tape.gradient(loss, list(embedding.embedding_tables.values()))
            optimizer.apply_gradients(
                list(zip(gradients, embedding.embedding_tables.values())))
            return loss
        return strategy.run(tpu_step, args=(features, weights, coefs))

    @tf.function
    def single_step(features, weights, coefs):
        with tf.GradientTape() as tape:
            loss = loss_of(single(features, weights), coefs)
        tables = list(single.embedding_tables.values())
        single_opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss

    rng = np.random.default_rng(0)
    for step in range(3):
        features, weights = batch(rng, R * B)
        coefs = coefficients(rng, R * B)
        parts = [split(features, weights, r) for r in range(R)]
        coef_parts = [{k: v[r * B:(r + 1) * B] for k, v in coefs.items()} for r in range(R)]
        dist_f = strategy.experimental_distribute_values_from_function(
            lambda ctx: parts[ctx.replica_id_in_sync_group][0])
        dist_w = strategy.experimental_distribute_values_from_function(
            lambda ctx: parts[ctx.replica_id_in_sync_group][1])
        dist_c = strategy.experimental_distribute_values_from_function(
            lambda ctx: coef_parts[ctx.replica_id_in_sync_group])
        losses = training_step(dist_f, dist_w, dist_c)
        total = sum(strategy.experimental_local_results(losses))
        if step == 0:
            for var in embedding.embedding_tables.values():
                assert isinstance(var, tf.distribute.DistributedValues), type(var)
                values = strategy.experimental_local_results(var)
                assert len(values) == R and values[1].device.endswith("CPU:1"), values[1].device
        np.testing.assert_allclose(total, single_step(features, weights, coefs),
                                   rtol=1e-4, atol=1e-4)
    for a, b in zip(embedding.embedding_tables.values(), single.embedding_tables.values()):
        for local in strategy.experimental_local_results(a):
            np.testing.assert_allclose(local, b, rtol=1e-5, atol=1e-6)

    # Adagrad through the slot hook: mirrored slots that Keras updates.
    with strategy.scope():
        adagrad = keras.optimizers.Adagrad(0.1)
        emb2 = TPUEmbeddingV0(feature_config(), E.Adagrad(
            0.1, slot_variable_creation_fn=keras_slot_variable_creation_fn(adagrad)))
        emb2.build()

    @tf.function
    def adagrad_step(features, weights):
        def fn(features, weights):
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_sum(a) for a in
                                 tf.nest.flatten(emb2(features, weights))])
            tables = list(emb2.embedding_tables.values())
            adagrad.apply_gradients(zip(tape.gradient(loss, tables), tables))
        strategy.run(fn, args=(features, weights))

    adagrad_step(dist_f, dist_w)
    slot = emb2._variables["video"]["accumulators"]
    video = [t for t in emb2.embedding_tables if t.name == "video"][0]
    assert slot is adagrad._accumulators[adagrad._get_variable_index(emb2.embedding_tables[video])]
    assert len(adagrad.variables) == 4  # iteration, learning_rate, one slot per table
    locals_ = strategy.experimental_local_results(slot.value)
    assert len(locals_) == R
    np.testing.assert_array_equal(locals_[0], locals_[1])
    assert np.any(locals_[0] > 0.1 + 1e-6)


def run_keras():
    from tf_tpu_emb.keras import TPUEmbeddingV0Layer, fix_distributed_fit  # noqa: E402

    def make_model():
        inputs = {"watched": keras.Input(shape=(3,), sparse=True, dtype="int64", name="watched"),
                  "liked": keras.Input(shape=(), dtype="int64", name="liked"),
                  "friends": keras.Input(shape=(None,), ragged=True, dtype="int64",
                                         name="friends"),
                  "history": keras.Input(shape=(4,), sparse=True, dtype="int64",
                                         name="history")}
        acts = TPUEmbeddingV0Layer(feature_config(), name="embedding")(inputs)
        x = keras.layers.Concatenate()([acts["watched"], acts["liked"], acts["friends"],
                                        keras.layers.Flatten()(acts["history"])])
        out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=3))(x)
        model = fix_distributed_fit(keras.Model(inputs, out))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model

    rng = np.random.default_rng(1)
    data = []
    for _ in range(3):
        features, _ = batch(rng, R * B)
        data.append((features, tf.constant(rng.normal(size=(R * B, 1)), tf.float32)))
    spec = ({"watched": tf.SparseTensorSpec([None, 3], tf.int64),
             "liked": tf.TensorSpec([None], tf.int64),
             "friends": tf.RaggedTensorSpec([None, None], tf.int64, 1, tf.int64),
             "history": tf.SparseTensorSpec([None, 4], tf.int64)},
            tf.TensorSpec([None, 1], tf.float32))

    def dataset():
        return tf.data.Dataset.from_generator(lambda: iter(data), output_signature=spec)

    single = make_model()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        mirrored = make_model()
    mirrored.set_weights(single.get_weights())
    emb_vars = mirrored.get_layer("embedding").trainable_weights
    assert all(isinstance(v.value, tf.distribute.DistributedValues) for v in emb_vars)
    h1 = single.fit(dataset(), epochs=2, verbose=0).history["loss"]
    h2 = mirrored.fit(dataset(), epochs=2, verbose=0).history["loss"]
    np.testing.assert_allclose(h1, h2, rtol=1e-4)
    for a, b in zip(single.get_weights(), mirrored.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert not np.allclose(single.get_weights()[0], make_model().get_weights()[0])
    p1 = single.predict(dataset(), verbose=0)
    p2 = mirrored.predict(dataset(), verbose=0)
    np.testing.assert_allclose(p1, p2, rtol=1e-4, atol=1e-5)


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "v0"
    {"v0": run_v0, "keras": run_keras}[mode]()
    print("OK")


if __name__ == "__main__":
    main()
