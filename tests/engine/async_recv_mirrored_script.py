"""Recv waits for its own replica's enqueue under MirroredStrategy over 3
logical CPUs (run by tests/engine/test_async_recv.py; logical devices must be
configured before TF's runtime starts, hence a process of its own).

1. strategy.run of a tf.function that calls the core-named Recv before the
   core-named enqueue, without control dependencies: every replica gets its
   own batch.
2. A Recv waiting on replica 1 is not woken by an enqueue for replica 0: it
   times out naming replica 1, and replica 0's batch stays for replica 0.
Exit code 0 and a last line "OK" = pass.
"""
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "common"))  # the shared test helpers
import child_script  # noqa: E402

R = 3
tf = child_script.tensorflow_with_cpus(R)

import numpy as np  # noqa: E402
import engine_util as eu  # noqa: E402
from engine_util import FeatureSpec, TableSpec  # noqa: E402

B = 2


def enqueue(ids, device_ordinal=-1):
    return tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
        sample_indices_or_row_splits=[eu.empty(tf.int32)], embedding_indices=[ids],
        aggregation_weights=[eu.empty(tf.float32)], device_ordinal=device_ordinal,
        combiners=["sum"], mode_override="inference")


def main():
    cfg = eu.feature_mode_config([TableSpec("t", 16, 2)], [FeatureSpec("f", 0, [B])],
                                 num_tensor_cores=R)
    serialized = cfg.SerializeToString()
    strategy = tf.distribute.MirroredStrategy(["/cpu:%d" % k for k in range(R)])
    # No Sends: a Recv only waits for its enqueue.
    with eu.recv_timeout(2), eu.engine(cfg):
        table = eu.load_random_tables(cfg, 0)["t"][0]

        # 1. Recv written first, enqueue after, no control dependencies
        @tf.function
        def step(ids):
            def replica_fn(replica_ids):
                out = tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=1, config=serialized)
                m = tf.ones([200, 200])
                for _ in range(3):
                    m = tf.matmul(m, m) / 200.0  # the enqueue comes late
                enqueue(replica_ids + tf.cast(tf.reduce_sum(m) * 0.0, tf.int64))
                return out[0]
            return strategy.run(replica_fn, args=(ids,))

        for it in range(3):
            sent = [np.array([(it + k) % 16, (it + 2 * k + 5) % 16], np.int64) for k in range(R)]
            ids = strategy.experimental_distribute_values_from_function(
                lambda ctx: tf.constant(sent[ctx.replica_id_in_sync_group]))
            got = strategy.experimental_local_results(step(ids))
            for k in range(R):
                np.testing.assert_array_equal(got[k].numpy(), table[sent[k]],
                                              err_msg="step %d replica %d" % (it, k))

        # 2. only an enqueue for replica 1 wakes a Recv waiting on replica 1
        outcome = {}

        def receive_on_1():
            try:
                with tf.device("/CPU:1"):
                    tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=1, config=serialized)
                outcome["ok"] = True
            except tf.errors.OpError as e:
                outcome["error"] = e
        thread = threading.Thread(target=receive_on_1, daemon=True)
        thread.start()
        enqueue(tf.constant([3, 4], tf.int64), device_ordinal=0)
        thread.join(60)
        assert not thread.is_alive(), "the Recv on replica 1 did not end"
        error = outcome.get("error")
        assert isinstance(error, tf.errors.DeadlineExceededError), outcome
        assert "nothing was enqueued for replica 1" in error.message, error.message
        with tf.device("/CPU:0"):
            out = tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=1, config=serialized)
        np.testing.assert_array_equal(out[0].numpy(), table[[3, 4]])
    print("OK")


if __name__ == "__main__":
    child_script.run(main)
