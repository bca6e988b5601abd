"""Child of tests/api/test_churn_soak.py: ``python churn_soak_script.py
CYCLES``: CYCLES times, a fresh TPUEmbedding is created, built, trained one
step (eagerly and in a tf.function), shut down and dropped; prints one JSON
line: the resident set size (MiB) after every CYCLES/20 cycles and the engine
names ever made (engine_registry.pool_size)."""
import gc
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_tpu_emb  # noqa: E402
from tf_tpu_emb import engine_registry  # noqa: E402

E = tf.tpu.experimental.embedding


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def cycle(i):
    table = E.TableConfig(64, 8, name="t", combiner="mean")
    emb = tf_tpu_emb.TPUEmbedding({"f": E.FeatureConfig(table)}, E.Adagrad(0.1))
    emb.build(4)
    ids = {"f": tf.constant(np.arange(4) + i % 60, tf.int64)}
    emb.enqueue(ids)
    emb.apply_gradients(emb.dequeue())

    @tf.function
    def step(x):
        emb.enqueue(x)
        emb.apply_gradients(emb.dequeue())

    step(ids)
    emb.shutdown()


def main():
    cycles = int(sys.argv[1])
    every = max(1, cycles // 20)
    samples = []
    for i in range(cycles):
        cycle(i)
        if (i + 1) % every == 0:
            gc.collect()
            samples.append(round(rss_mib(), 1))
    print(json.dumps({"rss_mib": samples, "names_made": engine_registry.pool_size()[0]}))


if __name__ == "__main__":
    main()
