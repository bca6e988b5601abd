"""The worker script of docs/guides/several-machines.md,
examples/cluster_worker.py, run as a user runs it: against real
`python -m tf_tpu_emb.server` hosts on 127.0.0.1 (MOD, 2 hosts),
checkpointing, then started again after a host restart to resume; every
epoch's losses equal the same script on one in-process engine."""
import pathlib
import re

import pytest

import harness  # tests/common: the one way to start a child process
from cluster import LoopbackCluster

EXAMPLE = pathlib.Path(harness.ROOT) / "examples" / "cluster_worker.py"
EPOCH = re.compile(r"^epoch (\d+): loss first (\S+) last (\S+) mean (\S+)$", re.M)

pytestmark = [pytest.mark.system, pytest.mark.long]


def run_example(*args):
    proc = harness.run_python([str(EXAMPLE), "--steps-per-epoch", "8", *args], timeout=400)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(
        proc, 3000, 5000)
    return proc.stdout, {int(m[0]): [float(x) for x in m[1:]] for m in EPOCH.findall(proc.stdout)}


def assert_same_losses(got, want):
    assert got, "no epoch line"
    for epoch, losses in got.items():
        assert losses == pytest.approx(want[epoch], rel=1e-5, abs=1e-6), epoch


def test_worker_example_on_hosts_resumes_and_matches_one_engine(tmp_path):
    _, local = run_example("--epochs", "2")
    assert sorted(local) == [1, 2] and local[2][2] < local[1][0]  # it learns
    ckpt = str(tmp_path / "ckpt")
    with LoopbackCluster(2) as cluster:
        common = ("--hosts", ",".join(cluster.addresses), "--sharding", "MOD",
                  "--checkpoint-dir", ckpt)
        out, first = run_example("--epochs", "1", *common)
        assert "connected to EmbeddingHosts" in out and "saved " in out
        assert sorted(first) == [1]
        assert_same_losses(first, local)
        cluster.restart(1)  # a host restarted between the two trainers
        out, resumed = run_example("--epochs", "2", *common)
        assert "restored " in out and "(epoch 1)" in out
        assert sorted(resumed) == [2]
        assert_same_losses(resumed, local)


def test_guide_command_uses_the_examples_flags():
    """The guide's worker command (docs/guides/several-machines.md) names this
    script and only its flags."""
    guide = (pathlib.Path(harness.ROOT) / "docs" / "guides" / "several-machines.md").read_text()
    command = re.search(r"python examples/cluster_worker\.py (.*?)\n\n", guide, re.S)
    assert command, "docs/guides/several-machines.md has no examples/cluster_worker.py command"
    flags = set(re.findall(r"(--[a-z-]+)", command.group(1)))
    assert flags and flags <= set(re.findall(r'"(--[a-z-]+)"', EXAMPLE.read_text()))
