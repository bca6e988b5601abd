"""A single-process user loads none of the cluster package.

``tf_tpu_emb.cluster`` (hosts, leases with their ``atexit`` hook, the
router) is for ``TPUEmbedding(cluster=...)`` only: ``mid_level`` imports its
backend lazily and the shard arithmetic the per-shard table views need lives
outside it (``tf_tpu_emb/sharding.py``).  Checked in a child process, whose
``sys.modules`` starts clean: ``import tf_tpu_emb``, build a
``TPUEmbedding``, run a training step and read the tables by name."""
import pytest

import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.system  # a child process

CHILD = r"""
import sys

import numpy as np
import tensorflow as tf

import tf_tpu_emb

E = tf.tpu.experimental.embedding
table = E.TableConfig(vocabulary_size=8, dim=2, name="t", combiner="sum")
embedding = tf_tpu_emb.TPUEmbedding({"f": E.FeatureConfig(table, name="f")}, E.SGD(0.5))
embedding.build(per_replica_input_shapes={"f": [2]})
before = embedding.embedding_tables["t"].values[0].numpy()


@tf.function
def step(ids):
    embedding.enqueue({"f": ids}, training=True)
    with tf.GradientTape() as tape:
        activations = embedding.dequeue()
        tape.watch(activations)
        loss = tf.reduce_sum(activations["f"])
    embedding.apply_gradients(tape.gradient(loss, activations))


step(tf.constant([1, 3], tf.int64))
after = embedding.embedding_tables["t"].values[0].numpy()
assert not np.array_equal(before, after), "the step updated nothing"
loaded = sorted(m for m in sys.modules
                if m == "tf_tpu_emb.cluster" or m.startswith("tf_tpu_emb.cluster."))
print("CLUSTER_MODULES=%s" % ",".join(loaded))
"""


def test_single_process_step_loads_no_cluster_module():
    proc = harness.run_python(["-c", CHILD], timeout=180)
    assert proc.returncode == 0, harness.describe(proc)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CLUSTER_MODULES=")]
    assert lines == ["CLUSTER_MODULES="], harness.describe(proc)
