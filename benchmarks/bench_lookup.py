#!/usr/bin/env python3
"""Forward-path benchmark: tf_tpu_emb's engine vs TF's native sparse lookup.

Both sides run in ONE process on the SAME batches and the same table values:

  ours  EnqueueTPUEmbeddingArbitraryTensorBatch (COO sample indices, one
        feature per table, input_shape [batch]) followed by
        RecvTPUEmbeddingActivations, i.e. one enqueue + one fused multi-table
        lookup per step, on the CPU engine of tf_tpu_emb.
  TF    tf.nn.safe_embedding_lookup_sparse over one tf.Variable per table with
        the same tf.SparseTensor ids (and weights with --weighted).

Each (dim, combiner) is first checked for equal activations (np.allclose,
rtol=atol=1e-5; a mismatch exits non-zero), then both sides are warmed up and
timed in alternating blocks.  A step is timed with the wall clock around one
call whose result is materialised (``.numpy()`` on its first output).  The
default execution is one tf.function per step on both sides (``--exec``).

Workload (defaults): 8 tables x 1,000,000 rows, batch 4096, 10 ids per sample
drawn from a bounded Zipf(1.05) over the vocabulary (rank -> id through a fixed
random permutation per table, so hot ids are scattered), dims 16/64/128,
combiners sum and mean.  One dim is resident at a time: the engine's copy and
TF's copy of the tables (8 x 1M x 128 floats = 4 GiB each at dim 128) are freed
before the next dim.

    .venv/bin/python benchmarks/bench_lookup.py --quick          # smoke
    .venv/bin/python benchmarks/bench_lookup.py --dims 64        # the issue's target
    .venv/bin/python benchmarks/bench_lookup.py --breakdown      # enqueue vs Recv time
"""
import argparse
import gc
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

QUICK = dict(rows=100_000, steps=20, warmup=3, blocks=4)
FULL = dict(rows=1_000_000, steps=100, warmup=5, blocks=20)


def add_workload_args(p):
    """The workload flags shared with bench_train.py."""
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=None,
                   help="rows per table (1,000,000; --quick 100,000)")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--ids-per-sample", type=int, default=10)
    p.add_argument("--zipf", type=float, default=1.05, help="power-law exponent s, p(k) ~ k^-s")


def add_timing_args(p, full=FULL, quick=QUICK):
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per side (%d; --quick %d)" % (full["steps"], quick["steps"]))
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps per side (%d; --quick %d)"
                   % (full["warmup"], quick["warmup"]))
    p.add_argument("--blocks", type=int, default=None,
                   help="the timed steps are split into this many alternating blocks per side")
    p.add_argument("--num-batches", type=int, default=4,
                   help="distinct pre-generated batches the steps cycle through")


def add_thread_args(p):
    p.add_argument("--threads", type=int, default=2, help="TF intra-op threads (default 2)")
    p.add_argument("--inter-op", type=int, default=2, choices=(1, 2),
                   help="TF inter-op threads (default 2: lets TF run its 8 per-table "
                        "lookups concurrently; ours is one enqueue + one Recv)")


def add_run_args(p):
    """--quick and --seed, shared by the benchmark scripts."""
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 100,000 rows, 20 steps (explicit flags still win)")
    p.add_argument("--seed", type=int, default=1234)


def comma_list(p, text, allowed, what):
    """The items of a comma list, each one of `allowed` (else a usage error)."""
    items = [x for x in text.split(",") if x]
    for x in items:
        if x not in allowed:
            p.error("unknown %s %r (%s)" % (what, x, ", ".join(allowed)))
    return items


def apply_preset(a, full=FULL, quick=QUICK):
    """Fills the flags left at None from the --quick or the full preset."""
    preset = quick if a.quick else full
    for k, v in preset.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.blocks = max(1, min(a.blocks, a.steps))
    return a


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", default="16,64,128", help="comma list (default 16,64,128)")
    p.add_argument("--combiners", default="sum,mean", help="comma list of sum/mean/sqrtn")
    add_workload_args(p)
    add_timing_args(p)
    add_thread_args(p)
    p.add_argument("--weighted", action="store_true", help="random positive weights per id")
    p.add_argument("--exec", dest="exec_mode", default="function",
                   choices=("function", "eager", "auto"),
                   help="function: one tf.function per step on both sides (default); "
                        "eager: eager ops; auto: time both and use the faster one per side")
    p.add_argument("--tf-fast-lookup", action="store_true",
                   help="pass allow_fast_lookup=True to safe_embedding_lookup_sparse "
                        "(only changes TF's weighted path)")
    p.add_argument("--breakdown", action="store_true",
                   help="also time ours' enqueue and Recv separately")
    add_run_args(p)
    a = p.parse_args(argv)
    a.dims = [int(d) for d in a.dims.split(",") if d]
    a.combiners = comma_list(p, a.combiners, ("sum", "mean", "sqrtn"), "combiner")
    return apply_preset(a)


# ------------------------------------------------------------------ helpers

def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def read_first_line(path):
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return "n/a"


def anon_huge_pages():
    """AnonHugePages of /proc/meminfo: how much of the tables got huge pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return "%.2f GB" % (int(line.split()[1]) / 1e6)
    except OSError:
        pass
    return "n/a"


def zipf_cdf(vocab, s):
    """Cumulative table of the bounded Zipf p(k) ~ k^-s, k = 1..vocab."""
    w = np.arange(1, vocab + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(w)
    cdf /= cdf[-1]
    return cdf


def make_batches(a):
    """`num_batches` batches of ids (and weights), shared by both sides.

    Every sample has exactly `ids_per_sample` ids; the ranks come from the
    bounded Zipf by inverse CDF and map to ids through a per-table permutation.
    """
    rng = np.random.default_rng(a.seed)
    cdf = zipf_cdf(a.rows, a.zipf)
    perms = [rng.permutation(a.rows).astype(np.int64) for _ in range(a.tables)]
    n = a.batch * a.ids_per_sample
    indices = np.stack([np.repeat(np.arange(a.batch, dtype=np.int64), a.ids_per_sample),
                        np.tile(np.arange(a.ids_per_sample, dtype=np.int64), a.batch)], axis=1)
    batches = []
    for _ in range(a.num_batches):
        ids, weights = [], []
        for t in range(a.tables):
            ranks = np.searchsorted(cdf, rng.random(n), side="right")
            ranks = np.minimum(ranks, a.rows - 1)
            ids.append(perms[t][ranks])
            weights.append(rng.uniform(0.5, 2.0, n).astype(np.float32) if a.weighted else None)
        batches.append((ids, weights))
    return indices, batches


def table_values(a, t, dim):
    rng = np.random.default_rng([a.seed, dim, t])
    return rng.standard_normal((a.rows, dim), dtype=np.float32)


def sgd_parameters(op):
    """Fills an OptimizationParameters: SGD, constant learning rate 0.1."""
    op.stochastic_gradient_descent.SetInParent()
    op.learning_rate.constant = 0.1


def config_proto(a, dim, optimizer=sgd_parameters):
    """Serialized TPUEmbeddingConfiguration, training mode, feature-descriptor
    mode: one table of `a.rows` x `dim` and one feature (input_shape [batch])
    per table.  `optimizer(optimization_parameters)` fills each table's
    optimizer."""
    from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as cp
    c = cp.TPUEmbeddingConfiguration()
    c.mode = c.TRAINING
    c.num_tensor_cores = 1
    for t in range(a.tables):
        td = c.table_descriptor.add()
        td.name = "table_%d" % t
        td.vocabulary_size = a.rows
        td.dimension = dim
        optimizer(td.optimization_parameters)
    for t in range(a.tables):
        fd = c.feature_descriptor.add()
        fd.name = "feature_%d" % t
        fd.table_id = t
        fd.input_shape.append(a.batch)
    return c.SerializeToString()


def median_ms(xs):
    return 1e3 * statistics.median(xs)


def time_steps(fn, n):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def run_alternating(sides, steps, blocks, pause=0.0):
    """Times `steps` calls of every side, split into `blocks` alternating
    blocks (block order A, B, ..., then reversed: ..., B, A, and so on), so
    that background load hits all sides about equally.  `sides` is a list of
    (name, fn) or (name, fn, k); fn(i) runs the side's i-th call (i counts
    per side) of k steps (default 1) and materialises its result; a side of
    k steps per call makes a k-th of the calls of a block, each timed as
    k steps (its call time / k).  `pause` seconds of sleep before each block
    let the previous side's spinning worker threads go idle (sides in other
    processes).  Returns {name: [seconds per step]}."""
    sides = [tuple(s) + (1,) * (3 - len(s)) for s in sides]
    counter = {name: 0 for name, _, _ in sides}
    times = {name: [] for name, _, _ in sides}

    def counted(name, fn):
        def step():
            i = counter[name]
            counter[name] += 1
            fn(i)
        return step

    per_block = [steps // blocks + (1 if i < steps % blocks else 0) for i in range(blocks)]
    for i, n in enumerate(per_block):
        order = [(name, counted(name, fn), k) for name, fn, k in sides]
        if i % 2:
            order.reverse()
        for name, fn, k in order:
            if pause:
                time.sleep(pause)
            times[name] += [t / k for t in time_steps(fn, max(1, -(-n // k)))]
    return times


# ------------------------------------------------------- shared step pieces

def ours_enqueue(tf, ntab, combiner, indices, ids, weights, mode_override="unspecified"):
    """EnqueueTPUEmbeddingArbitraryTensorBatch of one batch: the same COO
    sample indices for every table's feature, one combiner for all."""
    return tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
        sample_indices_or_row_splits=[indices] * ntab, embedding_indices=ids,
        aggregation_weights=weights, mode_override=mode_override,
        combiners=[combiner] * ntab)


def tf_lookup(tf, variables, sp_ids, sp_weights, combiner, allow_fast_lookup=False):
    """TF's native lookup: one safe_embedding_lookup_sparse per table."""
    return [tf.nn.safe_embedding_lookup_sparse(
                variables[t], sp_ids[t],
                sp_weights[t] if sp_weights is not None else None,
                combiner=combiner, allow_fast_lookup=allow_fast_lookup)
            for t in range(len(variables))]


# ---------------------------------------------------------------- benchmark

class Sides:
    """The step functions of both sides for one (dim, combiner)."""

    def __init__(self, tf, a, cfg, combiner, variables, inputs):
        self.tf, self.a, self.cfg, self.combiner = tf, a, cfg, combiner
        self.variables, self.inputs = variables, inputs
        ntab = a.tables
        raw = tf.raw_ops

        def ours_recv():
            return raw.RecvTPUEmbeddingActivations(num_outputs=ntab, config=cfg)

        def ours_step(indices, ids, weights):
            enqueued = ours_enqueue(tf, ntab, combiner, indices, ids, weights)
            # Automatic control dependencies do not order these two stateful
            # ops (no shared resource), so Recv could run before the enqueue
            # inside one tf.function: make the order explicit.
            with tf.control_dependencies([enqueued] if enqueued is not None else []):
                return ours_recv()

        def tf_step(sp_ids, sp_weights):
            return tf_lookup(tf, variables, sp_ids, sp_weights, combiner, a.tf_fast_lookup)

        self.ours_eager, self.tf_eager = ours_step, tf_step
        self.ours_fn = tf.function(ours_step)
        self.tf_fn = tf.function(tf_step)
        self.enqueue_fn = tf.function(
            lambda *args: ours_enqueue(tf, ntab, combiner, *args) and None)
        self.recv_fn = tf.function(ours_recv)
        self.ours_impl, self.tf_impl = self.ours_fn, self.tf_fn
        self.ours_mode = self.tf_mode = "tf.function"

    def ours(self, b):
        x = self.inputs[b]
        return self.ours_impl(x["indices"], x["ids"], x["weights"])

    def tf_side(self, b):
        x = self.inputs[b]
        return self.tf_impl(x["sp_ids"], x["sp_weights"])


def run_pair(sides, a, steps, blocks):
    """Alternating blocks: ours, TF, TF, ours, ... Returns per-step seconds."""
    nb = a.num_batches
    return run_alternating([("ours", lambda i: sides.ours(i % nb)[0].numpy()),
                            ("tf", lambda i: sides.tf_side(i % nb)[0].numpy())],
                           steps, blocks)


def choose_exec(sides, a):
    """--exec auto: time a short block of each mode per side, keep the faster."""
    probe = max(3, min(10, a.steps // 4))
    res = {}
    for side in ("ours", "tf"):
        for mode in ("tf.function", "eager"):
            if side == "ours":
                sides.ours_impl = sides.ours_fn if mode == "tf.function" else sides.ours_eager
                fn = lambda: sides.ours(0)[0].numpy()  # noqa: E731
            else:
                sides.tf_impl = sides.tf_fn if mode == "tf.function" else sides.tf_eager
                fn = lambda: sides.tf_side(0)[0].numpy()  # noqa: E731
            time_steps(fn, 2)
            res[(side, mode)] = statistics.median(time_steps(fn, probe))
    for side in ("ours", "tf"):
        best = min(("tf.function", "eager"), key=lambda m: res[(side, m)])
        if side == "ours":
            sides.ours_impl = sides.ours_fn if best == "tf.function" else sides.ours_eager
            sides.ours_mode = best
        else:
            sides.tf_impl = sides.tf_fn if best == "tf.function" else sides.tf_eager
            sides.tf_mode = best
    print("  exec probe (median ms/step): " + ", ".join(
        "%s %s %.2f" % (s, m, 1e3 * v) for (s, m), v in res.items()))


def check_equal(sides, a, dim, combiner):
    ours = [o.numpy() for o in sides.ours(0)]
    ref = [o.numpy() for o in sides.tf_side(0)]
    bad = []
    for t, (x, y) in enumerate(zip(ours, ref)):
        if x.shape != y.shape or not np.allclose(x, y, rtol=1e-5, atol=1e-5):
            diff = np.abs(x - y).max() if x.shape == y.shape else float("nan")
            bad.append("table %d: shapes %s vs %s, max |diff| %.3g"
                       % (t, x.shape, y.shape, diff))
    if bad:
        print("\n" + "!" * 78)
        print("!!! MISMATCH dim %d combiner %s: ours and TF activations differ" % (dim, combiner))
        for line in bad:
            print("!!!   " + line)
        print("!" * 78, flush=True)
        return False
    print("  check: activations equal (np.allclose rtol=atol=1e-5) for all %d tables"
          % len(ours))
    return True


def breakdown(sides, a):
    """Ours split into enqueue (its own tf.function) and Recv (its own),
    alternating step by step with the fused step so that all three see the
    same background load."""
    nb = a.num_batches
    enq, rcv, fused = [], [], []
    for i in range(a.warmup + a.steps):
        x = sides.inputs[i % nb]
        t0 = time.perf_counter()
        sides.enqueue_fn(x["indices"], x["ids"], x["weights"])
        t1 = time.perf_counter()
        sides.recv_fn()[0].numpy()
        t2 = time.perf_counter()
        sides.ours_fn(x["indices"], x["ids"], x["weights"])[0].numpy()
        t3 = time.perf_counter()
        if i >= a.warmup:
            enq.append(t1 - t0)
            rcv.append(t2 - t1)
            fused.append(t3 - t2)
    return enq, rcv, fused


def report(a, dim, combiner, times, sides, extra=None):
    ids_per_step = a.tables * a.batch * a.ids_per_sample
    gbytes = ids_per_step * dim * 4 / 1e9
    o, t = statistics.median(times["ours"]), statistics.median(times["tf"])
    row = dict(dim=dim, combiner=combiner, ours_ms=1e3 * o, tf_ms=1e3 * t,
               ours_sps=a.batch / o, tf_sps=a.batch / t, ratio=t / o,
               ours_gbs=gbytes / o, tf_gbs=gbytes / t,
               ours_mean_ms=1e3 * statistics.fmean(times["ours"]),
               tf_mean_ms=1e3 * statistics.fmean(times["tf"]),
               ours_mode=sides.ours_mode, tf_mode=sides.tf_mode)
    if extra:
        row.update(extra)
    print("  %-5s %-12s %12s %12s %12s %10s" % ("side", "exec", "ms/step(med)", "ms/step(mean)",
                                                 "samples/s", "GB/s"))
    print("  %-5s %-12s %12.2f %12.2f %12.0f %10.2f" % ("ours", row["ours_mode"], row["ours_ms"],
                                                        row["ours_mean_ms"], row["ours_sps"],
                                                        row["ours_gbs"]))
    print("  %-5s %-12s %12.2f %12.2f %12.0f %10.2f" % ("TF", row["tf_mode"], row["tf_ms"],
                                                        row["tf_mean_ms"], row["tf_sps"],
                                                        row["tf_gbs"]))
    print("  speed ratio ours/TF: %.2fx" % row["ratio"])
    if "enqueue_ms" in row:
        print("  breakdown (ours, separate tf.functions, median): enqueue %.2f ms + Recv %.2f ms"
              " = %.2f ms; fused step in the same window %.2f ms (%.0f%% enqueue)"
              % (row["enqueue_ms"], row["recv_ms"], row["enqueue_ms"] + row["recv_ms"],
                 row["fused_ms"], 100 * row["enqueue_ms"] / (row["enqueue_ms"] + row["recv_ms"])))
    sys.stdout.flush()
    return row


def setup_tf(a):
    """Imports TF with the thread settings of `a` (before TF runs anything)
    and loads the tf_tpu_emb op library."""
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.inter_op)
    import tf_tpu_emb
    tf_tpu_emb.load_library()
    return tf, tf_tpu_emb


def print_environment(tf, tf_tpu_emb, a):
    print("TensorFlow      %s (tf_tpu_emb %s), Python %s, numpy %s"
          % (tf.__version__, tf_tpu_emb.__version__, platform.python_version(), np.__version__))
    print("CPU             %s; os.cpu_count %s, usable %d"
          % (cpu_model(), os.cpu_count(), len(os.sched_getaffinity(0))))
    print("threads         intra-op %d, inter-op %d" % (a.threads, a.inter_op))
    print("THP             %s" % read_first_line("/sys/kernel/mm/transparent_hugepage/enabled"))
    print("loadavg (start) %s" % read_first_line("/proc/loadavg"))


def prepare_inputs(tf, a):
    """Generates the batches (printing how long it took and their share of
    distinct ids) and builds the tensors both sides take, once, so that no
    conversion happens in the timed loop.  Returns (inputs, distinct): one
    dict per batch (indices, ids, weights for ours; sp_ids, sp_weights for
    TF), and distinct[b][t] = number of distinct ids of table t in batch b."""
    t0 = time.perf_counter()
    indices_np, batches_np = make_batches(a)
    distinct = [[len(np.unique(ids)) for ids in ids_l] for ids_l, _ in batches_np]
    uniq = statistics.fmean(n / (a.batch * a.ids_per_sample) for d in distinct for n in d)
    print("batches         generated in %.1fs; distinct ids per table-batch: %.1f%%"
          % (time.perf_counter() - t0, 100 * uniq))

    dense_shape = [a.batch, a.ids_per_sample]
    indices = tf.constant(indices_np)
    empty_w = tf.zeros([0], tf.float32)
    inputs = []
    for ids_l, w_l in batches_np:
        ids = [tf.constant(x) for x in ids_l]
        ws = [tf.constant(w) for w in w_l] if a.weighted else None
        inputs.append(dict(
            indices=indices, ids=ids,
            weights=ws if a.weighted else [empty_w] * a.tables,
            sp_ids=[tf.SparseTensor(indices, x, dense_shape) for x in ids],
            sp_weights=[tf.SparseTensor(indices, w, dense_shape) for w in ws]
            if a.weighted else None))
    return inputs, distinct


def main(argv=None):
    a = parse_args(argv)
    tf, tf_tpu_emb = setup_tf(a)

    ids_per_step = a.tables * a.batch * a.ids_per_sample
    print("=" * 78)
    print("tf_tpu_emb forward-path benchmark: enqueue+Recv (ours) vs "
          "tf.nn.safe_embedding_lookup_sparse (TF)")
    print("=" * 78)
    print_environment(tf, tf_tpu_emb, a)
    print("workload        %d tables x %s rows, batch %d, %d ids/sample (%s ids/step), "
          "Zipf(%.2f), %s, dims %s, combiners %s"
          % (a.tables, format(a.rows, ","), a.batch, a.ids_per_sample, format(ids_per_step, ","),
             a.zipf, "weighted" if a.weighted else "unweighted",
             ",".join(map(str, a.dims)), ",".join(a.combiners)))
    print("timing          %d warm-up + %d timed steps per side in %d alternating blocks, "
          "%d distinct batches; wall clock per step incl. .numpy() of output 0; "
          "exec %s%s" % (a.warmup, a.steps, a.blocks, a.num_batches, a.exec_mode,
                         ", TF allow_fast_lookup" if a.tf_fast_lookup else ""))
    if a.quick:
        print("mode            --quick (smoke run, not the issue's workload)")

    inputs, _ = prepare_inputs(tf, a)

    rows, ok = [], True
    for dim in a.dims:
        print("\n--- dim %d " % dim + "-" * 66)
        t0 = time.perf_counter()
        cfg = config_proto(a, dim)
        tf.raw_ops.ConfigureTPUEmbedding(config=cfg)
        variables = []
        try:
            for t in range(a.tables):
                vals = table_values(a, t, dim)
                tf.raw_ops.LoadTPUEmbeddingStochasticGradientDescentParameters(
                    parameters=vals, table_id=t, num_shards=1, shard_id=0)
                variables.append(tf.Variable(vals, name="table_%d" % t, trainable=False))
                del vals
            gc.collect()
            print("  tables loaded into the engine and tf.Variables in %.1fs (%.2f GB per copy; "
                  "AnonHugePages %s)" % (time.perf_counter() - t0,
                                         a.tables * a.rows * dim * 4 / 1e9, anon_huge_pages()))
            for combiner in a.combiners:
                print("\n  [dim %d, combiner %s]" % (dim, combiner))
                sides = Sides(tf, a, cfg, combiner, variables, inputs)
                if not check_equal(sides, a, dim, combiner):
                    ok = False
                    break
                if a.exec_mode == "eager":
                    sides.ours_impl, sides.tf_impl = sides.ours_eager, sides.tf_eager
                    sides.ours_mode = sides.tf_mode = "eager"
                elif a.exec_mode == "auto":
                    choose_exec(sides, a)
                run_pair(sides, a, 2 * a.warmup, 2)  # warm-up, both sides
                times = run_pair(sides, a, a.steps, a.blocks)
                extra = None
                if a.breakdown:
                    enq, rcv, fused = breakdown(sides, a)
                    extra = dict(enqueue_ms=median_ms(enq), recv_ms=median_ms(rcv),
                                 fused_ms=median_ms(fused))
                rows.append(report(a, dim, combiner, times, sides, extra))
                del sides
                gc.collect()
        finally:
            del variables
            tf_tpu_emb.ops.shutdown_tpu_embedding()
            gc.collect()
        if not ok:
            break

    if rows:
        print("\n" + "=" * 78)
        print("Summary (median step time; samples/s = batch / step; GB/s = ids x dim x 4 B / step)")
        print("threads: intra-op %d, inter-op %d; %s rows x %d tables, batch %d, %d ids/sample%s"
              % (a.threads, a.inter_op, format(a.rows, ","), a.tables, a.batch,
                 a.ids_per_sample, ", weighted" if a.weighted else ""))
        hdr = "| dim | combiner | ours samples/s | TF samples/s | ours/TF | ours GB/s | TF GB/s |"
        if a.breakdown:
            hdr += " enqueue ms | Recv ms |"
        print(hdr)
        print("|" + "|".join("---" for _ in range(hdr.count("|") - 1)) + "|")
        for r in rows:
            line = ("| %d | %s | %.0f | %.0f | %.2fx | %.2f | %.2f |"
                    % (r["dim"], r["combiner"], r["ours_sps"], r["tf_sps"], r["ratio"],
                       r["ours_gbs"], r["tf_gbs"]))
            if a.breakdown:
                line += " %.2f | %.2f |" % (r["enqueue_ms"], r["recv_ms"])
            print(line)
        print("loadavg (end) %s" % read_first_line("/proc/loadavg"))
    if not ok:
        print("FAILED: activations differ between ours and TF (see above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
