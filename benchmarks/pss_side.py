#!/usr/bin/env python3
"""The ParameterServerStrategy side of bench_cluster.py: TensorFlow's stock
alternative to embedding hosts, on the same loopback machine.

This process is the coordinator (job "chief"); it starts one worker and S
parameter servers (``python -m tf_tpu_emb.server --job worker|ps``: plain
``tf.distribute.Server`` tasks, on 127.0.0.1 free ports, each ending with
this process).  Under ``ParameterServerStrategy`` with a
``FixedShardsPartitioner(S)`` every table of bench_cluster's workload (same
flags, same seed: same tables, ids and activation gradients) and its Adagrad
accumulator are split into S shards, one per parameter server.  One step,
scheduled on the worker by ``ClusterCoordinator.schedule``, is
``tf.nn.embedding_lookup_sparse`` (combiner mean) per table, the loss
``sum_t reduce_sum(act_t * c_t)``, its gradient w.r.t. the table shards
(IndexedSlices of the distinct ids), and ``ResourceSparseApplyAdagradV2`` on
each shard (on its parameter server): exact sparse Adagrad, epsilon 0 (as
the engine's Adagrad).  The ids come from a per-worker dataset (the
workload's batch, repeated) as ``tf.SparseTensor``s.

``--steps-per-call 1,10``: steps per scheduled function.  Timing: per block,
``--steps`` calls are scheduled and joined; seconds per step = block time /
(calls x steps per call); the median over ``--blocks`` blocks.  Prints one
JSON line: {"steps_per_call": {"1": seconds per step, ...},
"activations": the first step's f0 activations (a list, to check against
ours), "cpu_per_step": {"1": CPU seconds per step of this process, the worker
and the parameter servers}}.  ``--worker-cpus`` / ``--ps-cpus`` pin this
process and the worker / the parameter servers (bench_pinned.py --pss).

    python benchmarks/pss_side.py --hosts 2 --steps-per-call 1,10
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cluster as bc  # noqa: E402
from bench_pinned import cpu_list, cpu_seconds  # noqa: E402

from tf_tpu_emb.cluster.local import free_ports  # noqa: E402
from tf_tpu_emb.server import READY_PREFIX  # noqa: E402

LR, INITIAL_ACCUMULATOR = 0.05, 0.1  # bench_cluster's Adagrad(learning_rate=0.05)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in bc.DEFAULTS.items():
        if k != "hosts":
            p.add_argument("--" + k, type=type(v))
    p.add_argument("--hosts", type=int, required=True, help="parameter servers (S)")
    p.add_argument("--steps-per-call", default="1,10")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--worker-cpus", help="cores of this process and the worker task "
                   "(taskset; bench_pinned.py's protocol); default: not pinned")
    p.add_argument("--ps-cpus", help="cores of the parameter servers (taskset)")
    p.add_argument("--relay", help="DELAY_US,RATE_GBIT,CPUS: every connection between the "
                   "tasks through benchmarks/netsim_relay.py (bench_pinned.py --net relay)")
    args = p.parse_args(argv)
    for k, v in (bc.QUICK if args.quick else bc.DEFAULTS).items():
        if k != "hosts" and getattr(args, k) is None:
            setattr(args, k, v)
    args.steps_per_call = [int(s) for s in args.steps_per_call.split(",") if s]
    return args


def start_tasks(cluster, cpus=None):
    """The worker and parameter-server processes; returns them once ready.
    `cpus`: {job: a taskset core list} for the jobs to pin."""
    procs = []
    for job in ("worker", "ps"):
        pin = ["taskset", "-c", cpus[job]] if cpus and cpus.get(job) else []
        for task in range(len(cluster[job])):
            procs.append(subprocess.Popen(
                pin + [sys.executable, "-m", "tf_tpu_emb.server", "--cluster", json.dumps(cluster),
                 "--job", job, "--task", str(task), "--lifetime-seconds", "3600",
                 "--exit-with-parent"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
    for proc in procs:
        for line in proc.stdout:
            if line.startswith(READY_PREFIX):
                break
        else:
            raise RuntimeError("a PSS task exited before it was ready")
    return procs


def build(args, strategy, tables):
    """The sharded tables and accumulators (S shards each)."""
    with strategy.scope():
        params = [tf.Variable(t, name="t%d" % i) for i, t in enumerate(tables)]
        accums = [tf.Variable(tf.fill(t.shape, INITIAL_ACCUMULATOR), name="a%d" % i)
                  for i, t in enumerate(tables)]
    return params, accums


def shards(v):
    """The shards of a table (a ShardedVariable; one plain variable for S = 1)."""
    return list(getattr(v, "variables", [v]))


def make_step(args, params, accums, cot, steps):
    lr = tf.constant(LR)
    eps = tf.constant(0.0)

    def one_step(features):
        per_table = [shards(p) for p in params]
        with tf.GradientTape() as tape:
            loss, acts = 0.0, []
            for t, p in enumerate(params):
                acts.append(tf.nn.embedding_lookup_sparse(p, features["f%d" % t], None,
                                                          combiner="mean"))
                loss += tf.reduce_sum(acts[-1] * cot[t])
        grads = tape.gradient(loss, per_table)
        for t, table_grads in enumerate(grads):
            for var, accum, g in zip(per_table[t], shards(accums[t]), table_grads):
                if g is None:
                    continue
                tf.raw_ops.ResourceSparseApplyAdagradV2(
                    var=var.handle, accum=accum.handle, lr=lr, epsilon=eps, grad=g.values,
                    indices=g.indices)
        return acts[0]

    @tf.function
    def step(iterator):
        for _ in range(steps):
            act = one_step(next(iterator))
        return act
    return step


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker_cpus:
        os.sched_setaffinity(0, cpu_list(args.worker_cpus))
        # Pinned to one core, TF gives the worker task one inter-op thread
        # (one per core), and ClusterCoordinator's scheduled function never
        # finishes there (seen on TF 2.21: a hang); the children inherit this.
        os.environ.setdefault("TF_NUM_INTEROP_THREADS", "4")
    tables, features, cot = bc.workload(args)
    sparse = {k: v.to_sparse() for k, v in features.items()}
    cot = [cot["f%d" % t] for t in range(args.tables)]
    numbers = free_ports(2 * (args.hosts + 2))
    ports = ["127.0.0.1:%d" % p for p in numbers[:args.hosts + 2]]
    cluster = {"chief": ports[:1], "worker": ports[1:2], "ps": ports[2:]}
    procs = start_tasks(cluster, {"worker": args.worker_cpus, "ps": args.ps_cpus})
    pids = [os.getpid()] + [proc.pid for proc in procs]
    relay = None
    connect = cluster
    if args.relay:
        # As bench_pinned.py --net relay: the cluster spec this process
        # connects with (the one every task gets) names the relay's ports, so
        # every connection between the tasks, both ways, goes through it; this
        # task still binds its own port.
        from bench_pinned import Relay  # pylint: disable=import-outside-toplevel
        from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
        delay, rate, cpus = args.relay.split(",", 2)
        real, relayed = numbers[:args.hosts + 2], numbers[args.hosts + 2:]
        relay = Relay(["%d:%d" % pair for pair in zip(relayed, real)], cpus,
                      float(delay), float(rate))
        relayed = ["127.0.0.1:%d" % p for p in relayed]
        connect = {"chief": relayed[:1], "worker": relayed[1:2], "ps": relayed[2:]}
        set_server_def = context.Context.set_server_def

        def bind_chief_port(self, server_def, *a, **k):
            server_def.port = real[0]
            return set_server_def(self, server_def, *a, **k)
        context.Context.set_server_def = bind_chief_port
    try:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(connect), task_type="chief", task_id=0, rpc_layer="grpc")
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            resolver, variable_partitioner=tf.distribute.experimental.partitioners
            .FixedShardsPartitioner(args.hosts))
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        params, accums = build(args, strategy, tables)
        dataset = coordinator.create_per_worker_dataset(
            lambda: tf.data.Dataset.from_tensors(sparse).repeat())
        iterator = iter(dataset)
        out = {"steps_per_call": {}}
        for spc in args.steps_per_call:
            step = make_step(args, params, accums, cot, spc)
            first = coordinator.schedule(step, args=(iterator,))
            coordinator.join()
            if "activations" not in out:
                out["activations"] = first.fetch()[:4].tolist()
            for _ in range(args.warmup):
                coordinator.schedule(step, args=(iterator,))
            coordinator.join()
            times = []
            c0 = cpu_seconds(pids)
            for _ in range(args.blocks):
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    coordinator.schedule(step, args=(iterator,))
                coordinator.join()
                times.append((time.perf_counter() - t0) / (args.steps * spc))
            out["steps_per_call"][str(spc)] = statistics.median(times)
            out.setdefault("cpu_per_step", {})[str(spc)] = (
                (cpu_seconds(pids) - c0) / (args.blocks * args.steps * spc))
        if relay is not None:
            out["relay_late_us"] = relay.stats()["late_mean_us"]
            out["relay_bytes"] = relay.moved()  # > 0: the tasks' traffic went through it
        print(json.dumps(out), flush=True)
    finally:
        if relay is not None:
            relay.close()
        for proc in procs:
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
