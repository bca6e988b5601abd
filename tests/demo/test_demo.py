"""The main job, `python -m tf_tpu_emb.demo`, end to end with --quick (40
steps here: the same seed and data make the runs comparable).

One run in a fresh process into a temporary folder: it trains the DLRM-style
model on the CPU engine, writes the plot, metrics, checkpoint and SavedModel,
and scores held-out examples from the SavedModel in another fresh process
that must not import tf_tpu_emb.

`--hosts 2`: the same job with its tables sharded over two embedding hosts
(`tf_tpu_emb.server` processes the demo starts on 127.0.0.1 and stops),
against that single-process run: the same held-out AUC (within 0.002; the
sharded step is the single-engine step up to the summation order of a bag's
partial sums), every output written, and no host left serving afterwards.
More hosts than a table has rows (empty shards, as in TF's layout) are
tests/cluster's (test_sharded_engine.py, test_checkpoint_layout.py), on the
engine without the demo around it.
"""
import json
import math
import re
import socket

import pytest
import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.system  # child processes, servers or compilers

pytest.importorskip("matplotlib")


STEPS = ["--quick", "--steps", "40", "--eval-every", "20"]


def _demo(out, *extra):
    return out, harness.run_python(["-m", "tf_tpu_emb.demo", *STEPS, "--out", str(out), *extra],
                                   timeout=900)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    return _demo(tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    out, result = _demo(tmp_path_factory.mktemp("two_hosts"), "--hosts", "2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads((out / "metrics.json").read_text())


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


@pytest.mark.long
def test_two_hosts_give_the_single_process_auc(demo_run, two_hosts):
    out, result = demo_run
    assert result.returncode == 0, result.stderr[-3000:]
    one = json.loads((out / "metrics.json").read_text())
    _, sharded = two_hosts
    assert sharded["config"]["hosts"] == 2 and one["config"]["hosts"] == 0
    assert [e["step"] for e in sharded["eval"]] == [e["step"] for e in one["eval"]]
    for a, b in zip(one["eval"], sharded["eval"]):
        assert abs(a["auc"] - b["auc"]) < 0.002, (a, b)
    assert abs(one["final"]["eval_auc"] - sharded["final"]["eval_auc"]) < 0.002
    assert one["final"]["eval_auc"] > 0.55  # it learned: the comparison means something
    assert abs(one["final"]["train_loss"] - sharded["final"]["train_loss"]) < 1e-3


@pytest.mark.long
def test_two_hosts_write_every_output(two_hosts):
    result, two = two_hosts
    assert two["serving_scores"]["matches_in_process"]
    assert "tf_tpu_emb imported: False" in result.stdout
    for key in ("checkpoint", "saved_model", "plot", "metrics"):
        assert key in two["files"]


@pytest.mark.long
def test_the_hosts_are_stopped_at_the_end(two_hosts):
    result, _ = two_hosts
    match = re.search(r"over 2 embedding hosts: (\S+), (\S+)", result.stdout)
    assert match, result.stdout[-2000:]
    for address in match.groups():
        host, port = address.rsplit(":", 1)
        with pytest.raises(OSError):
            socket.create_connection((host, int(port)), timeout=5).close()


def test_bad_host_count_is_refused():
    result = harness.run_python(["-m", "tf_tpu_emb.demo", "--quick", "--hosts", "-1"],
                                timeout=120)
    assert result.returncode == 2
    assert "--hosts must be >= 0" in result.stderr
