"""The model of the lifecycle tests (test_lifecycle.py and the trainer process
it starts): one SGD table sharded over the hosts, deterministic steps."""
import numpy as np
import tensorflow as tf

import tf_tpu_emb

E = tf.tpu.experimental.embedding
B, VOCAB, DIM, LR = 4, 10, 3, 0.5


def _initial(shape, dtype=tf.float32):
    return tf.constant(np.arange(np.prod(shape)).reshape(shape) * 0.01 + 0.1, dtype)


def make(hosts=None):
    """The model's TPUEmbedding, on `hosts` (None: one local engine)."""
    table = E.TableConfig(VOCAB, DIM, name="t", combiner="sum", initializer=_initial)
    kwargs = {} if hosts is None else {"cluster": hosts}
    return tf_tpu_emb.TPUEmbedding({"f": E.FeatureConfig(table)}, E.SGD(LR), **kwargs)


def ids(n):
    return tf.constant(np.random.default_rng(n).integers(0, VOCAB, B), tf.int64)


def step(emb, n):
    """Training step n, eagerly (the gradient is the activation + n)."""
    emb.enqueue({"f": ids(n)})
    act = emb.dequeue()["f"]
    emb.apply_gradients({"f": act + float(n)})


def table(emb):
    return emb.retrieve_table(emb.tables[0])[0].numpy()
