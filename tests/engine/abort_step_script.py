"""An invalid Send on one replica after another replica has sent (run by
tests/engine/test_multi_replica.py in its own process: logical CPUs must be set up
before TF starts).  The step is failed for every replica: nothing is applied,
the replica that had sent gets an Aborted error from its next Recv, and the
following step trains normally.  Exit code 0 and "OK" = pass."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "common"))  # the shared test helpers
import child_script  # noqa: E402

R = 2
tf = child_script.tensorflow_with_cpus(R)

import numpy as np  # noqa: E402
import engine_util as eu  # noqa: E402
from engine_util import FeatureSpec, TableSpec  # noqa: E402

B = 3


def main():
    config = eu.feature_mode_config(
        [TableSpec("t", 10, 4, optimizer="stochastic_gradient_descent")],
        [FeatureSpec("f", 0, [B])], num_tensor_cores=R)
    desc = config.table_descriptor[0]
    rng = np.random.default_rng(0)
    with eu.engine(config):
        initial = rng.standard_normal((10, 4)).astype(np.float32)
        eu.load_table(desc, [initial])

        def enqueue_and_recv(r):
            bags = eu.random_bags(rng, B, 10, allow_empty=False)
            with tf.device("/CPU:%d" % r):
                eu.enqueue_arbitrary([eu.sparse_to_enqueue(*eu.bags_to_sparse(bags))],
                                     mode="train", device_ordinal=r)
                return eu.recv(config)

        for r in range(R):
            enqueue_and_recv(r)
        grad = np.ones((B, 4), np.float32)
        cfg = eu.serialize(config)
        with tf.device("/CPU:0"):
            tf.raw_ops.SendTPUEmbeddingGradients(inputs=[grad], learning_rates=[], config=cfg)
        try:
            with tf.device("/CPU:1"):
                tf.raw_ops.SendTPUEmbeddingGradients(inputs=[np.ones((B + 1, 4), np.float32)],
                                                     learning_rates=[], config=cfg)
            raise AssertionError("the invalid Send succeeded")
        except tf.errors.InvalidArgumentError as e:
            assert "has shape [4,4] but Recv's output is [3,4]" in str(e), e
        assert np.array_equal(eu.retrieve_table(desc)[0], initial), "the aborted step changed rows"
        # Replica 0 had sent: its next Recv reports the aborted step once.
        try:
            enqueue_and_recv(0)
            raise AssertionError("Recv after an aborted step succeeded")
        except tf.errors.AbortedError as e:
            assert "previous training step was aborted" in str(e), e
        # Nothing was dequeued by that failed Recv: recv again, then a full step.
        with tf.device("/CPU:0"):
            eu.recv(config)
        enqueue_and_recv(1)
        for r in range(R):
            with tf.device("/CPU:%d" % r):
                tf.raw_ops.SendTPUEmbeddingGradients(inputs=[grad], learning_rates=[],
                                                     config=cfg)
        assert not np.array_equal(eu.retrieve_table(desc)[0], initial), "valid step not applied"
    print("OK")


if __name__ == "__main__":
    main()
