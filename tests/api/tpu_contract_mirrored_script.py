"""``TPUEmbedding.enqueue(device=...)`` under MirroredStrategy over 2 logical
CPUs (run by tests/test_tpu_contract.py; logical devices must be configured
before TF's runtime starts, hence a process of its own).

TF maps ``device`` to the replica (TPU core) it names; here each replica is a
CPU device.  Replica k's batch, enqueued with ``device=worker_devices[k]``
(or ``/TPU:k`` as TPU code writes it), must be what ``dequeue`` returns in
replica k, and one training step updates the table over both replicas'
batches.  Exit code 0 and a last line "OK" = pass.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
tf.get_logger().setLevel("ERROR")

import tf_tpu_emb  # noqa: E402

E = tf.tpu.experimental.embedding


def arange_init(shape, dtype=tf.float32):
    return tf.constant(np.arange(shape[0])[:, None] + np.zeros(shape[1]), dtype)


def main():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        table = E.TableConfig(16, 2, name="t", combiner="sum", initializer=arange_init)
        embedding = tf_tpu_emb.TPUEmbedding({"f": E.FeatureConfig(table)}, E.SGD(1.0))
    embedding.build(2)
    try:
        batches = [tf.constant([1, 2], tf.int64), tf.constant([5, 9], tf.int64)]
        for names in [strategy.extended.worker_devices, ["/TPU:0", "/TPU:1"]]:
            for k in (1, 0):   # out of order: the device, not the call order, picks the queue
                embedding.enqueue({"f": batches[k]}, training=False, device=names[k])
            out = strategy.run(lambda: embedding.dequeue()["f"])
            got = [v.numpy()[:, 0].tolist() for v in strategy.experimental_local_results(out)]
            assert got == [[1.0, 2.0], [5.0, 9.0]], (names, got)
        try:
            embedding.enqueue({"f": batches[0]}, device="/TPU:2")
        except ValueError as e:
            assert "is not a replica of this strategy (2 replica(s)" in str(e), str(e)
        else:
            raise AssertionError("device index 2 accepted with 2 replicas")

        # One training step: replica k enqueued through device=, gradient 1.
        for k in range(2):
            embedding.enqueue({"f": batches[k]}, training=True,
                              device=strategy.extended.worker_devices[k])

        def step():
            act = embedding.dequeue()
            embedding.apply_gradients({"f": tf.ones_like(act["f"])})

        strategy.run(step)
        tables = embedding.embedding_tables[table].numpy()[:, 0]
        expected = np.arange(16.0)
        expected[[1, 2, 5, 9]] -= 1.0   # SGD(1.0) over the global batch
        np.testing.assert_allclose(tables, expected)
    finally:
        embedding.shutdown()
    print("OK")


if __name__ == "__main__":
    main()   # an exception prints its traceback and exits 1
