"""The model of the fault soak (test_fault_soak.py and the trainer process
it starts, soak_trainer_script.py): two Adagrad tables sharded over the hosts
(vocabularies that do not divide evenly over two hosts), and deterministic
steps whose gradients depend only on the step number, so a
single engine replays them exactly."""
import os

import numpy as np
import tensorflow as tf

import tf_tpu_emb

E = tf.tpu.experimental.embedding
B = 8
TABLES = {"a": (37, 4), "b": (5, 3)}  # feature: (vocabulary, dim)
LR = 0.1


def _initial(shape, dtype=tf.float32):
    return tf.constant(np.arange(np.prod(shape)).reshape(shape) * 0.01 - 0.05, dtype)


def make(hosts=None):
    """The model's TPUEmbedding, on `hosts` (None: one local engine)."""
    config = {f: E.FeatureConfig(E.TableConfig(v, d, name="t" + f, combiner="sum",
                                               initializer=_initial))
              for f, (v, d) in TABLES.items()}
    kwargs = {} if hosts is None else {"cluster": hosts}
    return tf_tpu_emb.TPUEmbedding(config, E.Adagrad(LR), pipelined(), **kwargs)


def pipelined():
    """TF_TPU_EMB_SOAK_PIPELINE=1: pipeline_execution_with_tensor_core on
    both sides (the trainer inherits it; test_fault_soak.py's docstring)."""
    return os.environ.get("TF_TPU_EMB_SOAK_PIPELINE", "") not in ("", "0")


def ids(n):
    rng = np.random.default_rng(1000 + n)
    return {f: tf.constant(rng.integers(0, v, B), tf.int64) for f, (v, _) in TABLES.items()}


def grads(n):
    rng = np.random.default_rng(5000 + n)
    return {f: tf.constant(rng.standard_normal((B, d)), tf.float32)
            for f, (_, d) in TABLES.items()}


def step(emb, n):
    """Training step n, eagerly (the reference side)."""
    emb.enqueue(ids(n), training=True)
    emb.dequeue()
    emb.apply_gradients(grads(n))


def state(emb):
    """{table name / state index: array}: every table and slot."""
    out = {}
    for table in emb.tables:
        for i, value in enumerate(emb.retrieve_table(table)):
            out["%s/%d" % (table.name, i)] = np.asarray(value)
    return out
