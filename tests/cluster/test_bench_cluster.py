"""benchmarks/bench_cluster.py: its --quick run on 1 and 2 loopback hosts,
with the ParameterServerStrategy side, completes with activations equal to
the local engine's and prints every figure; and its bytes per host are what
the routing moves: the automatic form never moves more than either fixed
form, and a host's share shrinks as hosts are added.  benchmarks/bench_pinned.py
(pinned cores; direct and through the simulated network of
benchmarks/netsim_relay.py) runs its --quick form and fills its table, and so
does benchmarks/transport_floor.py, moving the routed bytes."""
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


@pytest.mark.long
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


@pytest.mark.long
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


@pytest.mark.long
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


FLOOR = os.path.join(harness.ROOT, "benchmarks", "transport_floor.py")


def test_transport_floor_quick_run_moves_the_routed_bytes(lib):
    """benchmarks/transport_floor.py (a host step's three tensors through TF's
    runtime and through a bare socket, pinned; the local step and a host's
    engine work alone beside them) runs, moves what the router says one
    host's training step moves (routing.bytes_per_host), its socket host read
    every byte (it checks them itself: MISMATCH), and fills its table for
    every side at 1 and 10 steps a call, and the bound per steps a call."""
    del lib
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cores to pin the worker and the host apart")
    result = harness.run_python([FLOOR, "--quick", "--worker-cpus", str(cpus[0]),
                                 "--host-cpus", str(cpus[1])], timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "MISMATCH" not in result.stdout + result.stderr
    bench = _bench_module()
    args = bench.parse_args(["--quick"])  # the same small workload as the script's --quick
    tables, features, _ = bench.workload(args)
    emb = bench.make_embedding(args, tables)
    config = emb._config  # pylint: disable=protected-access
    emb.shutdown()
    (to_host, from_host), = bench.bytes_per_host(config, features, 1)
    head = [line for line in result.stdout.splitlines() if line.startswith("transport_floor:")]
    words = head[0].split()
    moved = {words[i - 1].rstrip(","): int(words[i]) for i in range(1, len(words))
             if words[i - 1] in ("batch", "activations", "gradients")}
    assert moved == {"batch": to_host - from_host, "activations": from_host,
                     "gradients": from_host}, head
    table = result.stdout.split("medians over", 1)[1].splitlines()
    assert table[1].split() == ["side", "steps", "step_ms", "worker_cpu", "host_cpu",
                                "total_cpu", "GB/s"], table
    rows = []
    for line in table[2:]:
        if not line.strip() or line.startswith("cpu"):
            break
        rows.append(line.split())
    assert sorted((row[0], row[1]) for row in rows) == sorted(
        (side, steps) for side in ("engine", "local", "socket", "tf") for steps in ("1", "10")
    ), table
    assert all(float(row[2]) > 0 for row in rows), table
    bounds = [line for line in table if "/call: engine" in line]
    assert [line.split("/")[0].strip() for line in bounds] == ["1", "10"], table
