"""Soak run (child process of tests/engine/test_soak.py; also runnable alone):
RSS over N training steps (enqueue -> Recv -> Send in a tf.function) and over
M configure / shutdown cycles.  Prints one JSON line of figures (MiB)."""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The shared test helpers (engine_util) live in tests/common.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "common"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import engine_util as eu  # noqa: E402
from engine_util import FeatureSpec, TableSpec  # noqa: E402
from tf_tpu_emb import ops as tte_ops  # noqa: E402

BATCH = 64


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def train_steps(n):
    config = eu.feature_mode_config(
        [TableSpec("video", 5000, 16), TableSpec("user", 3000, 8, optimizer="adam")],
        [FeatureSpec("watched", 0, [BATCH]), FeatureSpec("friends", 1, [BATCH]),
         FeatureSpec("liked", 0, [BATCH])])
    data = eu.serialize(config)
    vocab = [5000, 3000, 5000]
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(16):
        feats = []
        for v in vocab:
            counts = rng.integers(0, 5, BATCH)
            splits = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            feats.append((tf.constant(splits), tf.constant(rng.integers(0, v, splits[-1]))))
        batches.append(feats)
    empty = tf.zeros([0], tf.float32)

    # Our prefixed ops: TF's automatic control dependencies leave its core
    # enqueue ops unordered, ours run in program order.
    spec = (tf.TensorSpec([BATCH + 1], tf.int64), tf.TensorSpec([None], tf.int64))

    @tf.function(input_signature=[[spec] * 3])
    def step(feats):
        tte_ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
            [f[0] for f in feats], [f[1] for f in feats], [empty] * 3,
            mode_override="train", combiners=["mean"] * 3)
        acts = tte_ops.recv_tpu_embedding_activations(num_outputs=3, config=data)
        tte_ops.send_tpu_embedding_gradients([a * 0.01 for a in acts], config=data)
        return acts[0][0, 0]

    samples = []
    with eu.engine(config):
        for i in range(n):
            step(batches[i % len(batches)])
            if (i + 1) % 500 == 0:
                samples.append(rss_mib())
        final = step(batches[0]).numpy()
    assert np.isfinite(final)
    return samples


def configure_cycles(n):
    config = eu.feature_mode_config([TableSpec("big", 100000, 16)],
                                    [FeatureSpec("f", 0, [BATCH])])
    data = eu.serialize(config)
    ids = np.arange(BATCH, dtype=np.int64)
    samples = []
    for i in range(n):
        tf.raw_ops.ConfigureTPUEmbedding(config=data)
        eu.enqueue_arbitrary([(np.zeros([0], np.int64), ids, np.zeros([0], np.float32))])
        eu.recv(config)
        tte_ops.shutdown_tpu_embedding()
        if (i + 1) % 50 == 0:
            samples.append(rss_mib())
    return samples


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    cycles = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    import tf_tpu_emb
    tf_tpu_emb.load_library()
    start = rss_mib()
    train = train_steps(steps)
    cycle = configure_cycles(cycles)
    print(json.dumps({"start": start, "train_steps": steps, "train": train,
                      "cycles": cycles, "configure": cycle}))


if __name__ == "__main__":
    main()
