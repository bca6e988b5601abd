"""tf_tpu_emb.TPUEmbedding under MirroredStrategy over R logical CPUs (run by
tests/api/test_mid_level.py; TF's logical devices must be configured before its
runtime starts, hence a process of its own).

Usage: ``python mid_level_strategy_script.py R OPT[,OPT...]`` with OPT one of
sgd, adagrad, adam, ftrl, or ``adagrad-dynamic`` (a callable learning rate
read from a tf.Variable that changes every step).

For each optimizer: the model of tests/common/mid_level_common.py (two tables, five
features) is trained for four steps on global batches of 8 split contiguously
over the R replicas -- enqueue inside ``strategy.run`` (replica id path) and
outside it (per-replica values from
``experimental_distribute_values_from_function``), each eagerly and in a
tf.function -- and after every step the activations of all replicas and the
engine's tables + slots must equal the single-replica numpy reference on the
global batch.  Exit code 0 and a last line "OK" = pass.
"""
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

R = int(sys.argv[1])
OPTIMIZERS = sys.argv[2].split(",")
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * R)
tf.get_logger().setLevel("ERROR")  # "Using MirroredStrategy eagerly has significant overhead"

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "common"))  # the shared test helpers
import child_script  # noqa: E402
import mid_level_common as mc  # noqa: E402
import tf_tpu_emb  # noqa: E402

MODES = [("inside", False), ("outside", False), ("inside", True), ("outside", True)]
LR_SCHEDULE = [0.1, 0.4, 0.05, 0.2]


def train(strategy, name):
    dynamic = name.endswith("-dynamic")
    base = name.split("-")[0]
    lr_var = tf.Variable(0.0, name="lr") if dynamic else None
    with strategy.scope():
        fc, _ = mc.make_feature_config(mc.GLOBAL_BATCH // R)
        optimizer = mc.optimizer_case(base, lr=(lambda: lr_var) if dynamic else None)[0]
        embedding = tf_tpu_emb.TPUEmbedding(fc, optimizer)
    try:
        mc.run_training(strategy, embedding, base, MODES, seed=R, lr_var=lr_var,
                        lr_schedule=LR_SCHEDULE, what="R=%d %s" % (R, name))
    finally:
        embedding.shutdown()


def check_plain_inputs_refused(strategy):
    """With R > 1 a plain (non-distributed) enqueue outside strategy.run goes
    to every replica, as TF's enqueue does (distribute_utils.select_replica):
    each replica dequeues the same batch."""
    with strategy.scope():
        fc, _ = mc.make_feature_config(mc.GLOBAL_BATCH // R)
        embedding = tf_tpu_emb.TPUEmbedding(fc, mc.optimizer_case("sgd")[0])
    try:
        embedding.build(per_replica_batch_size=mc.GLOBAL_BATCH // R)
        features, weights = mc.to_tensors(
            mc.make_batch(np.random.default_rng(99), mc.GLOBAL_BATCH // R))
        embedding.enqueue(features, weights, training=False)
        out = strategy.run(lambda: tf.nest.flatten(embedding.dequeue()))
        per_replica = [strategy.experimental_local_results(o) for o in out]
        for values in per_replica:
            for v in values[1:]:
                np.testing.assert_array_equal(v.numpy(), values[0].numpy())
    finally:
        embedding.shutdown()


def main():
    assert len(tf.config.list_logical_devices("CPU")) == R
    strategy = tf.distribute.MirroredStrategy(["/cpu:%d" % i for i in range(R)])
    assert strategy.num_replicas_in_sync == R
    check_plain_inputs_refused(strategy)
    for name in OPTIMIZERS:
        t0 = time.time()
        train(strategy, name)
        print("%s R=%d ok (%.1fs)" % (name, R, time.time() - t0), flush=True)
    print("OK")


if __name__ == "__main__":
    child_script.run(main)
