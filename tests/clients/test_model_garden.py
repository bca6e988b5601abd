"""Model Garden (tf-models-official 2.20.0) ranking on the stand-in: its own
train_test.py TPU cases pass under ``python -m tf_tpu_emb.run``, and its own
train.py trains DLRM-DCN-v2 with ``--tpu`` given and synthetic data, its
embeddings built on the stand-in's TPU system (all of Model Garden's
embedding goes through TFRS's layer, whose numerics test_tfrs.py checks)."""
import json
import os
import re

import pytest

import clients_common
import harness

pytestmark = [pytest.mark.clients, pytest.mark.system]
TPU_CASES = ["TrainTest.testTrainEval%s" % c for c in
             ("DlrmTPUCTL", "DlrmTPU", "DcnTPUCTL", "DcnTPU", "DlrmDcnV2TPUCTL", "DlrmDcnV2TPU")]


def test_model_garden_train_test_tpu_cases(tmp_path):
    clients_common.require("official.recommendation.ranking")
    proc = clients_common.run_client(
        ["-m", "official.recommendation.ranking.train_test"] + TPU_CASES, replicas=1,
        cwd=str(tmp_path), TF_USE_LEGACY_KERAS="1", TEST_TMPDIR=str(tmp_path))
    ran = re.search(r"Ran (\d+) tests?", proc.stderr)
    print("Model Garden train_test.py TPU cases: %s" % (ran.group(0) if ran else "?"))
    assert proc.returncode == 0 and ran and int(ran.group(1)) == len(TPU_CASES), \
        harness.describe(proc, 3000, 6000)
    assert re.search(r"^OK", proc.stderr, re.M)


def test_model_garden_train_py_dlrm_dcn_v2_with_tpu_flag(tmp_path):
    clients_common.require("official.recommendation.ranking")
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
                    "train_steps": 10, "checkpoint_interval": 5,
                    "callbacks": {"enable_tensorboard": False}}}
    model_dir = tmp_path / "model"
    proc = clients_common.run_client(
        [harness.script(__file__, "model_garden_train.py"),
         "--experiment=dlrm_dcn_v2_criteo", "--mode=train_and_eval",
         "--model_dir=%s" % model_dir, "--tpu=my-tpu-name",
         "--params_override=%s" % json.dumps(params)],
        replicas=2, cwd=str(tmp_path), TF_USE_LEGACY_KERAS="1")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), \
        harness.describe(proc, 3000, 6000)
    assert int(clients_common.line_value(proc.stdout, "EMBEDDINGS_BUILT ")) >= 1
    assert any(name.startswith("ckpt-10") for name in os.listdir(model_dir)), \
        os.listdir(model_dir)
