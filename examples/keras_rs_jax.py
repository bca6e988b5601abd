"""Keras-RS 0.4.0 on JAX, written for a TPU with SparseCores, as Keras-RS documents it.

On a TPU:      KERAS_BACKEND=jax python examples/keras_rs_jax.py
On CPU:        python -m tf_tpu_emb.run --jax --replicas 2 examples/keras_rs_jax.py

Two tables (one shared by two features), a data-parallel distribution over
the TPU devices, ``DistributedEmbedding(placement="sparsecore")``,
``layer.preprocess(...)`` outside the jitted step and a jitted
``model.train_on_batch``.  Each table's optimizer updates it on the
SparseCores (the model's optimizer trains the dense layer).

Options: ``--optimizer sgd|adagrad|adam|ftrl`` (or two, comma-separated: the
tables' in name order), ``--placement
sparsecore|auto``, ``--stacking none|auto|all``, ``--steps K``, ``--batch B``
(the global batch), ``--seed S``, ``--fit`` (``model.fit`` over a generator of
preprocessed batches, as Keras-RS's docs show, instead of
``train_on_batch``), ``--dump FILE`` (an .npz of the tables after
each step and the inputs, for a test to check), ``--checkpoint DIR`` (saves
the model's weights after training, loads them into a fresh model and
checks that its tables are the same).
"""
import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import keras_rs  # noqa: E402
import numpy as np  # noqa: E402

TABLES = {"user": (64, 8), "item": (96, 16)}   # name: (vocabulary, width)
FEATURES = {"user_id": "user", "item_id": "item", "item_hist": "item"}
VALENCE = {"user_id": 1, "item_id": 2, "item_hist": 3}
LEARNING_RATE = 0.1
# --stacking: none, Keras-RS's automatic choice, or both tables in one stack.
STACKING = {"none": None, "auto": "auto", "all": [sorted(TABLES)]}


def make_optimizer(name):
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=LEARNING_RATE)
    if name == "adagrad":
        return keras.optimizers.Adagrad(learning_rate=LEARNING_RATE, initial_accumulator_value=0.1)
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=LEARNING_RATE, beta_1=0.9, beta_2=0.999,
                                     epsilon=1e-7)
    if name == "ftrl":
        return keras.optimizers.Ftrl(learning_rate=LEARNING_RATE, learning_rate_power=-0.5,
                                     initial_accumulator_value=0.1,
                                     l1_regularization_strength=0.01,
                                     l2_regularization_strength=0.02, beta=0.1)
    raise ValueError(f"--optimizer: {name!r}")


class RankingModel(keras.Model):
    """The features' activations, concatenated (features in name order), into one dense unit."""

    def __init__(self, embedding, seed, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding
        self.dense = keras.layers.Dense(
            1, kernel_initializer=keras.initializers.RandomNormal(stddev=0.3, seed=seed),
            name="dense")
        self.dense.build((None, sum(TABLES[FEATURES[f]][1] for f in FEATURES)))

    def call(self, inputs):
        activations = self.embedding(inputs)
        return self.dense(keras.ops.concatenate([activations[f] for f in sorted(FEATURES)],
                                                axis=1))


def table_optimizers(spec):
    """--optimizer NAME (every table) or NAME,NAME (the tables in name order)."""
    names = spec.split(",")
    if len(names) == 1:
        names = names * len(TABLES)
    if len(names) != len(TABLES):
        raise ValueError(f"--optimizer: {spec!r} is not one name or one per table")
    return dict(zip(sorted(TABLES), names))


def build_model(args):
    optimizers = table_optimizers(args.optimizer)
    tables = {
        name: keras_rs.layers.TableConfig(
            name=name, vocabulary_size=vocab, embedding_dim=dim,
            initializer=keras.initializers.RandomUniform(-0.5, 0.5, seed=args.seed + i),
            optimizer=make_optimizer(optimizers[name]), combiner="sum",
            placement=args.placement)
        for i, (name, (vocab, dim)) in enumerate(sorted(TABLES.items()))}
    feature_configs = {
        feature: keras_rs.layers.FeatureConfig(
            name=feature, table=tables[table],
            input_shape=(args.batch, VALENCE[feature]),
            output_shape=(args.batch, TABLES[table][1]))
        for feature, table in FEATURES.items()}
    embedding = keras_rs.layers.DistributedEmbedding(
        feature_configs, table_stacking=STACKING[args.stacking])
    model = RankingModel(embedding, seed=args.seed)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05), loss="mse",
                  jit_compile=True)
    return model, embedding


def batches(args):
    rng = np.random.default_rng(args.seed)
    for _ in range(args.steps):
        x = {f: rng.integers(0, TABLES[FEATURES[f]][0], (args.batch, VALENCE[f])).astype(np.int32)
             for f in FEATURES}
        y = rng.normal(size=(args.batch, 1)).astype(np.float32)
        yield x, y


def round_trip(args, model, embedding):
    """Saves the trained model's weights, loads them into a fresh model (other
    initial values), and checks that its tables are the same and that one more
    step moves both models' tables alike (the optimizer slots came back too)."""
    path = os.path.join(args.checkpoint, "model.weights.h5")
    model.save_weights(path)
    fresh_args = argparse.Namespace(**{**vars(args), "seed": args.seed + 100})
    fresh, fresh_embedding = build_model(fresh_args)
    x, y = next(batches(argparse.Namespace(**{**vars(args), "steps": 1, "seed": args.seed + 1})))
    preprocessed = fresh_embedding.preprocess(x, training=True)
    fresh(preprocessed)  # builds the model's variables
    before = fresh_embedding.get_embedding_tables()
    fresh.load_weights(path)
    want, got = embedding.get_embedding_tables(), fresh_embedding.get_embedding_tables()
    for name in want:
        assert not np.array_equal(np.asarray(before[name]), np.asarray(want[name])), name
        np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)
    model.train_on_batch(embedding.preprocess(x, training=True), y)
    fresh.train_on_batch(preprocessed, y)
    want, got = embedding.get_embedding_tables(), fresh_embedding.get_embedding_tables()
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]),
                                   rtol=0, atol=1e-6, err_msg=name)
    print(f"checkpoint round trip: {len(want)} tables equal, and after one more step")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", default="adagrad")
    parser.add_argument("--placement", default="sparsecore")
    parser.add_argument("--stacking", default="none", choices=("none", "auto", "all"))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dump")
    parser.add_argument("--checkpoint")
    parser.add_argument("--fit", action="store_true")
    args = parser.parse_args()

    distribution = keras.distribution.DataParallel(devices=jax.devices("tpu"))
    keras.distribution.set_distribution(distribution)
    model, embedding = build_model(args)

    dump = {}

    def record(step):
        for k, v in embedding.get_embedding_tables().items():
            dump[f"tables_{step}/{k}"] = np.asarray(v)
        dump[f"dense_{step}/kernel"] = np.asarray(model.dense.kernel)
        dump[f"dense_{step}/bias"] = np.asarray(model.dense.bias)

    def preprocessed_batches():
        for step, (x, y) in enumerate(batches(args), 1):
            for k, v in x.items():
                dump[f"inputs_{step}/{k}"] = v
            dump[f"labels_{step}"] = y
            yield embedding.preprocess(x, training=True), y

    record(0)
    if args.fit:
        class Record(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                self.model.jax_state_sync()  # the step's weights onto the model
                record(batch + 1)
                print(f"step {batch + 1}: loss {float(logs['loss']):.6f}", flush=True)

        model.fit(preprocessed_batches(), epochs=1, steps_per_epoch=args.steps,
                  callbacks=[Record()], verbose=0)
    else:
        for step, (preprocessed, y) in enumerate(preprocessed_batches(), 1):
            loss = model.train_on_batch(preprocessed, y)
            print(f"step {step}: loss {float(loss):.6f}", flush=True)
            record(step)
    if args.dump:
        np.savez(args.dump, **dump)
    if args.checkpoint:
        round_trip(args, model, embedding)
    print("layer variables: " + ", ".join(f"{v.path} {tuple(v.shape)}" for v in embedding.weights))
    print(f"devices {len(jax.devices('tpu'))}, tables "
          + ", ".join(f"{k} {tuple(np.shape(v))}"
                      for k, v in sorted(embedding.get_embedding_tables().items())))


if __name__ == "__main__":
    main()
