"""Keras-RS 0.4.0 (Keras 3, TF backend) on the stand-in: DistributedEmbedding
with Keras-RS configs takes its TPU path, fit trains the table with the
table optimizer's exact numerics, Keras-RS reads the tables back by name
(the per-shard view), they serve from its CPU fallback, and fit's reported
loss equals that of the same program under MirroredStrategy
(tests/clients/keras_rs_script.py)."""
import json

import numpy as np
import pytest

import clients_common
import harness

pytestmark = [pytest.mark.clients, pytest.mark.system]
SCRIPT = harness.script(__file__, "keras_rs_script.py")


@pytest.mark.parametrize("replicas", [1, 2])
def test_keras_rs_tpu_path_on_the_engine(replicas):
    clients_common.require("keras_rs")
    tpu = clients_common.run_client([SCRIPT, "tpu", str(replicas)], replicas=replicas,
                                    KERAS_BACKEND="tensorflow")
    assert tpu.returncode == 0 and tpu.stdout.strip().endswith("OK"), harness.describe(tpu)
    print("Keras-RS replicas=%d max deviation %s" % (
        replicas, clients_common.line_value(tpu.stdout, "MAXDEV ")))
    mirrored = clients_common.run_client([SCRIPT, "mirrored", str(replicas)],
                                         KERAS_BACKEND="tensorflow")
    assert mirrored.returncode == 0, harness.describe(mirrored)
    ours, theirs = (json.loads(clients_common.line_value(p.stdout, "LOSSES "))
                    for p in (tpu, mirrored))
    assert ours[0] == pytest.approx(theirs[0], rel=1e-7)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
