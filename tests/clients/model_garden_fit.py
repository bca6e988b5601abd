"""Model Garden's ranking task built and fit as its ``train.py`` does (the
compile/fit path: ``RankingTask.build_model``, ``distribute_datasets_from_function``
with ``experimental_fetch_to_device=False``, ``model.fit`` with validation),
run by tests/clients/test_replica_symmetry.py in the client venv.

``python model_garden_fit.py MODE R WORKDIR [CONFIG [STEPS_PER_LOOP]]``:

* ``init``: writes the input files every run reads -- TFRecords in the
  layout of Model Garden's multi-hot reader (MLPerf DLRM-v2: label, 13 dense
  features, 26 multi-hot id lists with DLRM-v2's hotness), from a fixed seed
  -- and builds the model once (MirroredStrategy, one replica) to write its
  weights to ``WORKDIR/init-CONFIG``, the one checkpoint every run starts from.
* ``tpu`` (under ``python -m tf_tpu_emb.run --replicas R``) or ``mirrored``:
  restores that checkpoint into the model built under that strategy, fits
  two epochs of ``STEPS_PER_EPOCH`` steps (validation after each), and writes
  ``WORKDIR/CONFIG-<MODE>-<R>-<STEPS_PER_LOOP>.npz``: every table (read
  through TFRS's ``embedding_tables``, or the Keras embedding's weight for a
  table below ``size_threshold``), every dense weight, and the losses.

CONFIG: ``dcn_v2`` (train.py's ``dlrm_dcn_v2_criteo``: every table on the
TPU embedding, SGD on the tables behind Model Garden's warm-up schedule, Adam
on the dense part) or ``partial`` (``use_partial_tpu_embedding``: tables
under ``size_threshold`` stay Keras embeddings with sparse gradients, beside
the TPU embedding's tables).  STEPS_PER_LOOP is train.py's ``steps_per_loop``
(Keras's ``steps_per_execution``), 1 by default.
"""
import os
import sys

import numpy as np
import tensorflow as tf
import tf_keras

import client_strategy
from official.core import exp_factory
from official.recommendation.ranking.configs import config as ranking_config
from official.recommendation.ranking.task import RankingTask

MODE, R, WORKDIR = sys.argv[1], int(sys.argv[2]), sys.argv[3]
CONFIG = sys.argv[4] if len(sys.argv) > 4 else "dcn_v2"
STEPS_PER_LOOP = int(sys.argv[5]) if len(sys.argv) > 5 else 1
GLOBAL, STEPS_PER_EPOCH, EPOCHS, VALIDATION_STEPS = 16, 5, 2, 2
HOTNESS = list(ranking_config.multi_hot_sizes)                 # DLRM-v2's 26 features
VOCAB = [int(v) for v in np.random.default_rng(7).integers(10, 60, len(HOTNESS))]
THRESHOLD = 35                                                 # "partial": tables below stay Keras
NUM_DENSE = 13
SUFFIX = ".tsv" if CONFIG == "partial" else ".tfrecord"
DATA = os.path.join(WORKDIR, "data")
INIT = os.path.join(WORKDIR, "init-" + CONFIG)


def params():
    p = exp_factory.get_exp_config("dlrm_dcn_v2_criteo")
    model = {"vocab_sizes": VOCAB, "multi_hot_sizes": HOTNESS, "use_multi_hot": True,
             "embedding_dim": [8] * len(VOCAB), "num_dense_features": NUM_DENSE,
             "bottom_mlp": [16, 8], "top_mlp": [16, 1]}
    if CONFIG == "partial":  # Keras embeddings take single ids: Criteo's TSV reader
        model.update(interaction="dot", use_partial_tpu_embedding=True, size_threshold=THRESHOLD,
                     use_multi_hot=False)
    else:
        model.update(interaction="multi_layer_dcn", dcn_num_layers=2, dcn_low_rank_dim=8,
                     use_partial_tpu_embedding=False)
    p.override({
        "runtime": {"distribution_strategy": "tpu" if MODE == "tpu" else "mirrored"},
        "task": {"model": model, "use_tf_record_reader": True, "use_synthetic_data": False,
                 "train_data": {"input_path": os.path.join(DATA, "train*" + SUFFIX),
                                "global_batch_size": GLOBAL},
                 "validation_data": {"input_path": os.path.join(DATA, "eval*" + SUFFIX),
                                     "global_batch_size": GLOBAL}},
        "trainer": {"use_orbit": False, "validation_interval": STEPS_PER_EPOCH,
                    "steps_per_loop": STEPS_PER_LOOP, "validation_steps": VALIDATION_STEPS,
                    "train_steps": STEPS_PER_EPOCH * EPOCHS}},
               is_strict=False)
    return p


def write_data():
    """From a fixed seed, the same examples in Model Garden's two file
    layouts: DLRM-v2 multi-hot TFRecords (the feature names its multi-hot
    reader parses) and Criteo TSV lines (label, dense, each feature's first
    id) for its single-hot reader.  The label depends on the features."""
    rng = np.random.default_rng(20261128)
    os.makedirs(DATA, exist_ok=True)
    for name, n in (("train-0", GLOBAL * STEPS_PER_EPOCH * EPOCHS),
                    ("eval-0", GLOBAL * VALIDATION_STEPS)):
        with tf.io.TFRecordWriter(os.path.join(DATA, name + ".tfrecord")) as writer, \
                open(os.path.join(DATA, name + ".tsv"), "w") as tsv:
            for _ in range(n):
                dense = rng.random(NUM_DENSE).astype(np.float32)
                ids = [rng.integers(0, v, h) for v, h in zip(VOCAB, HOTNESS)]
                score = dense.mean() + np.mean([i[0] / v for i, v in zip(ids, VOCAB)])
                label = int(score + rng.normal(0, 0.2) > 1.0)
                tsv.write("\t".join([str(label)] + ["%r" % float(x) for x in dense]
                                    + [str(i[0]) for i in ids]) + "\n")
                feature = {"label": tf.train.Feature(int64_list=tf.train.Int64List(
                    value=[label]))}
                for k in range(NUM_DENSE):
                    feature["dense-feature-%d" % (k + 1)] = tf.train.Feature(
                        float_list=tf.train.FloatList(value=[dense[k]]))
                for k, row in enumerate(ids):
                    feature["sparse-feature-%d" % (k + 14)] = tf.train.Feature(
                        int64_list=tf.train.Int64List(value=row.tolist()))
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature=feature)).SerializeToString())


p = params()
strategy = client_strategy.make("tpu" if MODE == "tpu" else "mirrored", 1 if MODE == "init" else R)
task = RankingTask(params=p.task, trainer_config=p.trainer, logging_dir=WORKDIR,
                   steps_per_execution=p.trainer.steps_per_loop, name="RankingTask")
with strategy.scope():
    model = task.build_model()


def dataset(data_params):
    return strategy.distribute_datasets_from_function(
        lambda ctx: task.build_inputs(data_params, ctx),
        options=tf.distribute.InputOptions(experimental_fetch_to_device=False))


def tables():
    """Every table by name: TFRS's ``embedding_tables`` of the TPU embedding
    layer, and (``partial``) the weights of the Keras embeddings."""
    layer = model._embedding_layer  # pylint: disable=protected-access
    out = {}
    if CONFIG == "partial":
        for feature, keras_layer in layer.keras_embedding_layers.items():
            out["table:keras-%s" % feature] = keras_layer.embeddings.numpy()
        layer = layer.tpu_embedding
    for table, value in layer.embedding_tables.items():
        out["table:" + table.name] = np.asarray(value)
    return out


def dense():
    return {"dense:%02d:%s" % (i, v.name): v.numpy()
            for i, v in enumerate(model.dense_trainable_variables)}


if MODE == "init":
    if not os.path.exists(DATA):
        write_data()
    features, _ = next(iter(dataset(p.task.train_data)))
    strategy.run(lambda x: model(x, training=False), args=(features,))
    tf.train.Checkpoint(model=model).write(INIT)
    print("INIT %d tables, %d dense weights" % (len(tables()), len(dense())))
    print("OK")
    sys.exit(0)

tf.train.Checkpoint(model=model).read(INIT).assert_existing_objects_matched()
losses = []
history = model.fit(dataset(p.task.train_data), epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH,
                    validation_data=dataset(p.task.validation_data), validation_steps=2,
                    verbose=0, callbacks=[tf_keras.callbacks.LambdaCallback(
                        on_train_batch_end=lambda b, logs: losses.append(float(logs["loss"])))])
arrays = dict(tables(), **dense())
arrays["losses"] = np.array(losses)
arrays["val_losses"] = np.array(history.history["val_loss"])
np.savez(os.path.join(WORKDIR, "%s-%s-%d-%d.npz" % (CONFIG, MODE, R, STEPS_PER_LOOP)), **arrays)
print("STEPS %d" % len(losses))
print("OK")
