#!/usr/bin/env python3
"""Cluster benchmark: the training step on S embedding hosts vs one in-process engine.

One step is the mid-level API's step in one ``tf.function``:
``enqueue(training=True)`` -> ``dequeue`` -> ``apply_gradients(c)`` for a fixed
random activation gradient c (Adagrad, combiner mean, ragged multi-hot bags
with Zipf ids).  Sides:

  local   ``tf_tpu_emb.TPUEmbedding`` with one engine in this process;
  S hosts the same object with ``cluster=`` S embedding hosts
          (``python -m tf_tpu_emb.server`` processes, DIV_DEFAULT sharding);
          without ``--cluster`` they are started on 127.0.0.1
          (``tf_tpu_emb.cluster.local.LocalHosts``), with ``--cluster`` the
          hosts already running at those addresses are used.

Every side starts from the same tables; after the first step the activations
of each side must equal the local side's (rtol 1e-5: a bag split over hosts is
summed in another order), else it exits with status 1.  Per side: warm-up, then
``--steps`` timed steps; samples/s = batch / median step time; overhead =
median step time / the local side's.

Bytes moved per step per host are computed from the routed tensors' sizes
(``tf_tpu_emb.cluster.routing.Router`` on the first batch): worker -> host the
row splits, local ids (int64) and folded weights (float32) of every feature,
plus the activation gradient (every host gets all of it); host -> worker the
partial activations (every output position, float32).  The mean over hosts
and the largest host are printed.

    .venv/bin/python benchmarks/bench_cluster.py --quick
    .venv/bin/python benchmarks/bench_cluster.py                  # 1, 2 and 4 hosts
    .venv/bin/python benchmarks/bench_cluster.py --cluster a:2222,b:2222 \\
        --client-address trainer:2300                             # real machines
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_tpu_emb  # noqa: E402
from tf_tpu_emb.cluster import EmbeddingHosts, routing  # noqa: E402
from tf_tpu_emb.cluster import local as local_hosts  # noqa: E402

E = tf.tpu.experimental.embedding
DEFAULTS = dict(tables=8, vocab=100_000, dim=32, batch=1024, hot=10, steps=30, hosts="1,2,4")
QUICK = dict(tables=2, vocab=1_000, dim=8, batch=64, hot=3, steps=5, hosts="1,2")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for k, v in DEFAULTS.items():
        p.add_argument("--" + k, type=type(v), help="default %s (--quick: %s)" % (v, QUICK[k]))
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per side (default 3)")
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
    if min([args.tables, args.vocab, args.dim, args.batch, args.hot, args.steps]
           + args.hosts) < 1:
        p.error("sizes, --steps and --hosts must be >= 1")
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


def make_embedding(args, tables, cluster=None):
    config = {}
    for t, init in enumerate(tables):
        table = E.TableConfig(vocabulary_size=args.vocab, dim=args.dim, name="t%d" % t,
                              combiner="mean", initializer=tf.constant_initializer(init))
        config["f%d" % t] = E.FeatureConfig(table, name="f%d" % t)
    emb = tf_tpu_emb.TPUEmbedding(config, E.Adagrad(learning_rate=0.05), cluster=cluster)
    emb.build(per_replica_batch_size=args.batch)
    return emb


def measure(args, emb, features, cot):
    """(first step's activations, median step seconds)."""
    @tf.function
    def step():
        emb.enqueue(features, training=True)
        acts = emb.dequeue()
        emb.apply_gradients(cot)
        return acts

    first = {k: v.numpy() for k, v in step().items()}
    for _ in range(args.warmup):
        step()["f0"].numpy()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()["f0"].numpy()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def bytes_per_host(args, features, num_hosts):
    """Per host: (worker -> host, host -> worker) bytes of one step."""
    router = routing.Router([routing.FeatureRoute(name, [args.batch], args.vocab, "mean")
                             for name in features], num_hosts, mod=False)
    per_host = router.route([f.row_splits for f in features.values()],
                            [f.values for f in features.values()],
                            [tf.zeros([0], tf.float32)] * len(features))
    activations = args.tables * args.batch * args.dim * 4  # one float32 per output value
    out = []
    for splits, ids, weights in per_host:
        sent = sum(int(tf.size(t)) * t.dtype.size for t in splits + ids + weights)
        out.append((sent + activations, activations))  # + gradients; the partial activations
    return out


def run_side(args, tables, features, cot, hosts):
    emb = make_embedding(args, tables, hosts)
    try:
        return measure(args, emb, features, cot)
    finally:
        emb.shutdown()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    tables, features, cot = workload(args)
    print("bench_cluster: %d tables x %s rows x dim %d, batch %d, %d ids a sample (Zipf), "
          "Adagrad, combiner mean; median of %d steps (TensorFlow %s, %d CPUs)"
          % (args.tables, format(args.vocab, ","), args.dim, args.batch, args.hot, args.steps,
             tf.__version__, os.cpu_count()))
    want, local_s = run_side(args, tables, features, cot, None)
    print("%-10s %12s %10s %16s %16s" % ("side", "samples/s", "overhead", "MB/step to host",
                                          "MB/step from host"))
    print("%-10s %12s %10s %16s %16s" % ("local", format(int(args.batch / local_s), ","),
                                          "1.00x", "-", "-"))
    sides = ([(len(args.cluster.split(",")), args.cluster)] if args.cluster
             else [(s, None) for s in args.hosts])
    failed = False
    for num_hosts, addresses in sides:
        if addresses:
            hosts = EmbeddingHosts({"embedding": addresses.split(",")},
                                   client_address=args.client_address)
            hosts.connect()
            got, secs = run_side(args, tables, features, cot, hosts)
        else:
            with local_hosts.LocalHosts(num_hosts) as cluster:
                cluster.hosts.connect()
                got, secs = run_side(args, tables, features, cot,
                                     cluster.hosts)
        for name in want:
            if not np.allclose(got[name], want[name], rtol=1e-5, atol=1e-6):
                print("MISMATCH: %d hosts, feature %s differs from the local engine"
                      % (num_hosts, name))
                failed = True
        moved = bytes_per_host(args, features, num_hosts)
        out = [m[0] for m in moved]
        print("%-10s %12s %9.2fx %16s %16.3f" % (
            "%d host%s" % (num_hosts, "s" if num_hosts > 1 else ""),
            format(int(args.batch / secs), ","), secs / local_s,
            "%.3f (max %.3f)" % (np.mean(out) / 1e6, max(out) / 1e6), moved[0][1] / 1e6))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
