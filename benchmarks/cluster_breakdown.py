#!/usr/bin/env python3
"""Where the time of one training step on S embedding hosts goes.

The workload is ``bench_cluster.py``'s (same flags and defaults).  For each S
of ``--hosts`` (loopback hosts this script starts, ``LocalHosts``), in
``--rounds`` interleaved rounds, it times:

  local      the in-process step (one engine in this process), the reference;
  step       the mid-level step on the S hosts (enqueue -> dequeue ->
             apply_gradients in one tf.function), with the CPU seconds the
             worker (this process) and the hosts (sum over the host
             processes, /proc/<pid>/stat) spend per step;
  step_inline the same with the hosts' updates inside their Send (not in the
             background while the worker routes the next batch);
  step10     ten steps per call (bench_cluster's steps-per-call step);
  worker_ops the worker's ops of one step alone (route, combine, split; the
             hosts' parts replaced by zeros of the right size);
  kernels    the host kernels alone: S host-shard engines configured in this
             process (ConfigureTPUEmbeddingHostShard) run enqueue -> Recv ->
             Send on their part of one routed batch; the slowest host (the
             hosts run in parallel) and the sum over hosts (their CPU);
  transfer   the same tensors moved with the step's dependency pattern but no
             engine: each host's packed batch there and a vector of its Recv
             output's size back, then its gradient vector there (identity
             ops on the host devices);
  rtt        one scalar to every host and back (the fixed cost of a
             cross-task phase);
  mb_to/from the bytes per step per host (mean over hosts).

The numbers of the design before the routing op (issue 22: stock-op routing,
the whole activation gradient to every host) are in benchmarks/RESULTS.md;
this script measured them at the commit that added it.  ``--form`` routes
every table in one form ("bags", "rows") or with the host filter (every host
gets the whole batch), to compare the designs.

Medians over the rounds; each round's figure is the median of --steps calls.

    .venv/bin/python benchmarks/cluster_breakdown.py --rounds 3
"""
import argparse
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cluster as bc  # noqa: E402

from tf_tpu_emb import ops  # noqa: E402
from tf_tpu_emb.cluster import routing  # noqa: E402
from tf_tpu_emb.cluster import local as local_hosts  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in bc.DEFAULTS.items():
        p.add_argument("--" + k, type=type(v))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--form", default="auto", choices=routing.Router.FORMS,
                   help="how the worker routes (default auto; host_filter: the alternative "
                        "design, every host gets the whole batch)")
    args = p.parse_args(argv)
    for k, v in (bc.QUICK if args.quick else bc.DEFAULTS).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.hosts = [int(s) for s in str(args.hosts).split(",") if s]
    return args


def timed(fn, args):
    """Median seconds of --steps calls of fn (after --warmup)."""
    for _ in range(args.warmup):
        fn()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def proc_cpu(pids):
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def self_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure_step(args, emb, features, cot, host_pids, steps_per_call=1):
    """(median seconds per step, worker CPU s/step, hosts' CPU s/step)."""
    step = bc.make_call(emb, features, cot, steps_per_call)
    for _ in range(args.warmup):
        step()["f0"].numpy()
    times = []
    w0, h0 = self_cpu(), proc_cpu(host_pids)
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()["f0"].numpy()
        times.append(time.perf_counter() - t0)
    worker = (self_cpu() - w0) / args.steps / steps_per_call
    hosts = (proc_cpu(host_pids) - h0) / args.steps / steps_per_call
    return statistics.median(times) / steps_per_call, worker, hosts


def inputs(features):
    """The mid-level enqueue's ArbitraryTensorBatch inputs (ragged features)."""
    return ([tf.cast(f.row_splits, tf.int32) for f in features.values()],
            [f.values for f in features.values()],
            [tf.zeros([0], tf.float32)] * len(features))


def side_router(emb):
    """A router of `emb`'s config and form, apart from the one its steps use."""
    sharded = emb._backend  # pylint: disable=protected-access
    return routing.Router(sharded.config, sharded.router.features, sharded.num_hosts,
                          form=sharded.router.form)


def answers(host_floats, sequence, num_hosts):
    """Stand-ins for the hosts' Recv outputs of a routed batch: zeros of the
    right size carrying its sequence."""
    bits = tf.reshape(tf.bitcast(tf.reshape(sequence, [1]), tf.float32), [2])
    return [tf.concat([tf.zeros([host_floats[k]]), bits], 0) for k in range(num_hosts)]


def measure_worker_ops(args, emb, features, cot, calls=10):
    """The worker's ops of one step (route, combine, split) without hosts:
    the combine answers itself with stand-ins (zeros) of the hosts' parts."""
    router = side_router(emb)
    indices, values, weights = inputs(features)
    grads = list(cot.values())

    @tf.function
    def worker():
        out = []
        for _ in range(calls):
            _, floats, sequence = router.route(indices, values, weights, "train", 0)
            acts = router.combine(answers(floats, sequence, router.num_hosts), 0)
            with tf.control_dependencies(acts):
                out += router.split(grads, [], 0)
        return tf.add_n([tf.reduce_sum(o[:1]) for o in out])

    try:
        return timed(lambda: worker().numpy(), args) / calls
    finally:
        router.shutdown()


def measure_in_process(args, emb, features, cot, num_hosts):
    """The hosts' kernels without a network: S host-shard engines configured
    in this process (ConfigureTPUEmbeddingHostShard), each running enqueue ->
    Recv -> Send on its part of one routed batch.  Returns (slowest host,
    sum over hosts) in seconds and the packed tensors of one step (for the
    transfer)."""
    sharded = emb._backend  # pylint: disable=protected-access
    config, router = sharded.config, side_router(emb)
    names = ["breakdown_h%d" % k for k in range(num_hosts)]
    indices, values, weights = inputs(features)
    grads = list(cot.values())
    for k, name in enumerate(names):
        ops.configure_tpu_embedding_host_shard(config, k, engine=name)
    try:
        def full_step():
            batches, _, _ = router.route(indices, values, weights, "train", 0)
            parts = []
            for k, name in enumerate(names):
                ops.enqueue_tpu_embedding_routed_batch(batches[k], engine=name)
                parts.append(ops.recv_tpu_embedding_routed_activations(engine=name))
            acts = router.combine(parts, 0)
            host_grads = router.split(grads, [], 0)
            for k, name in enumerate(names):
                ops.send_tpu_embedding_routed_gradients(host_grads[k], engine=name)
            return batches, parts, host_grads, acts[0]
        batches, parts, host_grads, _ = full_step()
        per_host = []
        for k, name in enumerate(names):
            @tf.function
            def host(k=k, name=name):
                ops.enqueue_tpu_embedding_routed_batch(batches[k], engine=name)
                part = ops.recv_tpu_embedding_routed_activations(engine=name)
                with tf.control_dependencies([part]):
                    ops.send_tpu_embedding_routed_gradients(host_grads[k], engine=name)
                return part
            per_host.append(timed(lambda: host().numpy(), args))
    finally:
        for name in names:
            ops.shutdown_tpu_embedding(engine=name)
        router.shutdown()
    return max(per_host), sum(per_host), (batches, parts, host_grads)


def measure_transfer(args, emb, packed, num_hosts):
    """The step's tensors moved with its dependency pattern, no engine: each
    host's packed batch there and a vector of its Recv output's size back,
    then its gradient vector there (identity ops on the hosts)."""
    hosts = emb._backend.hosts  # pylint: disable=protected-access
    batches, parts, host_grads = packed
    sizes = [int(tf.size(p)) for p in parts]

    @tf.function
    def move(batches, host_grads):
        back = []
        for k in range(num_hosts):
            with tf.device(hosts.device(k)):
                got = tf.cast(tf.reduce_sum(tf.cast(batches[k][:8], tf.int32)), tf.float32)
                back.append(tf.fill([sizes[k]], got))  # made there, moved back
        dep = tf.add_n([b[0] for b in back]) * 0.0
        done = []
        for k in range(num_hosts):
            sent = host_grads[k] + dep  # the gradients depend on the activations
            with tf.device(hosts.device(k)):
                done.append(tf.reduce_sum(sent[:1]))
        return tf.add_n(done)

    # The tensors are made on the worker, so that moving them is measured.
    return timed(lambda: move(batches, host_grads).numpy(), args)


def measure_rtt(args, emb, num_hosts):
    hosts = emb._backend.hosts  # pylint: disable=protected-access

    @tf.function
    def ping(x):
        out = []
        for k in range(num_hosts):
            with tf.device(hosts.device(k)):
                out.append(x + 1.0)
        return tf.add_n(out)

    x = tf.constant(1.0)
    return timed(lambda: ping(x).numpy(), args)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    tables, features, cot = bc.workload(args)
    print("cluster_breakdown: %d tables x %s rows x dim %d, batch %d, %d ids a sample; "
          "median of %d calls a round, %d rounds (TensorFlow %s, %d CPUs, load %s)"
          % (args.tables, format(args.vocab, ","), args.dim, args.batch, args.hot, args.steps,
             args.rounds, tf.__version__, os.cpu_count(),
             " ".join("%.2f" % x for x in os.getloadavg())))
    rows = {s: [] for s in args.hosts}
    for r in range(args.rounds):
        for s in args.hosts:
            with local_hosts.LocalHosts(s) as cluster:
                cluster.hosts.connect()
                pids = [p.pid for p in cluster.procs]
                local = bc.make_embedding(args, tables)
                try:
                    local_s = measure_step(args, local, features, cot, [])[0]
                finally:
                    local.shutdown()
                emb = bc.make_embedding(args, tables, cluster.hosts)
                emb._backend.router.form = args.form  # pylint: disable=protected-access
                try:
                    sharded = emb._backend  # pylint: disable=protected-access
                    sharded.background_updates = False
                    inline_s = measure_step(args, emb, features, cot, pids)[0]
                    sharded.background_updates = True
                    step_s, worker_cpu, host_cpu = measure_step(args, emb, features, cot, pids)
                    step10_s = measure_step(args, emb, features, cot, pids, 10)[0]
                    worker_ops = measure_worker_ops(args, emb, features, cot)
                    kern_max, kern_sum, packed = measure_in_process(args, emb, features, cot, s)
                    rtt_s = measure_rtt(args, emb, s)
                    transfer_s = measure_transfer(args, emb, packed, s)
                    moved = routing.bytes_per_host(packed[0], [int(tf.size(p)) - 2
                                                               for p in packed[1]])
                finally:
                    emb.shutdown()
            row = dict(local=local_s, step=step_s, step_inline=inline_s, step10=step10_s,
                       worker_cpu=worker_cpu, host_cpu=host_cpu,
                       worker_ops=worker_ops, kernels_max=kern_max,
                       kernels_sum=kern_sum, transfer=transfer_s, rtt=rtt_s,
                       mb_to=np.mean([m[0] for m in moved]) / 1e6,
                       mb_from=np.mean([m[1] for m in moved]) / 1e6)
            rows[s].append(row)
            print("round %d, %d host(s): %s" % (r, s, "  ".join(
                "%s %.3f MB" % (k, v) if k.startswith("mb") else "%s %.2f ms" % (k, v * 1e3)
                for k, v in row.items())), flush=True)
    keys = ["local", "step", "step_inline", "step10", "worker_cpu", "host_cpu", "worker_ops",
            "kernels_max",
            "kernels_sum", "transfer", "rtt", "mb_to", "mb_from"]
    print("\nmedians over %d rounds (ms per step; mb_to / mb_from: MB per step per host, "
          "mean over hosts)" % args.rounds)
    print("%-8s " % "hosts" + " ".join("%11s" % k for k in keys) + " %9s" % "step/local")
    for s in args.hosts:
        med = {k: statistics.median(row[k] for row in rows[s]) for k in keys}
        print("%-8d " % s + " ".join("%11.3f" % med[k] if k.startswith("mb") else
                                     "%11.2f" % (med[k] * 1e3) for k in keys)
              + " %8.2fx" % (med["step"] / med["local"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
