"""Keras-RS 0.4.0 (Keras 3, TF backend) on the stand-in: DistributedEmbedding
with Keras-RS configs takes its TPU path, fit trains the table with the
table optimizer's exact numerics, Keras-RS reads the tables back by name
(the per-shard view), they serve from its CPU fallback, and fit's reported
losses and the trained table equal those of the same program under
MirroredStrategy with the same replicas, at 1, 2, 4 and 8 replicas
(tests/clients/keras_rs_script.py)."""
import pytest

import clients_common
import harness

pytestmark = [pytest.mark.clients, pytest.mark.system]
SCRIPT = harness.script(__file__, "keras_rs_script.py")


@pytest.mark.parametrize("replicas", clients_common.REPLICAS)
def test_keras_rs_tpu_path_on_the_engine(replicas):
    clients_common.require("keras_rs")
    ours, theirs, out = clients_common.stand_in_and_mirrored(
        SCRIPT, replicas, KERAS_BACKEND="tensorflow")
    print("Keras-RS replicas=%d max deviation from numpy %s" % (
        replicas, clients_common.line_value(out, "MAXDEV ")))
    clients_common.assert_symmetric("Keras-RS", replicas, ours, theirs)
