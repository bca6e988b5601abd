#!/usr/bin/env python3
"""Cluster benchmark: the training step on S embedding hosts vs one in-process
engine, and vs TensorFlow's ParameterServerStrategy on S parameter servers.

One step is the mid-level API's step: ``enqueue(training=True)`` ->
``dequeue`` -> ``apply_gradients(c)`` for a fixed random activation gradient c
(Adagrad, combiner mean, ragged multi-hot bags with Zipf ids).  A call runs
``--steps-per-call`` steps in one ``tf.function`` (as TPU programs run
``steps_per_execution``); the enqueue of step k+1 comes after step k's
``apply_gradients`` in program order, but depends on nothing of it, so the
worker routes step k+1 while the hosts apply step k (TPU programs pipeline
the next enqueue with the current step likewise; every lookup still follows
the previous update).  Sides:

  local   ``tf_tpu_emb.TPUEmbedding`` with one engine in this process;
  S hosts the same object with ``cluster=`` S embedding hosts
          (``python -m tf_tpu_emb.server`` processes on 127.0.0.1,
          ``tf_tpu_emb.cluster.local.LocalHosts``; DIV_DEFAULT sharding);
          with ``--cluster`` the hosts already running at those addresses;
  PSS     (``--pss``) ``benchmarks/pss_side.py`` in a child process: the same
          tables partitioned over S parameter servers, embedding_lookup_sparse,
          sparse Adagrad, 1 and 10 steps per scheduled call.

Interleaving: ``--rounds`` rounds; in each, for each S, the local and the S
host sides alternate in ``--blocks`` blocks of ``--steps`` calls (same
process, same batch), then the PSS side runs for that S.  Per side and round:
seconds per step = median call time / steps per call; the table gives the
medians over the rounds of samples/s and of the per-round ratios (overhead
= S hosts / local of the same round; ours/PSS = PSS's step time / ours').

Every side starts from the same tables; the first step's activations of each
side must equal the local side's (rtol 1e-5: a bag split over hosts may be
summed in another order), else it exits with status 1.

Bytes per step per host are the sizes of what the worker sends each host
(its packed batch, its gradient vector) and what each host returns (its
part of the activations), from the worker's router on the first batch
(``tf_tpu_emb.cluster.routing``); the mean over hosts and the largest host.

    .venv/bin/python benchmarks/bench_cluster.py --quick
    .venv/bin/python benchmarks/bench_cluster.py --pss              # 1, 2 and 4 hosts
    .venv/bin/python benchmarks/bench_cluster.py --batch 8192 --pss
    .venv/bin/python benchmarks/bench_cluster.py --cluster a:2222,b:2222 \\
        --client-address trainer:2300                             # real machines
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2  # noqa: E402

import tf_tpu_emb  # noqa: E402
from tf_tpu_emb.cluster import EmbeddingHosts, routing  # noqa: E402
from tf_tpu_emb.features import Feature  # noqa: E402
from tf_tpu_emb.cluster import local as local_hosts  # noqa: E402

E = tf.tpu.experimental.embedding
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULTS = dict(tables=8, vocab=100_000, dim=32, batch=1024, hot=10, steps=30, hosts="1,2,4")
QUICK = dict(tables=2, vocab=1_000, dim=8, batch=64, hot=3, steps=5, hosts="1,2")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in DEFAULTS.items():
        p.add_argument("--" + k, type=type(v), help="default %s (--quick: %s)" % (v, QUICK[k]))
    p.add_argument("--steps-per-call", default="1,10",
                   help="steps per tf.function call, a comma list (default 1,10)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--blocks", type=int, default=3,
                   help="alternating local / hosts blocks per round (default 3)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per side (default 3)")
    p.add_argument("--pss", action="store_true",
                   help="also run TensorFlow's ParameterServerStrategy on S parameter servers")
    p.add_argument("--form", default="auto", choices=routing.Router.FORMS,
                   help="how the worker routes (default auto)")
    p.add_argument("--cluster", help="HOST:PORT,... of embedding hosts already running "
                   "(`python -m tf_tpu_emb.server`); replaces --hosts")
    p.add_argument("--client-address", help="HOST:PORT at which the hosts reach this process "
                   "(with --cluster on other machines)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="tiny smoke run")
    args = p.parse_args(argv)
    for k, v in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.hosts = [int(s) for s in str(args.hosts).split(",") if s]
    args.steps_per_call = [int(s) for s in str(args.steps_per_call).split(",") if s]
    if min([args.tables, args.vocab, args.dim, args.batch, args.hot, args.steps, args.rounds,
            args.blocks] + args.hosts + args.steps_per_call) < 1:
        p.error("sizes, --steps, --rounds, --blocks, --hosts and --steps-per-call must be >= 1")
    return args


def workload(args):
    """(initial tables, ragged features, activation gradients), the same for every side."""
    rng = np.random.default_rng(args.seed)
    tables = [rng.standard_normal((args.vocab, args.dim)).astype(np.float32) * 0.1
              for _ in range(args.tables)]
    features, cot = {}, {}
    for t in range(args.tables):
        ranks = np.minimum(rng.zipf(1.05, args.batch * args.hot) - 1, args.vocab - 1)
        ids = rng.permutation(args.vocab)[ranks].astype(np.int64)
        features["f%d" % t] = tf.RaggedTensor.from_row_splits(
            ids, np.arange(args.batch + 1, dtype=np.int64) * args.hot)
        cot["f%d" % t] = tf.constant(rng.standard_normal((args.batch, args.dim)), tf.float32)
    return tables, features, cot


def make_embedding(args, tables, cluster=None, pipelined=False):
    """The benchmark's TPUEmbedding (on `cluster`, else in process);
    `pipelined`: pipeline_execution_with_tensor_core (engine/engine.h)."""
    config = {}
    for t, init in enumerate(tables):
        table = E.TableConfig(vocabulary_size=args.vocab, dim=args.dim, name="t%d" % t,
                              combiner="mean", initializer=tf.constant_initializer(init))
        config["f%d" % t] = E.FeatureConfig(table, name="f%d" % t)
    emb = tf_tpu_emb.TPUEmbedding(config, E.Adagrad(learning_rate=0.05), pipelined,
                                  cluster=cluster)
    emb.build(per_replica_batch_size=args.batch)
    if cluster is not None:
        emb._backend.router.form = args.form  # pylint: disable=protected-access
    return emb


def more_batches(args, count):
    """`count` further batches of the workload's stream: the same hot rows
    (each table's permutation of `workload`, whose draws are replayed), other
    Zipf draws."""
    rng = np.random.default_rng(args.seed)
    for _ in range(args.tables):
        rng.standard_normal((args.vocab, args.dim))
    perms = []
    for _ in range(args.tables):
        rng.zipf(1.05, args.batch * args.hot)
        perms.append(rng.permutation(args.vocab))
        rng.standard_normal((args.batch, args.dim))
    out = []
    for b in range(count):
        draws = np.random.default_rng([args.seed, 1 + b])
        features = {}
        for t in range(args.tables):
            ranks = np.minimum(draws.zipf(1.05, args.batch * args.hot) - 1, args.vocab - 1)
            features["f%d" % t] = tf.RaggedTensor.from_row_splits(
                perms[t][ranks].astype(np.int64),
                np.arange(args.batch + 1, dtype=np.int64) * args.hot)
        out.append(features)
    return out


def make_call(emb, features, cot, steps):
    """One call of `steps` training steps; returns the last step's activations.
    `features`: one batch, or a list of batches that step k of a call takes
    k modulo their number of."""
    batches = features if isinstance(features, list) else [features]

    @tf.function
    def call():
        emb.enqueue(batches[0], training=True)
        for k in range(steps):
            acts = emb.dequeue()
            emb.apply_gradients(cot)
            if k + 1 < steps:  # routed by the worker while the hosts apply step k
                emb.enqueue(batches[(k + 1) % len(batches)], training=True)
        return acts
    return call


def bytes_per_host(config, features, num_hosts, form="auto"):
    """Per host: (worker -> host, host -> worker) bytes of one training step
    on `features` of a model of `config` (serialized) sharded over
    `num_hosts` hosts: the packed batch and gradients each host gets, the
    activations it returns (a router of that config routes the batch once,
    outside any step)."""
    proto = tpu_embedding_configuration_pb2.TPUEmbeddingConfiguration.FromString(config)
    proto.num_hosts = num_hosts
    router = routing.Router(proto.SerializeToString(),
                            [Feature(name, [], 1, "mean") for name in features],
                            num_hosts, form=form)
    try:
        batches, floats, _ = router.route([f.row_splits for f in features.values()],
                                          [f.values for f in features.values()],
                                          [tf.zeros([0], tf.float32)] * len(features),
                                          "train", 0)
        return routing.bytes_per_host(batches, floats)
    finally:
        router.shutdown()


def timed_blocks(args, calls):
    """{side: seconds per step (median call / steps)} with the sides' blocks
    alternating; `calls` maps a side to (call, steps per call)."""
    for call, _ in calls.values():
        for _ in range(args.warmup):
            call()["f0"].numpy()
    times = {side: [] for side in calls}
    for _ in range(args.blocks):
        for side, (call, steps) in calls.items():
            for _ in range(args.steps):
                t0 = time.perf_counter()
                call()["f0"].numpy()
                times[side].append((time.perf_counter() - t0) / steps)
    return {side: statistics.median(t) for side, t in times.items()}


def ours_round(args, tables, features, cot, hosts):
    """One round of the local and the S-host sides, interleaved: per steps
    per call {"local": s, "hosts": s}, the per-host bytes, and whether the
    first step's activations agree."""
    local = make_embedding(args, tables)
    clustered = make_embedding(args, tables, hosts)
    try:
        agree = True
        out = {}
        for steps in args.steps_per_call:
            calls = {"local": (make_call(local, features, cot, steps), steps),
                     "hosts": (make_call(clustered, features, cot, steps), steps)}
            if not out:  # the very first step of both sides: the same tables
                want = {k: v.numpy() for k, v in calls["local"][0]().items()}
                got = {k: v.numpy() for k, v in calls["hosts"][0]().items()}
                for name in want:
                    if not np.allclose(got[name], want[name], rtol=1e-5, atol=1e-6):
                        print("MISMATCH: %d hosts, feature %s differs from the local engine"
                              % (hosts.num_hosts, name), flush=True)
                        agree = False
            out[steps] = timed_blocks(args, calls)
        return out, bytes_per_host(clustered._config, features, hosts.num_hosts,  # pylint: disable=protected-access
                                   args.form), agree
    finally:
        clustered.shutdown()
        local.shutdown()


def pss_round(args, num_hosts):
    """{steps per call: seconds per step} of the PSS side (a child process)."""
    cmd = [sys.executable, os.path.join(HERE, "pss_side.py"), "--hosts", str(num_hosts),
           "--steps-per-call", ",".join(map(str, args.steps_per_call)),
           "--blocks", str(args.blocks), "--warmup", str(args.warmup), "--seed", str(args.seed)]
    for k in DEFAULTS:
        if k != "hosts":
            cmd += ["--" + k, str(getattr(args, k))]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise RuntimeError("pss_side.py failed (%s):\n%s" % (
            result.returncode, (result.stdout + result.stderr)[-3000:]))
    return {int(k): v for k, v in json.loads(lines[-1])["steps_per_call"].items()}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    tables, features, cot = workload(args)
    print("bench_cluster: %d tables x %s rows x dim %d, batch %d, %d ids a sample (Zipf), "
          "Adagrad, combiner mean; steps per call %s; %d rounds of %d alternating blocks of "
          "%d calls (TensorFlow %s, %d CPUs, load %s)"
          % (args.tables, format(args.vocab, ","), args.dim, args.batch, args.hot,
             ",".join(map(str, args.steps_per_call)), args.rounds, args.blocks, args.steps,
             tf.__version__, os.cpu_count(), " ".join("%.2f" % x for x in os.getloadavg())),
          flush=True)
    sides = ([(len(args.cluster.split(",")), args.cluster)] if args.cluster
             else [(s, None) for s in args.hosts])
    rounds = {s: [] for s, _ in sides}
    moved, failed = {}, False
    for r in range(args.rounds):
        for num_hosts, addresses in sides:
            if addresses:
                hosts = EmbeddingHosts({"embedding": addresses.split(",")},
                                       client_address=args.client_address)
                hosts.connect()
                times, moved[num_hosts], agree = ours_round(args, tables, features, cot, hosts)
            else:
                with local_hosts.LocalHosts(num_hosts) as cluster:
                    cluster.hosts.connect()
                    times, moved[num_hosts], agree = ours_round(args, tables, features, cot,
                                                                cluster.hosts)
            failed |= not agree
            pss = pss_round(args, num_hosts) if args.pss and not addresses else {}
            rounds[num_hosts].append((times, pss))
            print("round %d, %d host(s): %s" % (r, num_hosts, "; ".join(
                "%d/call local %.2f ms, hosts %.2f ms%s" % (
                    k, t["local"] * 1e3, t["hosts"] * 1e3,
                    ", PSS %.2f ms" % (pss[k] * 1e3) if k in pss else "")
                for k, t in times.items())), flush=True)
    print("\nmedians over %d rounds" % args.rounds)
    print("%-9s %6s %11s %9s %22s %11s %12s %9s" % (
        "side", "steps", "samples/s", "overhead", "MB/step to host (max)", "from host",
        "PSS samp/s", "ours/PSS"))
    for steps in args.steps_per_call:
        local = statistics.median(t[steps]["local"] for t, _ in
                                  [x for v in rounds.values() for x in v])
        print("%-9s %6d %11s %9s %22s %11s %12s %9s" % (
            "local", steps, format(int(args.batch / local), ","), "1.00x", "-", "-", "-", "-"))
        for num_hosts, _ in sides:
            per_round = rounds[num_hosts]
            secs = statistics.median(t[steps]["hosts"] for t, _ in per_round)
            overhead = statistics.median(t[steps]["hosts"] / t[steps]["local"]
                                         for t, _ in per_round)
            to_host = [m[0] for m in moved[num_hosts]]
            pss = [p[steps] for _, p in per_round if steps in p]
            ratio = [p[steps] / t[steps]["hosts"] for t, p in per_round if steps in p]
            print("%-9s %6d %11s %8.2fx %22s %11.3f %12s %9s" % (
                "%d host%s" % (num_hosts, "s" if num_hosts > 1 else ""), steps,
                format(int(args.batch / secs), ","), overhead,
                "%.3f (%.3f)" % (np.mean(to_host) / 1e6, max(to_host) / 1e6),
                np.mean([m[1] for m in moved[num_hosts]]) / 1e6,
                format(int(args.batch / statistics.median(pss)), ",") if pss else "-",
                "%.2fx" % statistics.median(ratio) if ratio else "-"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
