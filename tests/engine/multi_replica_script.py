"""Several replicas in one process (run by tests/engine/test_multi_replica.py).

TF's logical CPU devices must be configured before its runtime starts, so this
runs as its own process: 4 logical CPUs, num_tensor_cores = 4, one queue per
replica.  Exit code 0 = pass; on failure the assertion details are printed.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "common"))  # the shared test helpers
import child_script  # noqa: E402

R = 4
tf = child_script.tensorflow_with_cpus(R)

import numpy as np  # noqa: E402
import engine_util as eu  # noqa: E402
from engine_util import FeatureSpec, TableSpec  # noqa: E402

B = 3


def config():
    return eu.feature_mode_config(
        [TableSpec("video", 10, 4), TableSpec("user", 7, 2)],
        [FeatureSpec("a", 0, [B]), FeatureSpec("b", 1, [B])], num_tensor_cores=R)


def batch(rng):
    return [eu.random_bags(rng, B, 10, weighted=True), eu.random_bags(rng, B, 7, weighted=True)]


def args_of(bags):
    return [eu.sparse_to_enqueue(*eu.bags_to_sparse(b)) for b in bags]


def check(got, bags, tables, what):
    eu.assert_close(got[0], eu.reference_lookup(tables["video"][0], bags[0], "mean"),
                    what=what + " video")
    eu.assert_close(got[1], eu.reference_lookup(tables["user"][0], bags[1], "sqrtn"),
                    what=what + " user")


def recv_on(k, cfg):
    with tf.device("/CPU:%d" % k):
        return eu.recv(cfg)


def expect_error(fn, error, fragment):
    try:
        fn()
    except error as e:
        assert fragment in str(e), (fragment, str(e))
        return
    raise AssertionError("expected %s containing %r" % (error.__name__, fragment))


def main():
    assert len(tf.config.list_logical_devices("CPU")) == R
    rng = np.random.default_rng(0)
    cfg = config()
    combiners = ["mean", "sqrtn"]
    # No Sends here: a Recv only waits for its enqueue, so a short timeout
    # makes the Recvs with nothing enqueued fail fast.
    with eu.recv_timeout(1), eu.engine(cfg):
        tables = eu.load_random_tables(cfg, 0)

        # 1. explicit device_ordinal from CPU:0, Recv under CPU:k (reverse order)
        sent = {k: batch(rng) for k in range(R)}
        for k in range(R):
            eu.enqueue_arbitrary(args_of(sent[k]), combiners=combiners, device_ordinal=k)
        for k in reversed(range(R)):
            check(recv_on(k, cfg), sent[k], tables, "ordinal %d" % k)

        # 2. device_ordinal -1 under tf.device('/CPU:k') feeds replica k
        sent = {k: batch(rng) for k in range(R)}
        for k in range(R):
            with tf.device("/CPU:%d" % k):
                eu.enqueue_arbitrary(args_of(sent[k]), combiners=combiners, device_ordinal=-1)
        for k in range(R):
            check(recv_on(k, cfg), sent[k], tables, "ordinal -1 on CPU:%d" % k)

        # 3. queues are independent and FIFO per replica; the other replicas
        #    have nothing queued
        first, second = batch(rng), batch(rng)
        eu.enqueue_arbitrary(args_of(first), combiners=combiners, device_ordinal=2)
        eu.enqueue_arbitrary(args_of(second), combiners=combiners, device_ordinal=2)
        for k in (0, 1, 3):
            expect_error(lambda: recv_on(k, cfg), tf.errors.DeadlineExceededError,
                         "nothing was enqueued for replica %d" % k)
        check(recv_on(2, cfg), first, tables, "fifo first")
        check(recv_on(2, cfg), second, tables, "fifo second")
        expect_error(lambda: recv_on(2, cfg), tf.errors.DeadlineExceededError,
                     "nothing was enqueued for replica 2")

        # 4. Dynamic variant: ordinal from a tensor; and the default device
        b3 = batch(rng)
        a = args_of(b3)
        tf.raw_ops.DynamicEnqueueTPUEmbeddingArbitraryTensorBatch(
            sample_indices_or_row_splits=[x[0] for x in a], embedding_indices=[x[1] for x in a],
            aggregation_weights=[x[2] for x in a], mode_override="train",
            device_ordinal=tf.constant(3, tf.int32), combiners=combiners)
        check(recv_on(3, cfg), b3, tables, "dynamic ordinal 3")

        # 5. out-of-range ordinal enqueues nothing anywhere
        expect_error(lambda: eu.enqueue_arbitrary(args_of(b3), combiners=combiners,
                                                  device_ordinal=R),
                     tf.errors.InvalidArgumentError, "replica %d is out of range" % R)
        for k in range(R):
            expect_error(lambda: recv_on(k, cfg), tf.errors.DeadlineExceededError,
                         "nothing was enqueued for replica %d" % k)

        # 6. one tf.function enqueuing for every replica and receiving on each
        serialized = cfg.SerializeToString()
        sent = {k: batch(rng) for k in range(R)}
        flat = [args_of(sent[k]) for k in range(R)]

        @tf.function
        def step():
            outs = []
            for k in range(R):
                with tf.device("/CPU:%d" % k):
                    enq = tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
                        sample_indices_or_row_splits=[x[0] for x in flat[k]],
                        embedding_indices=[x[1] for x in flat[k]],
                        aggregation_weights=[x[2] for x in flat[k]],
                        mode_override="train", device_ordinal=-1, combiners=combiners)
                    with tf.control_dependencies([enq]):
                        outs.append(tf.raw_ops.RecvTPUEmbeddingActivations(
                            num_outputs=2, config=serialized))
            return outs

        outs = step()
        for k in range(R):
            check([o.numpy() for o in outs[k]], sent[k], tables, "tf.function replica %d" % k)
    print("OK")


if __name__ == "__main__":
    child_script.run(main)
