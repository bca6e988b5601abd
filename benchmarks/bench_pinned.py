#!/usr/bin/env python3
"""The embedding hosts measured as separate machines: hosts and worker pinned
to disjoint cores, and a simulated network between them.

The protocol (issue 31):

* this process (the worker, and the local baseline) pins itself to
  ``--worker-cpus`` before TensorFlow starts (``os.sched_setaffinity``: what
  ``taskset`` does); each host is started as
  ``taskset -c HOST_CPUS python -m tf_tpu_emb.server`` (``--host-cpus``), so
  a host stands in for a machine of its own and the local baseline gets
  exactly the worker's cores;
* ``--net direct``: the worker reaches the hosts on 127.0.0.1 (loopback, no
  network cost); ``--net relay``: every connection between the tasks (both
  directions: the worker pulls the activations, a host pulls the batch and
  the gradients) goes through ``benchmarks/netsim_relay.py``, a userspace
  relay on 127.0.0.1 (the cluster spec the worker connects with names the
  relay's ports for every task) that adds a one-way delay and a byte rate
  (``--delays-us``, ``--rate-gbit``; ``tc netem`` is not available on this
  kernel, see the relay's docstring).  The relay runs in its own process
  (pinned to ``--relay-cpus``); its CPU time is reported apart (a real
  network costs no CPU) and its ``0`` delay at unlimited rate (``--delays-us
  0`` with ``--rate-gbit 0``) measures what the relay itself adds.

``--pipeline off,on``: both sides built with that
``pipeline_execution_with_tensor_core`` (interleaved; the hosts' side then
overlaps step k's update with step k+1's lookup traffic, engine/engine.h
``deferred_``, and looks step k+1 up before step k's gradients come,
``lookahead_``; the first step must still equal the local side's, which runs
the same rule).  ``--pss``: per round (and delay) also
``pss_side.py``, ParameterServerStrategy with its parameter servers on
``--host-cpus`` and its coordinator and worker on ``--worker-cpus`` (with
``--net relay`` through a relay of its own, with the same delay and rate).

The step is ``bench_cluster.py``'s (the mid-level API: enqueue, dequeue,
apply_gradients of a fixed activation gradient; Adagrad, combiner mean,
ragged Zipf bags; the same tables).  Per round and network setting the
local and the hosts sides alternate in ``--blocks`` blocks of ``--steps``
calls; per side: step time (median call / steps per call), samples/s, CPU
seconds per step summed over every process of the side (this one and the
hosts, from /proc/PID/stat: user + system of all their threads; the relay
apart), and bytes per step (through the relay, both directions, as counted
by it; with ``--net direct`` the routed payload of ``bench_cluster.py``).
The table gives medians over rounds; overhead = hosts / local of the same
round.  The first step of the hosts side must equal the local one's (rtol
1e-5), else exit status 1.

    .venv/bin/python benchmarks/bench_pinned.py --net direct --pss
    .venv/bin/python benchmarks/bench_pinned.py --net relay --delays-us 50,500 --rate-gbit 10
    .venv/bin/python benchmarks/bench_pinned.py --quick        # smoke run
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_list(text):
    out = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return sorted(out)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker-cpus", default="0", help="cores of this process (default 0)")
    p.add_argument("--host-cpus", default="1", help="cores of the hosts (default 1)")
    p.add_argument("--relay-cpus", default=None, help="cores of the relay (default: the hosts')")
    p.add_argument("--hosts", type=int, default=1)
    p.add_argument("--net", default="direct", choices=("direct", "relay"))
    p.add_argument("--delays-us", default="50,500",
                   help="one-way delays of the relay, a comma list, interleaved (default 50,500)")
    p.add_argument("--rate-gbit", type=float, default=10.0, help="relay rate (0: unlimited)")
    p.add_argument("--steps-per-call", default="1,10")
    p.add_argument("--batches", type=int, default=1,
                   help="distinct batches a call's steps cycle through (default 1: the same "
                        "batch every step; bench_cluster.more_batches)")
    p.add_argument("--pipeline", default="off,on",
                   help="pipeline_execution_with_tensor_core of both sides, a comma list of "
                        "off/on, interleaved (default off,on)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--steps", type=int, default=20, help="timed calls per block (default 20)")
    p.add_argument("--warmup", type=int, default=3)
    for k, v in dict(tables=8, vocab=100_000, dim=32, batch=1024, hot=10).items():
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pss", action="store_true",
                   help="per round, also ParameterServerStrategy (pss_side.py) on --hosts "
                        "parameter servers pinned to --host-cpus, its coordinator and worker "
                        "to --worker-cpus; with --net relay through a relay of its own")
    p.add_argument("--quick", action="store_true",
                   help="tiny smoke run (small tables and batch, 1 round, 1 block of 3 calls)")
    args = p.parse_args(argv)
    if args.quick:
        args.tables, args.vocab, args.dim, args.batch, args.hot = 2, 1000, 8, 64, 3
        args.rounds, args.blocks, args.steps, args.warmup = 1, 1, 3, 1
    args.steps_per_call = [int(s) for s in args.steps_per_call.split(",") if s]
    args.pipeline = [s.strip() for s in args.pipeline.split(",") if s.strip()]
    if not args.pipeline or set(args.pipeline) - {"off", "on"}:
        p.error("--pipeline must list off and/or on, got %r" % ",".join(args.pipeline))
    args.delays_us = ([float(s) for s in args.delays_us.split(",") if s]
                      if args.net == "relay" else [None])
    args.relay_cpus = args.relay_cpus or args.host_cpus
    if set(cpu_list(args.worker_cpus)) & set(cpu_list(args.host_cpus)):
        p.error("--worker-cpus and --host-cpus must be disjoint")
    return args


def cpu_seconds(pids):
    """User + system seconds of every thread of `pids` (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / tick


class Relay:
    """benchmarks/netsim_relay.py as a child process, pinned."""

    def __init__(self, ports, cpus, delay_us, rate_gbit):
        self.proc = subprocess.Popen(
            ["taskset", "-c", cpus, sys.executable, os.path.join(HERE, "netsim_relay.py"),
             "--ports", ",".join(map(str, ports)), "--delay-us", str(delay_us),
             "--rate-gbit", str(rate_gbit)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("netsim_relay ready"):
            raise RuntimeError("netsim_relay did not start: %r" % line)

    def command(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def stats(self):
        return json.loads(self.command("stats"))

    def moved(self):
        return sum(m["in"] + m["out"] for m in self.stats()["maps"].values())

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()  # it exits when stdin closes
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def pss_round(args, delay=None):
    """pss_side.py under this protocol (through a relay of its own with
    `delay` us one way, when not None): ({steps per call: seconds per step},
    {steps per call: CPU seconds per step over its processes})."""
    cmd = ["taskset", "-c", args.worker_cpus, sys.executable, os.path.join(HERE, "pss_side.py"),
           "--hosts", str(args.hosts), "--steps-per-call", ",".join(map(str, args.steps_per_call)),
           "--blocks", str(args.blocks), "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--seed", str(args.seed), "--worker-cpus", args.worker_cpus, "--ps-cpus", args.host_cpus]
    if delay is not None:
        cmd += ["--relay", "%g,%g,%s" % (delay, args.rate_gbit, args.relay_cpus)]
    for k in ("tables", "vocab", "dim", "batch", "hot"):
        cmd += ["--" + k, str(getattr(args, k))]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError("pss_side.py failed (%s):\n%s" % (
            result.returncode, (result.stdout + result.stderr)[-3000:]))
    out = json.loads(lines[-1])
    return ({int(k): v for k, v in out["steps_per_call"].items()},
            {int(k): v for k, v in out["cpu_per_step"].items()})


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.sched_setaffinity(0, cpu_list(args.worker_cpus))  # before TensorFlow sizes its pools
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    spec = importlib.util.spec_from_file_location("bench_cluster",
                                                  os.path.join(HERE, "bench_cluster.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb.cluster import EmbeddingHosts  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb.cluster import local as local_hosts  # pylint: disable=import-outside-toplevel

    args.form, args.seed = "auto", args.seed
    tables, features, cot = bench.workload(args)
    batches = [features] + bench.more_batches(args, args.batches - 1)
    ports = local_hosts.free_ports(2 * (args.hosts + 1))
    host_ports, worker_port = ports[:args.hosts], ports[args.hosts]
    relay_ports = ports[args.hosts + 1:]  # the same tasks, through the relay
    print("bench_pinned: %d tables x %s rows x dim %d, batch %d, %d ids a sample; %d host(s) on "
          "cores %s, worker and local baseline on cores %s; net %s%s; steps per call %s; "
          "pipelining %s; %d rounds of %d blocks of %d calls (TensorFlow %s, load %s)"
          % (args.tables, format(args.vocab, ","), args.dim, args.batch, args.hot, args.hosts,
             args.host_cpus, args.worker_cpus, args.net,
             " (relay on cores %s, one-way %s us, %s Gbit/s)"
             % (args.relay_cpus, ",".join("%g" % d for d in args.delays_us),
                "%g" % args.rate_gbit if args.rate_gbit else "unlimited")
             if args.net == "relay" else "",
             ",".join(map(str, args.steps_per_call)), ",".join(args.pipeline), args.rounds,
             args.blocks, args.steps,
             tf.__version__, " ".join("%.2f" % x for x in os.getloadavg())), flush=True)

    real = ["127.0.0.1:%d" % p for p in host_ports]
    procs, relay = [], None
    try:
        for k in range(args.hosts):
            procs.append(subprocess.Popen(
                ["taskset", "-c", args.host_cpus, sys.executable, "-m", "tf_tpu_emb.server",
                 "--cluster", json.dumps({"embedding": real}), "--task", str(k),
                 "--replicas", "1", "--lifetime-seconds", "7200", "--exit-with-parent"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
        deadline = time.monotonic() + local_hosts.START_TIMEOUT_S
        for k, proc in enumerate(procs):
            local_hosts.LocalHosts._wait_ready(proc, k, deadline)  # pylint: disable=protected-access
        if args.net == "relay":
            relay = Relay(["%d:%d" % pair for pair in zip(relay_ports, host_ports + [worker_port])],
                          args.relay_cpus, args.delays_us[0], args.rate_gbit)
            # This process's task binds worker_port although its cluster spec
            # (the one the hosts get) names the relay's port for it.
            from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
            set_server_def = context.Context.set_server_def

            def bind_worker_port(self, server_def, *a, **k):
                server_def.port = worker_port
                return set_server_def(self, server_def, *a, **k)
            context.Context.set_server_def = bind_worker_port
            hosts = EmbeddingHosts({"embedding": ["127.0.0.1:%d" % p for p in relay_ports[:-1]]},
                                   client_address="127.0.0.1:%d" % relay_ports[-1])
        else:
            hosts = EmbeddingHosts({"embedding": real},
                                   client_address="127.0.0.1:%d" % worker_port)
        hosts.connect()
        side_pids = {"local": [os.getpid()], "hosts": [os.getpid()] + [p.pid for p in procs]}
        results = {}  # (delay, pipeline, steps) -> list of per-round dicts
        pss_rows = {}  # delay -> per round: ({steps: s per step}, {steps: CPU s per step})
        failed = False
        for r, delay, pipe in ((r, d, m) for r in range(args.rounds) for d in args.delays_us
                               for m in args.pipeline):
            if relay is not None:
                relay.command("set %g %g" % (delay, args.rate_gbit))
            local = bench.make_embedding(args, tables, pipelined=pipe == "on")
            clustered = bench.make_embedding(args, tables, hosts, pipelined=pipe == "on")
            try:
                for steps in args.steps_per_call:
                    calls = {"local": bench.make_call(local, batches, cot, steps),
                             "hosts": bench.make_call(clustered, batches, cot, steps)}
                    if r == 0 and steps == args.steps_per_call[0] and delay == args.delays_us[0]:
                        # The same flag on both sides: equal activations
                        # (test_pipelined.py checks every step and table).
                        want = {k: v.numpy() for k, v in calls["local"]().items()}
                        got = {k: v.numpy() for k, v in calls["hosts"]().items()}
                        for name in want:
                            if not np.allclose(got[name], want[name], rtol=1e-5, atol=1e-6):
                                print("MISMATCH: feature %s differs from the local engine"
                                      % name, flush=True)
                                failed = True
                    for call in calls.values():
                        for _ in range(args.warmup):
                            call()["f0"].numpy()
                    times = {s: [] for s in calls}
                    cpu = {s: 0.0 for s in calls}
                    host_cpu = 0.0  # the hosts' processes alone (the hosts side)
                    moved = 0
                    relay_cpu = 0.0
                    if relay:
                        relay.command("reset")
                    for _ in range(args.blocks):
                        for side, call in calls.items():
                            c0 = cpu_seconds(side_pids[side])
                            h0 = cpu_seconds(side_pids[side][1:])
                            m0 = relay.moved() if relay and side == "hosts" else 0
                            rc0 = cpu_seconds([relay.proc.pid]) if relay else 0.0
                            for _ in range(args.steps):
                                t0 = time.perf_counter()
                                call()["f0"].numpy()
                                times[side].append((time.perf_counter() - t0) / steps)
                            cpu[side] += cpu_seconds(side_pids[side]) - c0
                            host_cpu += cpu_seconds(side_pids[side][1:]) - h0
                            if relay and side == "hosts":
                                moved += relay.moved() - m0
                                relay_cpu += cpu_seconds([relay.proc.pid]) - rc0
                    n = args.blocks * args.steps * steps
                    row = {s: statistics.median(t) for s, t in times.items()}
                    row.update({"cpu_" + s: cpu[s] / n for s in calls})
                    row["cpu_host_only"] = host_cpu / n
                    row["bytes"] = moved / n if relay else sum(
                        a + b for a, b in bench.bytes_per_host(
                            clustered._config, features, args.hosts))  # pylint: disable=protected-access
                    row["relay_cpu"] = relay_cpu / n
                    row["late_us"] = relay.stats()["late_mean_us"] if relay else 0.0
                    results.setdefault((delay, pipe, steps), []).append(row)
                    print("round %d, %s, pipeline %s, %d/call: local %.2f ms (%.2f cpu-ms), "
                          "hosts %.2f ms (%.2f cpu-ms, %.2f of them the hosts'), %.3f MB/step, "
                          "load %.2f"
                          % (r, "direct" if delay is None else "%g us" % delay, pipe, steps,
                             row["local"] * 1e3, row["cpu_local"] * 1e3,
                             row["hosts"] * 1e3, row["cpu_hosts"] * 1e3,
                             row["cpu_host_only"] * 1e3, row["bytes"] / 1e6,
                             os.getloadavg()[0]), flush=True)
            finally:
                clustered.shutdown()
                local.shutdown()
            if args.pss and pipe == args.pipeline[-1]:
                pss_rows.setdefault(delay, []).append(pss_round(args, delay))
                print("round %d, %s, PSS: %s ms" % (
                    r, "direct" if delay is None else "%g us" % delay, ", ".join(
                        "%d/call %.2f" % (k, v * 1e3) for k, v in pss_rows[delay][-1][0].items())),
                    flush=True)
        print("\nmedians over %d rounds (load %s)" % (
            args.rounds, " ".join("%.2f" % x for x in os.getloadavg())))
        print("%-10s %4s %5s %9s %9s %9s %9s %8s %9s %9s %7s %9s %9s %8s" % (
            "net", "pipe", "steps", "local_ms", "local_sps", "hosts_ms", "hosts_sps", "overhead",
            "cpu_local", "cpu_hosts", "cpu_x", "MB/step", "relay_cpu", "late_us"))
        for (delay, pipe, steps), rows in results.items():
            med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
            ratio = statistics.median(row["hosts"] / row["local"] for row in rows)
            cpu_x = statistics.median(row["cpu_hosts"] / max(row["cpu_local"], 1e-9)
                                      for row in rows)
            print("%-10s %4s %5d %9.2f %9s %9.2f %9s %7.2fx %9.2f %9.2f %6.2fx %9.3f %9.2f "
                  "%8.0f" % (
                "direct" if delay is None else "%gus" % delay, pipe, steps, med["local"] * 1e3,
                format(int(args.batch / med["local"]), ","), med["hosts"] * 1e3,
                format(int(args.batch / med["hosts"]), ","), ratio, med["cpu_local"] * 1e3,
                med["cpu_hosts"] * 1e3, cpu_x, med["bytes"] / 1e6, med["relay_cpu"] * 1e3,
                med["late_us"]))
        if pss_rows:
            print("\nParameterServerStrategy (pss_side.py, %d parameter server(s) on cores %s, "
                  "coordinator and worker on cores %s), medians over %d rounds"
                  % (args.hosts, args.host_cpus, args.worker_cpus, args.rounds))
            print("%-10s %5s %9s %9s %9s %s" % ("net", "steps", "pss_ms", "pss_sps", "cpu_pss",
                                               " ".join("pss/hosts_%s" % m for m in args.pipeline)))
            for delay, rows in pss_rows.items():
                for steps in args.steps_per_call:
                    ms = statistics.median(row[0][steps] for row in rows)
                    cpu = statistics.median(row[1][steps] for row in rows)
                    ratios = []
                    for pipe in args.pipeline:
                        ours = [row["hosts"] for row in results.get((delay, pipe, steps), [])]
                        ratios.append("%14.2fx" % (ms / statistics.median(ours)) if ours else "-")
                    print("%-10s %5d %9.2f %9s %9.2f %s" % (
                        "direct" if delay is None else "%gus" % delay, steps, ms * 1e3,
                        format(int(args.batch / ms), ","), cpu * 1e3, " ".join(ratios)))
            print("(pss/hosts: PSS step time / ours, > 1: ours faster; cpu_pss: CPU ms per step "
                  "of the coordinator, the worker and the parameter servers)")
        print("(ms: step time; sps: samples/s; cpu_*: CPU ms per step over the side's "
              "processes; MB/step: both directions%s; relay_cpu: the relay's CPU ms per step; "
              "late_us: how much later than the set delay the relay delivered, on average)"
              % (", through the relay" if relay else ", routed payload"))
        return 1 if failed else 0
    finally:
        try:
            hosts.disconnect() if "hosts" in locals() else None
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if relay is not None:
                relay.close()


if __name__ == "__main__":
    sys.exit(main())
