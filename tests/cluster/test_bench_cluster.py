"""benchmarks/bench_cluster.py: its --quick run on 1 and 2 loopback hosts,
with the ParameterServerStrategy side, completes with activations equal to
the local engine's and prints every figure; and its bytes per host are what
the routing moves: the automatic form never moves more than either fixed
form, and a host's share shrinks as hosts are added.  benchmarks/bench_pinned.py
(pinned cores; direct and through the simulated network of
benchmarks/netsim_relay.py) runs its --quick form and fills its table."""
import importlib.util
import os

import numpy as np
import pytest

import harness

pytestmark = pytest.mark.system  # child processes, servers

BENCH = os.path.join(harness.ROOT, "benchmarks", "bench_cluster.py")
BREAKDOWN = os.path.join(harness.ROOT, "benchmarks", "cluster_breakdown.py")


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_cluster", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_matches_the_local_engine():
    result = harness.run_python([BENCH, "--quick", "--rounds", "1", "--blocks", "1", "--pss"],
                                timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "MISMATCH" not in result.stdout
    lines = result.stdout.splitlines()
    for side in ("local", "1 host", "2 hosts"):
        rows = [line for line in lines if line.startswith(side + " ")]
        assert len(rows) == 2, result.stdout  # 1 and 10 steps per call
        if side != "local":
            assert all(row.split()[-1].endswith("x") for row in rows), rows  # ours/PSS


def test_breakdown_quick_run_prints_every_component():
    """benchmarks/cluster_breakdown.py (the step's time, part by part) runs."""
    result = harness.run_python([BREAKDOWN, "--quick", "--rounds", "1"], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = result.stdout.split("medians over", 1)[1].splitlines()
    header = table[1].split()
    for column in ("local", "step", "step10", "worker_ops", "kernels_max", "transfer", "rtt",
                   "mb_to", "mb_from"):
        assert column in header, table
    rows = [line.split() for line in table[2:] if line.strip()]
    assert [row[0] for row in rows] == ["1", "2"], table
    assert all(len(row) == len(header) and row[-1].endswith("x") for row in rows), table


def test_bytes_per_host_auto_form_and_host_count(lib):
    del lib
    bench = _bench_module()
    args = bench.parse_args(["--quick", "--tables", "3", "--batch", "64", "--hot", "1"])
    tables, features, _ = bench.workload(args)
    emb = bench.make_embedding(args, tables)
    config = emb._config  # pylint: disable=protected-access
    emb.shutdown()
    mean = {}
    for hosts in (1, 2, 4):
        total = {form: sum(a + b for a, b in bench.bytes_per_host(config, features, hosts, form))
                 for form in ("auto", "bags", "rows")}
        assert total["auto"] <= min(total["bags"], total["rows"]), (hosts, total)
        moved = bench.bytes_per_host(config, features, hosts)
        assert len(moved) == hosts
        mean[hosts] = np.mean([a + b for a, b in moved])
    assert mean[1] > mean[2] > mean[4], mean


PINNED = os.path.join(harness.ROOT, "benchmarks", "bench_pinned.py")


@pytest.mark.parametrize("net", ["direct", "relay"])
def test_pinned_quick_run_prints_every_figure(net):
    """benchmarks/bench_pinned.py (hosts and worker on disjoint cores; with
    ``--net relay`` through benchmarks/netsim_relay.py) runs, its hosts side
    equals the local engine, and every column of its table is filled."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cores to pin the worker and the hosts apart")
    args = [PINNED, "--quick", "--net", net, "--worker-cpus", str(cpus[0]),
            "--host-cpus", str(cpus[1])]
    if net == "relay":
        args += ["--delays-us", "0,500", "--rate-gbit", "10"]
    result = harness.run_python(args, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "MISMATCH" not in result.stdout
    table = result.stdout.split("medians over", 1)[1].splitlines()
    header = table[1].split()
    assert header[:8] == ["net", "pipe", "steps", "local_ms", "local_sps", "hosts_ms",
                          "hosts_sps", "overhead"], table
    rows = [line.split() for line in table[2:] if line.strip() and not line.startswith("(")]
    nets = ["direct"] if net == "direct" else ["0us", "500us"]
    want = [(n, pipe, steps) for n in nets for pipe in ("off", "on") for steps in ("1", "10")]
    assert [tuple(row[:3]) for row in rows] == want, table
    for row in rows:
        assert len(row) == len(header), (header, row)
        assert float(row[header.index("MB/step")]) > 0, row
