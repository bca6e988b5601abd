"""Model Garden (tf-models-official 2.20.0) ranking on the stand-in, at the
replica counts TPUs run:

* its own ``train_test.py``: ``tpu`` cases (``testTrainEval*TPU*`` and
  ``testTrainThenEval*TPU*``) in one process under ``python -m
  tf_tpu_emb.run --replicas R`` -- every case builds a new TPUStrategy and
  model in the same process, which is what failed at 2 replicas before the
  stand-in gave each strategy its own collective keys.  CI runs four of the
  12 at 2 replicas (each model, each test, with and without the custom
  training loop: ~30 s a case on two cores); the slow tier
  (`make test-clients-all`) runs all 12 at 2 and at 8;
* its own ``train.py`` (DLRM-DCN-v2, ``--tpu`` given, synthetic data, orbit)
  for 10 steps with checkpoints, then again from the checkpoint to step 15;
* the replica-symmetry contract on the ranking task as train.py's
  compile/fit path builds it (tests/clients/model_garden_fit.py): the run
  under the stand-in with R replicas equals the same program under
  MirroredStrategy with R replicas, both started from one checkpoint, for
  every table and dense weight and every loss, at 1, 2, 4 and 8 replicas
  (CI: 2; the slow tier: all four).
"""
import json
import os
import re

import numpy as np
import pytest

import clients_common
import harness

pytestmark = [pytest.mark.clients, pytest.mark.system]
TPU_CASES = ["TrainTest.%s%s" % (test, case)
             for test in ("testTrainEval", "testTrainThenEval")
             for case in ("DlrmTPUCTL", "DlrmTPU", "DcnTPUCTL", "DcnTPU",
                          "DlrmDcnV2TPUCTL", "DlrmDcnV2TPU")]
# CI's four: every model (Dlrm, Dcn, DlrmDcnV2), both tests, CTL and not.
CI_CASES = ["TrainTest.testTrainEvalDlrmDcnV2TPUCTL", "TrainTest.testTrainThenEvalDcnTPU",
            "TrainTest.testTrainEvalDlrmTPU", "TrainTest.testTrainThenEvalDlrmDcnV2TPUCTL"]
FIT = harness.script(__file__, "model_garden_fit.py")
TWO_AND_EIGHT = [2, pytest.param(8, marks=pytest.mark.slow)]


@pytest.mark.parametrize("replicas,cases", [
    pytest.param(2, CI_CASES, id="2-four"),
    pytest.param(2, TPU_CASES, marks=pytest.mark.slow, id="2-all"),
    pytest.param(8, TPU_CASES, marks=pytest.mark.slow, id="8-all")])
def test_model_garden_train_test_tpu_cases(tmp_path, replicas, cases):
    clients_common.require("official.recommendation.ranking")
    assert set(cases) <= set(TPU_CASES) and len(TPU_CASES) == 12
    proc = clients_common.run_client(
        ["-m", "official.recommendation.ranking.train_test"] + cases, replicas=replicas,
        timeout=3600, cwd=str(tmp_path), TF_USE_LEGACY_KERAS="1", TEST_TMPDIR=str(tmp_path))
    ran = re.search(r"Ran (\d+) tests?", proc.stderr)
    print("Model Garden train_test.py TPU cases, %d replicas: %s" % (
        replicas, ran.group(0) if ran else "?"))
    assert proc.returncode == 0 and ran and int(ran.group(1)) == len(cases), \
        harness.describe(proc, 3000, 6000)
    assert re.search(r"^OK", proc.stderr, re.M)


def _train_py(tmp_path, replicas, model_dir, train_steps):
    params = {
        "runtime": {"distribution_strategy": "tpu"},
        "task": {"model": {"vocab_sizes": [40, 30, 20], "embedding_dim": [8, 8, 8],
                           "bottom_mlp": [16, 8], "top_mlp": [16, 1],
                           "interaction": "multi_layer_dcn", "dcn_num_layers": 2,
                           "dcn_low_rank_dim": 8, "use_partial_tpu_embedding": False},
                 "train_data": {"input_path": "", "global_batch_size": 16},
                 "validation_data": {"input_path": "", "global_batch_size": 16},
                 "use_synthetic_data": True},
        "trainer": {"use_orbit": True, "validation_interval": 5, "validation_steps": 2,
                    "train_steps": train_steps, "checkpoint_interval": 5,
                    "callbacks": {"enable_tensorboard": False}}}
    proc = clients_common.run_client(
        [harness.script(__file__, "model_garden_train.py"),
         "--experiment=dlrm_dcn_v2_criteo", "--mode=train_and_eval",
         "--model_dir=%s" % model_dir, "--tpu=my-tpu-name",
         "--params_override=%s" % json.dumps(params)],
        replicas=replicas, timeout=1200, cwd=str(tmp_path), TF_USE_LEGACY_KERAS="1")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), \
        harness.describe(proc, 3000, 6000)
    assert int(clients_common.line_value(proc.stdout, "EMBEDDINGS_BUILT ")) >= 1
    return proc


@pytest.mark.parametrize("replicas", TWO_AND_EIGHT)
def test_model_garden_train_py_dlrm_dcn_v2_with_tpu_flag(tmp_path, replicas):
    clients_common.require("official.recommendation.ranking")
    model_dir = tmp_path / "model"
    _train_py(tmp_path, replicas, model_dir, 10)
    assert any(name.startswith("ckpt-10") for name in os.listdir(model_dir)), \
        os.listdir(model_dir)
    # Again from the checkpoint: the trainer restores step 10 (tables from the
    # TPU embedding's checkpoint) and trains steps 11..15 only.
    proc = _train_py(tmp_path, replicas, model_dir, 15)
    assert any(name.startswith("ckpt-15") for name in os.listdir(model_dir)), \
        os.listdir(model_dir)
    log = proc.stdout + proc.stderr
    assert "restored model from %s" % (model_dir / "ckpt-10") in log, log[-4000:]
    trained_to = {int(s) for s in re.findall(r"train \| step:\s+(\d+) \| steps/sec", log)}
    assert trained_to == {15}, trained_to


@pytest.fixture(scope="module")
def fit_workdir(tmp_path_factory):
    """The input files and the one starting checkpoint of each model."""
    clients_common.require("official.recommendation.ranking")
    workdir = tmp_path_factory.mktemp("model_garden_fit")
    for config in ("dcn_v2", "partial"):
        proc = clients_common.run_client([FIT, "init", "1", str(workdir), config],
                                         TF_USE_LEGACY_KERAS="1")
        assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), \
            harness.describe(proc)
    return workdir


def _fit(workdir, mode, replicas, config, steps_per_loop=1):
    proc = clients_common.run_client(
        [FIT, mode, str(replicas), str(workdir), config, str(steps_per_loop)],
        replicas=replicas if mode == "tpu" else None, timeout=1200, TF_USE_LEGACY_KERAS="1")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
    with np.load(os.path.join(workdir, "%s-%s-%d-%d.npz" % (
            config, mode, replicas, steps_per_loop))) as arrays:
        return {"losses": arrays["losses"].tolist() + arrays["val_losses"].tolist(),
                "tables": {k: arrays[k] for k in arrays.files if k.startswith("table:")},
                "dense": {k: arrays[k] for k in arrays.files if k.startswith("dense:")}}


# CI runs 2 replicas (the strategy's cross-replica reductions, and for
# `partial` also steps_per_loop); 1, 4 and 8 are the slow tier.
FIT_REPLICAS = [pytest.param(1, marks=pytest.mark.slow)] + clients_common.REPLICAS[1:]


@pytest.mark.parametrize("config", ["dcn_v2", "partial"])
@pytest.mark.parametrize("replicas", FIT_REPLICAS)
def test_model_garden_fit_replica_symmetry(fit_workdir, replicas, config):
    """dcn_v2: every table on the TPU embedding (multi-hot, mean combiner),
    SGD behind Model Garden's warm-up schedule, Adam on the dense part;
    partial: tables under the size threshold are Keras embeddings whose
    sparse gradients the strategy reduces across the replicas."""
    ours = _fit(fit_workdir, "tpu", replicas, config)
    theirs = _fit(fit_workdir, "mirrored", replicas, config)
    assert len(ours["tables"]) == 26 and len(ours["dense"]) > 4
    clients_common.assert_symmetric("Model Garden %s" % config, replicas, ours, theirs)
    if replicas > 1 and config == "partial":
        # train.py's steps_per_loop (several steps in one tf.function call):
        # the same weights as one step per call.
        looped = _fit(fit_workdir, "tpu", replicas, config, steps_per_loop=5)
        for kind in ("tables", "dense"):
            for name, value in looped[kind].items():
                np.testing.assert_allclose(value, ours[kind][name], rtol=0, atol=1e-6,
                                           err_msg=name)
        np.testing.assert_allclose(looped["losses"][-2:], ours["losses"][-2:], rtol=1e-6)
