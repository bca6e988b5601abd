#!/usr/bin/env python3
"""Training-step benchmark: tf_tpu_emb's engine vs TF-native sparse Adagrad.

All sides run in ONE process on the SAME batches (bench_lookup.py's workload),
from the same table values, with Adagrad (learning rate 0.1, accumulators
starting at 0.1, epsilon 0) and the same loss, sum_t reduce_sum(act_t * c_t)
for fixed random c_t (so dL/d(act_t) = c_t):

  ours  one tf.function: EnqueueTPUEmbeddingArbitraryTensorBatch (training
        mode, COO sample indices) -> RecvTPUEmbeddingActivations -> the loss
        -> tape.gradient w.r.t. the Recv outputs -> SendTPUEmbeddingGradients,
        with explicit control dependencies enqueue -> Recv and Recv/grads ->
        Send.  The engine applies Adagrad inside Send.
  TF-a  one tf.function: safe_embedding_lookup_sparse on tf.Variable tables,
        the loss, tape.gradient (IndexedSlices), then
        keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.1,
        epsilon=0).apply_gradients.
  TF-b  one tf.function: the same lookup and gradient, the IndexedSlices
        de-duplicated (tf.unique + unsorted_segment_sum), then
        tf.raw_ops.ResourceSparseApplyAdagradV2 per table on tf.Variable
        accumulators.

The engine's tables stay resident.  TF-a and TF-b run one after the other,
each in its own window alternating blocks with ours, and each is freed before
the next (TF's CPU allocator keeps the freed pages and reuses them for the
next side, so VmRSS does not drop but does not grow either): peak RSS is about
2 x (tables + accumulators) plus the check's copies (11.8 GB at dim 64).
Before each window, ours is reset to the initial values, both sides run one
step on batch 0, and every table and accumulator must be equal
(np.allclose, rtol 1e-4, atol 1e-5); a mismatch exits non-zero.

    .venv/bin/python benchmarks/bench_train.py --quick        # smoke
    .venv/bin/python benchmarks/bench_train.py                # dim 64, the issue's target
    .venv/bin/python benchmarks/bench_train.py --breakdown    # enqueue / Recv+grad / Send
"""
import argparse
import gc
import statistics
import sys
import time

import bench_lookup as bl
import numpy as np

QUICK = dict(rows=100_000, steps=20, warmup=3, blocks=4)
FULL = dict(rows=1_000_000, steps=100, warmup=5, blocks=20)
TARGETS = {"keras": 20.0, "raw": 5.0}  # the ours/TF targets at dim 64, 2 threads
NAMES = {"keras": "TF-a", "raw": "TF-b"}
TITLES = {"keras": "TF-a: Keras Adagrad apply_gradients",
          "raw": "TF-b: unique + ResourceSparseApplyAdagradV2"}
RTOL, ATOL = 1e-4, 1e-5


def add_optimizer_args(p):
    """The learning rate and Adagrad's initial accumulator (shared with the
    peer and memory benchmarks)."""
    p.add_argument("--lr", type=float, default=0.1, help="learning rate (0.1)")
    p.add_argument("--initial-accumulator", type=float, default=0.1,
                   help="Adagrad initial accumulator value (0.1)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", default="64", help="comma list (default 64)")
    p.add_argument("--combiner", default="sum", choices=("sum", "mean", "sqrtn"))
    bl.add_workload_args(p)
    bl.add_timing_args(p, FULL, QUICK)
    bl.add_thread_args(p)
    p.add_argument("--baselines", default="keras,raw",
                   help="comma list of the TF sides to run: keras (TF-a), raw (TF-b)")
    p.add_argument("--weighted", action="store_true", help="random positive weights per id")
    add_optimizer_args(p)
    p.add_argument("--breakdown", action="store_true",
                   help="also time ours' enqueue, Recv+grad and Send separately")
    p.add_argument("--max-rss-gb", type=float, default=18.0,
                   help="abort when VmRSS exceeds this at a checkpoint (18)")
    bl.add_run_args(p)
    a = p.parse_args(argv)
    a.dims = [int(d) for d in a.dims.split(",") if d]
    a.baselines = bl.comma_list(p, a.baselines, tuple(NAMES), "baseline")
    return bl.apply_preset(a, FULL, QUICK)


# ------------------------------------------------------------------ memory

def proc_status(key):
    """A /proc/self/status field in GB (VmRSS: resident now; VmHWM: peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024 / 1e9
    return float("nan")


def memory(a, where):
    rss = proc_status("VmRSS")
    print("  memory %-50s VmRSS %6.2f GB (peak VmHWM %.2f GB)"
          % (where + ":", rss, proc_status("VmHWM")), flush=True)
    if rss > a.max_rss_gb:
        raise SystemExit("VmRSS %.2f GB exceeds --max-rss-gb %.1f: stopping" % (rss, a.max_rss_gb))


# ------------------------------------------------------------------- sides

def adagrad_parameters(a):
    def fill(op):
        op.adagrad.SetInParent()
        op.learning_rate.constant = a.lr
        # gradient_accumulation_status left at its default (accumulation on).
    return fill


def loss_weights(tf, a, dim):
    """The fixed c_t of the loss sum_t reduce_sum(act_t * c_t)."""
    rng = np.random.default_rng([a.seed, dim, 7])
    return [tf.constant(rng.standard_normal((a.batch, dim), dtype=np.float32))
            for _ in range(a.tables)]


def loss_of(tf, acts, c):
    return tf.add_n([tf.reduce_sum(x * ct) for x, ct in zip(acts, c)])


class Ours:
    """The engine's training step, fused (one tf.function) and split into
    enqueue / Recv+grad / Send (three tf.functions) for --breakdown."""

    def __init__(self, tf, a, cfg, c, inputs):
        self.tf, self.a, self.inputs = tf, a, inputs
        ntab, raw = a.tables, tf.raw_ops

        def enqueue(indices, ids, weights):
            return bl.ours_enqueue(tf, ntab, a.combiner, indices, ids, weights,
                                   mode_override="train")

        def recv_grad():
            acts = raw.RecvTPUEmbeddingActivations(num_outputs=ntab, config=cfg)
            with tf.GradientTape() as tape:
                tape.watch(acts)
                loss = loss_of(tf, acts, c)
            return loss, acts, tape.gradient(loss, acts)

        def send(grads):
            return raw.SendTPUEmbeddingGradients(inputs=grads, learning_rates=[], config=cfg)

        def step(indices, ids, weights):
            # Automatic control dependencies do not order our stateful ops
            # (no shared resource), and the gradient c does not even depend
            # on the activations' values: make enqueue -> Recv -> Send explicit.
            enqueued = enqueue(indices, ids, weights)
            with tf.control_dependencies([enqueued] if enqueued is not None else []):
                loss, acts, grads = recv_grad()
            with tf.control_dependencies(list(acts) + list(grads)):
                send(grads)
            return loss

        def recv_grad_only():
            return recv_grad()[2]

        self.step_body = step  # for callers that put several steps in one tf.function
        self.step_fn = tf.function(step)
        self.enqueue_fn = tf.function(lambda *args: enqueue(*args) and None)
        self.recv_grad_fn = tf.function(recv_grad_only)
        self.send_fn = tf.function(lambda grads: send(grads) and None)

    def step(self, b):
        x = self.inputs[b]
        return self.step_fn(x["indices"], x["ids"], x["weights"])

    def load(self, dim):
        """(Re)loads the initial tables and accumulators into the engine."""
        tf, a = self.tf, self.a
        for t in range(a.tables):
            vals = bl.table_values(a, t, dim)
            tf.raw_ops.LoadTPUEmbeddingAdagradParameters(
                parameters=vals, accumulators=np.full_like(vals, a.initial_accumulator),
                table_id=t, num_shards=1, shard_id=0)
            del vals
            gc.collect()

    def table(self, t):
        p, acc = self.tf.raw_ops.RetrieveTPUEmbeddingAdagradParameters(
            table_id=t, num_shards=1, shard_id=0)
        return p.numpy(), acc.numpy()


class TFSide:
    """TF-native training step on tf.Variable tables: lookup, loss,
    tape.gradient, then Keras Adagrad (kind 'keras') or de-duplication +
    ResourceSparseApplyAdagradV2 (kind 'raw')."""

    def __init__(self, tf, a, dim, c, inputs, kind):
        self.tf, self.a, self.inputs, self.kind = tf, a, inputs, kind
        self.variables = []
        for t in range(a.tables):
            vals = bl.table_values(a, t, dim)
            self.variables.append(tf.Variable(vals, name="table_%d" % t, trainable=True))
            del vals
            gc.collect()
        variables = self.variables
        if kind == "keras":
            import keras
            self.opt = keras.optimizers.Adagrad(
                learning_rate=a.lr, initial_accumulator_value=a.initial_accumulator,
                epsilon=0.0)
            self.opt.build(variables)  # the accumulators, outside the tf.function
            self.accumulators = [self.opt._accumulators[self.opt._get_variable_index(v)]
                                 for v in variables]
        else:
            self.accumulators = [
                tf.Variable(tf.fill([a.rows, dim], tf.constant(a.initial_accumulator)),
                            name="accumulator_%d" % t, trainable=False)
                for t in range(a.tables)]
        accumulators = self.accumulators
        lr, eps = tf.constant(a.lr, tf.float32), tf.constant(0.0, tf.float32)

        def step(sp_ids, sp_weights):
            with tf.GradientTape() as tape:
                acts = bl.tf_lookup(tf, variables, sp_ids, sp_weights, a.combiner)
                loss = loss_of(tf, acts, c)
            grads = tape.gradient(loss, variables)
            if kind == "keras":
                self.opt.apply_gradients(zip(grads, variables))
            else:
                for var, acc, g in zip(variables, accumulators, grads):
                    rows, pos = tf.unique(g.indices)
                    values = tf.math.unsorted_segment_sum(g.values, pos, tf.size(rows))
                    tf.raw_ops.ResourceSparseApplyAdagradV2(
                        var=var.handle, accum=acc.handle, lr=lr, epsilon=eps,
                        grad=values, indices=rows)
            return loss

        self.step_fn = tf.function(step)

    def step(self, b):
        x = self.inputs[b]
        return self.step_fn(x["sp_ids"], x["sp_weights"])

    def table(self, t):
        return self.variables[t].numpy(), self.accumulators[t].numpy()


# ------------------------------------------------------------- measurement

def check_step(ours, side, a, dim, distinct0):
    """One step of both on batch 0 from the same initial state, then every
    table and accumulator compared, and the rows the step touched counted
    (accumulator row != initial value) against batch 0's distinct ids."""
    lo = ours.step(0).numpy()
    ls = side.step(0).numpy()
    bad, worst_w, worst_acc, touched = [], 0.0, 0.0, 0
    for t in range(a.tables):
        pw, pacc = ours.table(t)
        sw, sacc = side.table(t)
        for what, x, y in (("table", pw, sw), ("accumulators", pacc, sacc)):
            ok = x.shape == y.shape and np.allclose(x, y, rtol=RTOL, atol=ATOL)
            diff = float(np.abs(x - y).max()) if x.shape == y.shape else float("nan")
            if what == "table":
                worst_w = max(worst_w, diff)
            else:
                relative = np.abs(x - y) / np.maximum(np.abs(y), 1e-30)
                worst_acc = max(worst_acc, float(np.max(relative)))
            if not ok:
                bad.append("table %d %s: shapes %s vs %s, max |diff| %.3g"
                           % (t, what, x.shape, y.shape, diff))
        rows = int(np.count_nonzero((pacc != np.float32(a.initial_accumulator)).any(axis=1)))
        if rows != distinct0[t]:
            bad.append("table %d: the step touched %d rows, batch 0 has %d distinct ids"
                       % (t, rows, distinct0[t]))
        touched += rows
        del pw, pacc, sw, sacc
        gc.collect()
    name = NAMES[side.kind]
    if bad:
        print("\n" + "!" * 78)
        print("!!! MISMATCH dim %d: ours and %s differ after one step" % (dim, name))
        for line in bad:
            print("!!!   " + line)
        print("!" * 78, flush=True)
        return False
    print("  check: after one step on batch 0, ours and %s have equal tables and "
          "accumulators (np.allclose rtol=%g atol=%g) for all %d tables; max |diff| "
          "tables %.2g, max rel diff accumulators %.2g; %d rows updated (= distinct ids); "
          "loss %.6g vs %.6g" % (name, RTOL, ATOL, a.tables, worst_w, worst_acc, touched,
                                 lo, ls))
    return True


def breakdown(ours, a):
    """Ours split into three tf.functions (enqueue, Recv+grad, Send), step
    by step alternating with the fused step, so all see the same load."""
    nb = a.num_batches
    enq, rg, snd, fused = [], [], [], []
    for i in range(a.warmup + a.steps):
        x = ours.inputs[i % nb]
        t0 = time.perf_counter()
        ours.enqueue_fn(x["indices"], x["ids"], x["weights"])
        t1 = time.perf_counter()
        grads = ours.recv_grad_fn()
        grads[0].numpy()
        t2 = time.perf_counter()
        ours.send_fn(grads)
        t3 = time.perf_counter()
        ours.step(i % nb).numpy()
        t4 = time.perf_counter()
        if i >= a.warmup:
            enq.append(t1 - t0)
            rg.append(t2 - t1)
            snd.append(t3 - t2)
            fused.append(t4 - t3)
    return dict(enqueue_ms=bl.median_ms(enq), recv_grad_ms=bl.median_ms(rg),
                send_ms=bl.median_ms(snd), fused_ms=bl.median_ms(fused))


def side_row(a, times, gbytes):
    med = statistics.median(times)
    return dict(ms=1e3 * med, mean_ms=1e3 * statistics.fmean(times), steps_s=1 / med,
                sps=a.batch / med, gbs=gbytes / med)


def target_applies(a, dim):
    """The issue's targets are for its workload: dim 64, 2 threads, 8 x 1M
    rows, batch 4096, 10 ids/sample, unweighted sum."""
    return (dim == 64 and a.threads == 2 and a.tables == 8 and a.rows == 1_000_000
            and a.batch == 4096 and a.ids_per_sample == 10 and a.combiner == "sum"
            and not a.weighted)


def verdict(a, dim, kind, ratio):
    if not target_applies(a, dim):
        return "(>= %gx on the issue's workload only)" % TARGETS[kind]
    return ">= %gx %s" % (TARGETS[kind], "met" if ratio >= TARGETS[kind] else "MISSED")


def print_rows(rows):
    print("  %-6s %12s %13s %9s %11s %8s" % ("side", "ms/step(med)", "ms/step(mean)",
                                              "steps/s", "samples/s", "GB/s"))
    for name, r in rows:
        print("  %-6s %12.2f %13.2f %9.2f %11.0f %8.2f"
              % (name, r["ms"], r["mean_ms"], r["steps_s"], r["sps"], r["gbs"]))


def run_dim(tf, tf_tpu_emb, a, dim, inputs, distinct, results):
    print("\n--- dim %d " % dim + "-" * 66)
    # Bytes per step: the forward gather (ids x dim) plus, per distinct row of
    # the step, its weight and accumulator read and written (4 x dim).
    mean_distinct = statistics.fmean(sum(d) for d in distinct)
    ids_per_step = a.tables * a.batch * a.ids_per_sample
    gbytes = (ids_per_step + 4 * mean_distinct) * dim * 4 / 1e9
    cfg = bl.config_proto(a, dim, adagrad_parameters(a))
    c = loss_weights(tf, a, dim)
    t0 = time.perf_counter()
    tf.raw_ops.ConfigureTPUEmbedding(config=cfg)
    ok = True
    try:
        ours = Ours(tf, a, cfg, c, inputs)
        ours.load(dim)
        print("  engine configured (Adagrad) and loaded in %.1fs: tables + accumulators "
              "%.2f GB; AnonHugePages %s" % (time.perf_counter() - t0,
                                             2 * a.tables * a.rows * dim * 4 / 1e9,
                                             bl.anon_huge_pages()))
        memory(a, "ours resident")
        res = dict(dim=dim, gbytes=gbytes, windows={})
        for n, kind in enumerate(a.baselines):
            print("\n  [dim %d, ours vs %s]" % (dim, TITLES[kind]))
            if n > 0:
                t0 = time.perf_counter()
                ours.load(dim)
                print("  ours reset to the initial tables in %.1fs" % (time.perf_counter() - t0))
            t0 = time.perf_counter()
            side = TFSide(tf, a, dim, c, inputs, kind)
            print("  %s variables + accumulators built in %.1fs"
                  % (NAMES[kind], time.perf_counter() - t0))
            memory(a, "ours + %s resident" % NAMES[kind])
            if not check_step(ours, side, a, dim, distinct[0]):
                ok = False
                break
            memory(a, "after the check")
            nb = a.num_batches
            sides = [("ours", lambda i: ours.step(i % nb).numpy()),
                     (NAMES[kind], lambda i, side=side: side.step(i % nb).numpy())]
            bl.run_alternating(sides, 2 * a.warmup, 2)  # warm-up, both sides
            times = bl.run_alternating(sides, a.steps, a.blocks)
            ro, rs = side_row(a, times["ours"], gbytes), side_row(a, times[NAMES[kind]], gbytes)
            ratio = rs["ms"] / ro["ms"]
            print_rows([("ours", ro), (NAMES[kind], rs)])
            print("  speed ratio ours/%s: %.2fx; target %s"
                  % (NAMES[kind], ratio, verdict(a, dim, kind, ratio)))
            res["windows"][kind] = dict(ours=ro, side=rs, ratio=ratio)
            memory(a, "after timing")
            del side, sides
            gc.collect()
            memory(a, "%s freed (pages kept by TF's allocator)" % NAMES[kind])
        if ok and a.breakdown:
            res["breakdown"] = b = breakdown(ours, a)
            print("\n  breakdown (ours, separate tf.functions, median): enqueue %.2f ms + "
                  "Recv+grad %.2f ms + Send %.2f ms = %.2f ms; fused step in the same window "
                  "%.2f ms" % (b["enqueue_ms"], b["recv_grad_ms"], b["send_ms"],
                               b["enqueue_ms"] + b["recv_grad_ms"] + b["send_ms"],
                               b["fused_ms"]))
        if ok:
            results.append(res)
    finally:
        ours = None
        tf_tpu_emb.ops.shutdown_tpu_embedding()
        gc.collect()
    return ok


def print_summary(a, results):
    print("\n" + "=" * 78)
    print("Summary (median step time; samples/s = batch / step; GB/s = (ids + 4 x distinct "
          "rows) x dim x 4 B / step: forward gather + weight and accumulator rows read and "
          "written)")
    print("threads: intra-op %d, inter-op %d; %s rows x %d tables, batch %d, %d ids/sample, "
          "combiner %s%s; Adagrad lr %g, initial accumulator %g"
          % (a.threads, a.inter_op, format(a.rows, ","), a.tables, a.batch, a.ids_per_sample,
             a.combiner, ", weighted" if a.weighted else "", a.lr, a.initial_accumulator))
    print("| dim | window | side | ms/step | steps/s | samples/s | GB/s | ours/side | target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for kind, w in r["windows"].items():
            name = NAMES[kind]
            print("| %d | vs %s | ours | %.2f | %.1f | %.0f | %.2f | | |"
                  % (r["dim"], name, w["ours"]["ms"], w["ours"]["steps_s"], w["ours"]["sps"],
                     w["ours"]["gbs"]))
            print("| %d | vs %s | %s | %.2f | %.2f | %.0f | %.2f | %.2fx | %s |"
                  % (r["dim"], name, TITLES[kind], w["side"]["ms"], w["side"]["steps_s"],
                     w["side"]["sps"], w["side"]["gbs"], w["ratio"],
                     verdict(a, r["dim"], kind, w["ratio"])))
    if a.breakdown:
        print("\n| dim | enqueue ms | Recv+grad ms | Send ms | sum ms | fused step ms |")
        print("|---|---|---|---|---|---|")
        for r in results:
            b = r.get("breakdown")
            if b:
                print("| %d | %.2f | %.2f | %.2f | %.2f | %.2f |"
                      % (r["dim"], b["enqueue_ms"], b["recv_grad_ms"], b["send_ms"],
                         b["enqueue_ms"] + b["recv_grad_ms"] + b["send_ms"], b["fused_ms"]))
    print("peak VmHWM %.2f GB" % proc_status("VmHWM"))
    print("loadavg (end) %s" % bl.read_first_line("/proc/loadavg"))


def main(argv=None):
    a = parse_args(argv)
    tf, tf_tpu_emb = bl.setup_tf(a)

    ids_per_step = a.tables * a.batch * a.ids_per_sample
    print("=" * 78)
    print("tf_tpu_emb training-step benchmark: enqueue+Recv+grad+Send (ours) vs TF-native "
          "sparse Adagrad (TF-a Keras, TF-b raw op)")
    print("=" * 78)
    bl.print_environment(tf, tf_tpu_emb, a)
    import keras
    print("Keras           %s" % keras.__version__)
    print("workload        %d tables x %s rows, batch %d, %d ids/sample (%s ids/step), "
          "Zipf(%.2f), %s, dims %s, combiner %s"
          % (a.tables, format(a.rows, ","), a.batch, a.ids_per_sample, format(ids_per_step, ","),
             a.zipf, "weighted" if a.weighted else "unweighted",
             ",".join(map(str, a.dims)), a.combiner))
    print("optimizer       Adagrad, learning rate %g, initial accumulator %g, epsilon 0; loss "
          "sum_t reduce_sum(act_t * c_t), c_t ~ N(0,1) fixed" % (a.lr, a.initial_accumulator))
    print("timing          %d warm-up + %d timed steps per side in %d alternating blocks, "
          "%d distinct batches; wall clock per step incl. .numpy() of the loss; one "
          "tf.function per step; baselines %s"
          % (a.warmup, a.steps, a.blocks, a.num_batches,
             ", ".join(NAMES[b] for b in a.baselines)))
    if a.quick:
        print("mode            --quick (smoke run, not the issue's workload)")
    inputs, distinct = bl.prepare_inputs(tf, a)
    memory(a, "inputs built")

    results, ok = [], True
    for dim in a.dims:
        if not run_dim(tf, tf_tpu_emb, a, dim, inputs, distinct, results):
            ok = False
            break
    if results:
        print_summary(a, results)
    if not ok:
        print("FAILED: tables differ between ours and TF after one step (see above)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
