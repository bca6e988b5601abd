"""Keras-RS 0.4.0 (Keras 3, TF backend) on the stand-in SparseCore TPU
(``python -m tf_tpu_emb.run --embedding v2``): DistributedEmbedding with
``placement="sparsecore"`` (or ``"auto"``) sees embedding feature V2, builds
TF's own ``TPUEmbeddingV2``, and trains the table with the exact numerics of a
global-batch step of SGD, Adagrad, Adam and FTRL -- through ``fit`` and
through a custom ``strategy.run`` loop -- checked after every step against
the numpy reference (tests/common/optimizer_reference.py, driven by
tests/clients/keras_rs_sparsecore_script.py) at 1 and 2 (slow: 4 and 8)
replicas; ``get_embedding_tables`` reads the tables; a checkpoint restores
into a fresh model, which trains on equal to the original."""
import pytest

import clients_common
import harness

pytestmark = [pytest.mark.clients, pytest.mark.system]
SCRIPT = harness.script(__file__, "keras_rs_sparsecore_script.py")


def run(optimizer, replicas, loop, placement, *extra):
    clients_common.require("keras_rs")
    return clients_common.run_client(
        ["-m", "tf_tpu_emb.run", "--embedding", "v2", "--replicas", str(replicas), SCRIPT,
         optimizer, str(replicas), loop, placement] + list(extra), KERAS_BACKEND="tensorflow")


def _cells():
    """Every optimizer with both loops at 2 replicas; at 1 replica two
    cells (SGD through fit, Adagrad through the custom loop) and the rest in
    the slow tier, with 4 and 8 (`make test-clients-all`)."""
    cells = []
    for optimizer in ("sgd", "adagrad", "adam", "ftrl"):
        for loop in ("fit", "custom"):
            for replicas in clients_common.REPLICAS:
                r = getattr(replicas, "values", [replicas])[0]
                slow = r > 2 or (r == 1 and (optimizer, loop) not in (("sgd", "fit"),
                                                                      ("adagrad", "custom")))
                cells.append(pytest.param(optimizer, loop, r, id="%s-%s-%d" % (optimizer, loop, r),
                                          marks=[pytest.mark.slow] if slow else []))
    return cells


@pytest.mark.parametrize("optimizer,loop,replicas", _cells())
def test_keras_rs_sparsecore_path_on_the_standin(optimizer, loop, replicas):
    proc = run(optimizer, replicas, loop, "sparsecore")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
    assert "embedding class: tensorflow.python.tpu.tpu_embedding_v3.TPUEmbeddingV2" in proc.stdout
    assert "%s: 4 steps ok" % loop in proc.stdout
    assert "checkpoint: restored and trained on ok" in proc.stdout
    print("Keras-RS sparsecore %s %s replicas=%d max deviation from numpy %s" % (
        optimizer, loop, replicas, clients_common.line_value(proc.stdout, "MAXDEV ")))


def test_auto_placement_takes_the_sparsecore():
    proc = run("adagrad", 2, "fit", "auto")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
    assert "embedding class: tensorflow.python.tpu.tpu_embedding_v3.TPUEmbeddingV2" in proc.stdout


def test_keras_rs_itself_refuses_adagrad_momentum():
    """Keras-RS 0.4.0 translates SGD, Adagrad, Adam and FTRL only, and
    refuses TF's AdagradMomentum even in a TF feature config, before any
    embedding op runs; AdagradMomentum on the V2 path is tested on TF's
    TPUEmbeddingV2 directly (tests/sparsecore/test_sparsecore_v2_standin.py)."""
    proc = run("adagrad_momentum", 1, "fit", "sparsecore")
    assert proc.returncode != 0
    assert "Unknown optimizer type" in proc.stderr and "AdagradMomentum" in proc.stderr, \
        harness.describe(proc)
    assert "keras_rs" in proc.stderr  # raised by Keras-RS's config conversion


@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_pipelined_lookups_are_one_step_old(loop):
    """DistributedEmbedding(..., pipeline_execution_with_tensor_core=True):
    step k's lookup sees the table before step k-1's update, as on a TPU
    (the reference models it; without it the run would not match)."""
    proc = run("adagrad", 2, loop, "sparsecore", "pipelined")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
    assert "%s: 4 steps ok" % loop in proc.stdout
