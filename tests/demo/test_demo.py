"""The main job, `python -m tf_tpu_emb.demo`, end to end with --quick.

One run in a fresh process into a temporary folder: it trains the DLRM-style
model on the CPU engine, writes the plot, metrics, checkpoint and SavedModel,
and scores held-out examples from the SavedModel in another fresh process
that must not import tf_tpu_emb.
"""
import json
import math

import pytest
import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.system  # child processes, servers or compilers

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    result = harness.run_python(["-m", "tf_tpu_emb.demo", "--quick", "--out", str(out)],
                                timeout=300)
    return out, result


def test_demo_exits_cleanly(demo_run):
    _, result = demo_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "held-out AUC" in result.stdout
    assert "tf_tpu_emb imported: False" in result.stdout


def test_demo_writes_outputs(demo_run):
    out, result = demo_run
    assert result.returncode == 0, result.stderr[-3000:]
    png = out / "loss_auc.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "saved_model" / "saved_model.pb").is_file()
    assert (out / "checkpoint" / "checkpoint").is_file()
    assert list((out / "checkpoint").glob("ckpt-1.index"))


def test_demo_metrics(demo_run):
    out, result = demo_run
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    final = metrics["final"]
    assert final["eval_auc"] > 0.5
    assert final["oracle_auc"] > final["eval_auc"] - 0.05
    assert math.isfinite(final["train_loss"]) and math.isfinite(final["eval_loss"])
    assert metrics["train"] and all(math.isfinite(h["loss"]) for h in metrics["train"])
    assert [e["step"] for e in metrics["eval"]][0] == 0
    assert final["examples_per_sec"] > 0
    scores = metrics["serving_scores"]
    assert scores["matches_in_process"]
    assert all(0.0 < p < 1.0 for p in scores["probability"])
