"""``examples/sparsecore_v2.py``, a SparseCore TPU script with TF's
``TPUEmbeddingV2``, run unchanged by ``python -m tf_tpu_emb.run --embedding
v2``: it trains at 1, 2 (and, slow, 4 and 8) replicas, and a step is a
global-batch step on any replica count (losses and every logical table equal
the one-replica run's).  The tables' numerics against a numpy model:
test_sparsecore_v2_standin.py."""
import json
import os

import numpy as np
import pytest

import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.system
EXAMPLE = os.path.join(harness.ROOT, "examples", "sparsecore_v2.py")


def _example(tmp_path, replicas):
    proc = harness.run_python(["-m", "tf_tpu_emb.run", "--embedding", "v2", "--replicas",
                               str(replicas), EXAMPLE], timeout=600, cwd=str(tmp_path),
                              unset=("TF_TPU_EMB_EMBEDDING",))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
    assert ("embedding class: tensorflow.python.tpu.tpu_embedding_v3.TPUEmbeddingV2, "
            "%d replica(s), 4 SparseCores per chip, stacked tables ['genre', 'user_video']"
            % replicas in proc.stdout), proc.stdout
    lines = proc.stdout.splitlines()
    losses = json.loads([line for line in lines if line.startswith("LOSSES ")][-1][len("LOSSES "):])
    tables = json.loads([line for line in lines if line.startswith("TABLES ")][-1][len("TABLES "):])
    return losses, {name: np.array(t, np.float32) for name, t in tables.items()}


@pytest.fixture(scope="module")
def example_on_one_replica(tmp_path_factory):
    return _example(tmp_path_factory.mktemp("sparsecore_example"), 1)


def test_example_trains_on_one_replica(example_on_one_replica):
    losses, tables = example_on_one_replica
    assert len(losses) == 12 and losses[-1] < losses[0]
    assert sorted(tables) == ["genre", "user", "video"]
    assert tables["video"].shape == (512, 8) and tables["genre"].shape == (32, 4)
    # The constant starting tables moved where ids were looked up.
    assert np.abs(tables["video"] - 0.05).max() > 1e-3
    assert np.abs(tables["genre"] - 0.1).max() > 1e-3


@pytest.mark.parametrize("replicas", [2, pytest.param(4, marks=pytest.mark.slow),
                                      pytest.param(8, marks=pytest.mark.slow)])
def test_example_is_one_global_batch_step_on_any_replica_count(tmp_path, replicas,
                                                              example_on_one_replica):
    losses, tables = _example(tmp_path, replicas)
    reference_losses, reference = example_on_one_replica
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)
    for name, table in tables.items():
        np.testing.assert_allclose(table, reference[name], atol=1e-6, rtol=1e-6, err_msg=name)


def test_example_is_a_tpu_script_unchanged():
    source = open(EXAMPLE).read()
    assert "tf_tpu_emb" not in source.split('"""', 2)[2]   # code written for a TPU only
