"""benchmarks/bench_cluster.py: its --quick run on 1 and 2 loopback hosts
completes with activations equal to the local engine's, and its bytes-per-host
figure adds up: over the hosts, the routed ids (int64) and weights (float32)
are every id of the batch once, each host gets the row splits (one row per
output position) of every feature, and the activations / gradients are the
full batch per host."""
import importlib.util
import os

import pytest

import harness

pytestmark = pytest.mark.system  # child processes, servers or compilers

BENCH = os.path.join(harness.ROOT, "benchmarks", "bench_cluster.py")


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_cluster", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_matches_the_local_engine():
    result = harness.run_python([BENCH, "--quick"], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "MISMATCH" not in result.stdout
    lines = result.stdout.splitlines()
    for side in ("local", "1 host", "2 hosts"):
        assert any(line.startswith(side + " ") for line in lines), result.stdout


def test_bytes_per_host_add_up_to_the_batch():
    bench = _bench_module()
    args = bench.parse_args(["--quick", "--tables", "3", "--batch", "16", "--hot", "4"])
    _, features, _ = bench.workload(args)
    activations = args.tables * args.batch * args.dim * 4
    for hosts in (1, 2, 3):
        moved = bench.bytes_per_host(args, features, hosts)
        assert len(moved) == hosts
        assert all(back == activations for _, back in moved)
        splits = args.tables * (args.batch + 1) * 8  # int64 row splits, one row a position
        routed = sum(to - activations - splits for to, _ in moved)
        assert routed == args.tables * args.batch * args.hot * (8 + 4)
