"""Keras-RS 0.4.0 (Keras 3, TF backend) on the stand-in SparseCore TPU
(``python -m tf_tpu_emb.run --embedding v2``): DistributedEmbedding with
``placement="sparsecore"`` sees embedding feature V2, builds TF's own
``TPUEmbeddingV2``, and ``fit`` trains the table with the exact numerics of a
global-batch step of SGD and Adagrad (checked after every step against the
numpy reference in tests/clients/keras_rs_sparsecore_script.py) at 1, 2 (and,
slow, 4 and 8) replicas."""
import pytest

import clients_common
import harness

pytestmark = [pytest.mark.clients, pytest.mark.system]
SCRIPT = harness.script(__file__, "keras_rs_sparsecore_script.py")


@pytest.mark.parametrize("replicas", clients_common.REPLICAS)
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_keras_rs_sparsecore_path_on_the_standin(optimizer, replicas):
    clients_common.require("keras_rs")
    proc = clients_common.run_client(
        ["-m", "tf_tpu_emb.run", "--embedding", "v2", "--replicas", str(replicas), SCRIPT,
         optimizer, str(replicas)], KERAS_BACKEND="tensorflow")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
    assert "embedding class: tensorflow.python.tpu.tpu_embedding_v3.TPUEmbeddingV2" in proc.stdout
    assert "fit: 4 steps ok" in proc.stdout
    print("Keras-RS sparsecore %s replicas=%d max deviation from numpy %s" % (
        optimizer, replicas, clients_common.line_value(proc.stdout, "MAXDEV ")))
