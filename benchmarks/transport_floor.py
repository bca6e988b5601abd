#!/usr/bin/env python3
"""What moving one host step's three tensors costs: TensorFlow's runtime
against a bare TCP socket, pinned as bench_pinned.py pins (issue 31).

A host's step on the cluster moves three tensors: the routed batch (worker
-> host), the host's activations (host -> worker, after its lookup) and the
gradients (worker -> host).  bench_pinned.py measures the whole step; this
script measures the crossings alone, with the step's dependency pattern and
no engine, so that the figures say what a transport of our own (issue 31's
next step) could take off the step and the CPU:

* ``tf``: one ``tf_tpu_emb.server`` host (``taskset -c HOST_CPUS``); per step
  the worker's packed batch goes to the host device, a vector of the Recv
  output's size made there comes back, and the gradient vector (which
  depends on it) goes there (cluster_breakdown.py's "transfer": identity-like
  ops on the host device); ``steps`` steps per ``tf.function`` call;
* ``socket``: this script with ``--serve`` as the host (pinned the same way),
  TCP on 127.0.0.1 with TCP_NODELAY: the worker writes the batch's bytes,
  the host reads them into a buffer made once and writes the activations'
  bytes, the worker reads them and writes the gradients', the host reads
  them; a length word before each message, one byte back per call.

Beside them, on the worker's core, the two figures the crossings are to be
read against, ``steps`` steps a call:

* ``local``: bench_cluster.py's step on one in-process engine (what
  bench_pinned.py's overhead divides by);
* ``engine``: a host's engine work alone -- a host-shard engine of the same
  config configured in this process (``ConfigureTPUEmbeddingHostShard``,
  host 0 of 1) enqueuing the routed batch, looking it up and applying its
  gradients (cluster_breakdown.py's "kernels").

With one core per host, a host's step cannot take less than ``engine`` plus
what moving its bytes costs the host's CPU, so ``floor = (engine + socket
host_cpu) / local`` bounds the pipelined overhead from below (the worker's
route, combine and split overlap it there), and ``(engine + tf host_cpu) /
local`` is what TF's runtime leaves.

The sizes are bench_cluster.py's workload routed by the cluster's own router
(the same flags and defaults; 1 host).  The sides alternate in ``--blocks``
blocks of ``--calls`` calls per round; per side: step time (median call /
steps per call), the worker's and the host's CPU ms per step (user + system
of all their threads, /proc/PID/stat), and the bytes per step.  The local
step of bench_pinned.py (2.0-2.5 ms on the development machine) is the scale
these costs are to be read against.

    .venv/bin/python benchmarks/transport_floor.py
    .venv/bin/python benchmarks/transport_floor.py --quick    # smoke run
"""
import argparse
import importlib.util
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LEN = struct.Struct("<Q")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker-cpus", default="0")
    p.add_argument("--host-cpus", default="1")
    p.add_argument("--steps-per-call", default="1,10")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--calls", type=int, default=30, help="timed calls per block (default 30)")
    p.add_argument("--warmup", type=int, default=3)
    for k, v in dict(tables=8, vocab=100_000, dim=32, batch=1024, hot=10).items():
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="1 round, 1 block of 5 calls")
    p.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # host side
    args = p.parse_args(argv)
    if args.quick:  # bench_pinned.py's small workload
        args.tables, args.vocab, args.dim, args.batch, args.hot = 2, 1000, 8, 64, 3
        args.rounds, args.blocks, args.calls, args.warmup = 1, 1, 5, 1
    args.steps_per_call = [int(s) for s in args.steps_per_call.split(",") if s]
    return args


# --- the socket host ---------------------------------------------------------

def read_exactly(conn, view):
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise EOFError("peer closed")
        got += n


def read_message(conn, buffers):
    """One length-prefixed message into a buffer of its size (made once)."""
    head = bytearray(LEN.size)
    read_exactly(conn, memoryview(head))
    (size,) = LEN.unpack(head)
    buf = buffers.get(size)
    if buf is None:
        buf = buffers[size] = bytearray(size)
    read_exactly(conn, memoryview(buf))
    return buf


def read_word(conn):
    return LEN.unpack(read_message(conn, {}))[0]


def write_message(conn, payload):
    conn.sendall(LEN.pack(len(payload)))
    conn.sendall(payload)


def serve(port):
    """The socket side's host: per step read the batch, write `acts` bytes
    (told once at connect), read the gradients; per call the payload bytes
    it read, back (the worker checks them)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1)
    print("transport_floor host ready", flush=True)
    listener.settimeout(120)
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffers = {}
    acts = bytes(read_word(conn))
    try:
        while True:
            steps, got = read_word(conn), 0
            for _ in range(steps):
                got += len(read_message(conn, buffers))  # the batch
                write_message(conn, acts)                # the activations
                got += len(read_message(conn, buffers))  # the gradients
            write_message(conn, LEN.pack(got))
    except EOFError:
        return


class SocketSide:
    def __init__(self, args, batch_bytes, acts_bytes, grads_bytes, port):
        self.proc = subprocess.Popen(
            ["taskset", "-c", args.host_cpus, sys.executable, os.path.abspath(__file__),
             "--serve", str(port)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "ready" not in line:
            raise RuntimeError("the socket host did not start: %r" % line)
        self.conn = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.batch, self.grads = bytes(batch_bytes), bytes(grads_bytes)
        self.acts = bytearray(acts_bytes)
        self.buffers = {}
        write_message(self.conn, LEN.pack(acts_bytes))

    def call(self, steps):
        write_message(self.conn, LEN.pack(steps))
        for _ in range(steps):
            write_message(self.conn, self.batch)
            if len(read_message(self.conn, self.buffers)) != len(self.acts):
                raise RuntimeError("MISMATCH: the activations' size")
            write_message(self.conn, self.grads)
        got = read_word(self.conn)
        if got != steps * (len(self.batch) + len(self.grads)):
            raise RuntimeError("MISMATCH: the host read %d bytes in %d steps" % (got, steps))

    def close(self):
        self.conn.close()
        self.proc.wait(30)


# --- the worker --------------------------------------------------------------

def engine_call(tf, ops, breakdown, emb, features, cot, steps):
    """`steps` steps of a host's engine work in this process (host 0 of 1,
    the routed batch and gradients of `emb`'s router); returns (call, close)."""
    router = breakdown.side_router(emb)
    sharded = emb._backend  # pylint: disable=protected-access
    name = "transport_floor_engine_%d" % steps
    ops.configure_tpu_embedding_host_shard(sharded.config, 0, engine=name)
    indices, values, weights = breakdown.inputs(features)
    batches, _, _ = router.route(indices, values, weights, "train", 0)
    ops.enqueue_tpu_embedding_routed_batch(batches[0], engine=name)
    acts = router.combine([ops.recv_tpu_embedding_routed_activations(engine=name)], 0)
    grads = router.split([cot[f] for f in features], [], 0)[0]
    ops.send_tpu_embedding_routed_gradients(grads, engine=name)
    del acts

    @tf.function
    def call():
        part = None
        for _ in range(steps):
            ops.enqueue_tpu_embedding_routed_batch(batches[0], engine=name)
            part = ops.recv_tpu_embedding_routed_activations(engine=name)
            with tf.control_dependencies([part]):
                ops.send_tpu_embedding_routed_gradients(grads, engine=name)
        return part[:1]

    def close():
        ops.shutdown_tpu_embedding(engine=name)
        router.shutdown()
    return (lambda: call().numpy()), close


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.serve is not None:
        return serve(args.serve)
    pinned = load("bench_pinned")
    os.sched_setaffinity(0, pinned.cpu_list(args.worker_cpus))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    bench = load("bench_cluster")
    breakdown = load("cluster_breakdown")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb import ops  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb.cluster import EmbeddingHosts  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb.cluster import local as local_hosts  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb.cluster import routing  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb.features import Feature  # pylint: disable=import-outside-toplevel

    args.form = "auto"
    tables, features, cot = bench.workload(args)
    local = bench.make_embedding(args, tables)
    config = local._config  # pylint: disable=protected-access
    proto = bench.tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration.FromString(config)
    proto.num_hosts = 1
    router = routing.Router(proto.SerializeToString(),
                            [Feature(name, [], 1, "mean") for name in features],
                            1, form="auto")
    batches, floats, _ = router.route([f.row_splits for f in features.values()],
                                      [f.values for f in features.values()],
                                      [tf.zeros([0], tf.float32)] * len(features), "train", 0)
    router.shutdown()
    batch = batches[0]
    n_floats = int(floats[0]) + 2  # TF's output and gradient vectors carry the sequence too
    batch_bytes, vec_bytes = int(tf.size(batch)) * batch.dtype.size, n_floats * 4
    step_bytes = batch_bytes + 2 * vec_bytes

    host_port, worker_port, socket_port = local_hosts.free_ports(3)
    print("transport_floor: batch %d B, activations %d B, gradients %d B (%.3f MB/step); host "
          "on cores %s, worker on cores %s; steps per call %s; %d rounds of %d blocks of %d "
          "calls (TensorFlow %s, load %s)"
          % (batch_bytes, vec_bytes, vec_bytes, step_bytes / 1e6, args.host_cpus,
             args.worker_cpus, ",".join(map(str, args.steps_per_call)), args.rounds, args.blocks,
             args.calls, tf.__version__, " ".join("%.2f" % x for x in os.getloadavg())),
          flush=True)
    host = subprocess.Popen(
        ["taskset", "-c", args.host_cpus, sys.executable, "-m", "tf_tpu_emb.server",
         "--cluster", json.dumps({"embedding": ["127.0.0.1:%d" % host_port]}), "--task", "0",
         "--replicas", "1", "--lifetime-seconds", "3600", "--exit-with-parent"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sock, clustered, closers = None, None, [local.shutdown]
    try:
        local_hosts.LocalHosts._wait_ready(  # pylint: disable=protected-access
            host, 0, time.monotonic() + local_hosts.START_TIMEOUT_S)
        hosts = EmbeddingHosts({"embedding": ["127.0.0.1:%d" % host_port]},
                               client_address="127.0.0.1:%d" % worker_port)
        hosts.connect()
        sock = SocketSide(args, batch_bytes, vec_bytes, vec_bytes, socket_port)
        clustered = bench.make_embedding(args, tables, hosts)
        closers.append(clustered.shutdown)

        def local_call(steps):
            call = bench.make_call(local, features, cot, steps)
            return lambda: call()["f0"].numpy()

        engines = {}  # steps -> call (one host-shard engine each, made once)

        def engine(steps):
            if steps not in engines:
                engines[steps], close = engine_call(tf, ops, breakdown, clustered, features,
                                                    cot, steps)
                closers.append(close)
            return engines[steps]
        grads = tf.zeros([n_floats], tf.float32) + 1.0

        def tf_call(steps):
            @tf.function
            def move(batch, grads):
                out = tf.constant(0.0)
                for _ in range(steps):
                    with tf.device(hosts.device(0)):
                        got = tf.cast(tf.reduce_sum(tf.cast(batch[:8], tf.int32)), tf.float32)
                        acts = tf.fill([n_floats], got + out)  # made there, moved back
                    sent = grads + acts[0] * 0.0  # the gradients depend on the activations
                    with tf.device(hosts.device(0)):
                        out = tf.reduce_sum(sent[:1])
                return out
            return lambda: move(batch, grads).numpy()

        sides = {"tf": ([os.getpid(), host.pid], tf_call),
                 "socket": ([os.getpid(), sock.proc.pid], lambda s: lambda: sock.call(s)),
                 "local": ([os.getpid(), host.pid], local_call),
                 "engine": ([os.getpid(), host.pid], engine)}
        rows = {}
        for r in range(args.rounds):
            for steps in args.steps_per_call:
                calls = {name: make(steps) for name, (_, make) in sides.items()}
                for call in calls.values():
                    for _ in range(args.warmup):
                        call()
                times = {s: [] for s in calls}
                cpu = {s: [0.0, 0.0] for s in calls}
                for _ in range(args.blocks):
                    for side, call in calls.items():
                        worker_pid, host_pid = sides[side][0]
                        w0, h0 = pinned.cpu_seconds([worker_pid]), pinned.cpu_seconds([host_pid])
                        for _ in range(args.calls):
                            t0 = time.perf_counter()
                            call()
                            times[side].append((time.perf_counter() - t0) / steps)
                        cpu[side][0] += pinned.cpu_seconds([worker_pid]) - w0
                        cpu[side][1] += pinned.cpu_seconds([host_pid]) - h0
                n = args.blocks * args.calls * steps
                for side in calls:
                    row = dict(step=statistics.median(times[side]), worker=cpu[side][0] / n,
                               host=cpu[side][1] / n)
                    rows.setdefault((side, steps), []).append(row)
                print("round %d, %d/call: %s" % (r, steps, "; ".join(
                    "%s %.3f ms (worker %.2f, host %.2f cpu-ms)"
                    % (s, rows[(s, steps)][-1]["step"] * 1e3, rows[(s, steps)][-1]["worker"] * 1e3,
                       rows[(s, steps)][-1]["host"] * 1e3) for s in calls)), flush=True)
        print("\nmedians over rounds, per step (%.3f MB moved)" % (step_bytes / 1e6))
        print("%-8s %5s %9s %11s %9s %9s %7s" % ("side", "steps", "step_ms", "worker_cpu",
                                                 "host_cpu", "total_cpu", "GB/s"))
        for (side, steps), rs in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            med = {k: statistics.median(r[k] for r in rs) for k in ("step", "worker", "host")}
            print("%-8s %5d %9.3f %11.3f %9.3f %9.3f %7s"
                  % (side, steps, med["step"] * 1e3, med["worker"] * 1e3, med["host"] * 1e3,
                     (med["worker"] + med["host"]) * 1e3,
                     "%.2f" % (step_bytes / med["step"] / 1e9) if side in ("tf", "socket")
                     else "-"))
        print("cpu columns: ms per step of the worker (this process) and the host process, "
              "all threads, user + system (local and engine run in this process)")
        print("\nwhat bounds a one-core host's step, over the local step (same steps a call)")
        for steps in args.steps_per_call:
            med = {side: statistics.median(r[k] for r in rows[(side, steps)])
                   for side, k in (("local", "step"), ("engine", "step"),
                                   ("socket", "host"), ("tf", "host"))}
            print("%2d/call: engine %.3f ms = %.2fx local %.3f ms; floor (engine + socket host "
                  "cpu %.3f) %.2fx; with TF's crossing (host cpu %.3f) %.2fx"
                  % (steps, med["engine"] * 1e3, med["engine"] / med["local"],
                     med["local"] * 1e3, med["socket"] * 1e3,
                     (med["engine"] + med["socket"]) / med["local"], med["tf"] * 1e3,
                     (med["engine"] + med["tf"]) / med["local"]))
    finally:
        for close in reversed(closers):
            close()
        if sock is not None:
            sock.close()
        if host.poll() is None:
            host.kill()
            host.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
