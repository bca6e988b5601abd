"""TensorFlow Recommenders 0.7.7 (tf-keras 2.21) on the stand-in: its TPU
embedding layer trains through the engine with the table optimizer's exact
numerics (custom loop eager and tf.function, fit, a translated Keras
optimizer behind a schedule), its checkpoints move to its CPU fallback and
back, its serving lookup works, and the losses fit reports and the trained
table equal those of the same program under MirroredStrategy with the same
replicas, at 1, 2, 4 and 8 replicas (tests/clients/tfrs_script.py)."""
import pytest

import clients_common
import harness

pytestmark = [pytest.mark.clients, pytest.mark.system]
SCRIPT = harness.script(__file__, "tfrs_script.py")


@pytest.mark.parametrize("replicas", clients_common.REPLICAS)
def test_tfrs_tpu_path_on_the_engine(replicas):
    clients_common.require("tensorflow_recommenders")
    ours, theirs, out = clients_common.stand_in_and_mirrored(
        SCRIPT, replicas, TF_USE_LEGACY_KERAS="1")
    print("TFRS replicas=%d max deviation from numpy %s" % (
        replicas, clients_common.line_value(out, "MAXDEV ")))
    clients_common.assert_symmetric("TFRS", replicas, ours, theirs)
