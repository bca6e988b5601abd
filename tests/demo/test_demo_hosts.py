"""`python -m tf_tpu_emb.demo --hosts 2` and `--hosts 4`: the main job with its
tables sharded over two / four embedding hosts (`tf_tpu_emb.server` processes
the demo starts on 127.0.0.1 and stops; with four, some of the demo's tables
have fewer rows than hosts, the last hosts holding empty shards as in TF's
layout), against the single-process run with the same seed and data: the
same held-out AUC (within 0.002; the sharded step is the single-engine step
up to the summation order of a bag's partial sums), every output written,
and no host left serving afterwards."""
import json
import re
import socket

import pytest
import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.system  # child processes, servers or compilers

pytest.importorskip("matplotlib")

STEPS = ["--quick", "--steps", "40", "--eval-every", "20"]


def _demo(out, *extra):
    result = harness.run_python(["-m", "tf_tpu_emb.demo", *STEPS, "--out", str(out), *extra],
                                timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    one = _demo(tmp_path_factory.mktemp("one_process"))
    two = _demo(tmp_path_factory.mktemp("two_hosts"), "--hosts", "2")
    four = _demo(tmp_path_factory.mktemp("four_hosts"), "--hosts", "4")
    return one, two, four


@pytest.mark.parametrize("hosts", [2, 4])
def test_hosts_give_the_single_process_auc(runs, hosts):
    (_, one), (_, sharded) = runs[0], runs[{2: 1, 4: 2}[hosts]]
    assert sharded["config"]["hosts"] == hosts and one["config"]["hosts"] == 0
    if hosts == 4:  # the case this run covers: a table smaller than the host count
        assert min(t["vocabulary_size"] for t in sharded["tables"].values()) < hosts
    assert [e["step"] for e in sharded["eval"]] == [e["step"] for e in one["eval"]]
    for a, b in zip(one["eval"], sharded["eval"]):
        assert abs(a["auc"] - b["auc"]) < 0.002, (a, b)
    assert abs(one["final"]["eval_auc"] - sharded["final"]["eval_auc"]) < 0.002
    assert one["final"]["eval_auc"] > 0.55  # it learned: the comparison means something
    assert abs(one["final"]["train_loss"] - sharded["final"]["train_loss"]) < 1e-3


def test_two_hosts_write_every_output(runs):
    _, (result, two), _ = runs
    assert two["serving_scores"]["matches_in_process"]
    assert "tf_tpu_emb imported: False" in result.stdout
    for key in ("checkpoint", "saved_model", "plot", "metrics"):
        assert key in two["files"]


def test_the_hosts_are_stopped_at_the_end(runs):
    _, (result, _), _ = runs
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
