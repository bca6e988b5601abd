#!/usr/bin/env python3
"""The SparseCore (TPUEmbeddingV2) path against the V1 engine on the same
tables, batch and ids: one Adagrad training step each.

Both sides run in one process on bench_lookup.py's workload (T tables of R
rows, one feature per table, `ids-per-sample` Zipf ids per sample, combiner
sum), the loss sum_t reduce_sum(act_t * c_t) of bench_train.py, Adagrad
(learning rate 0.1, accumulators from 0.1):

  V1  bench_train.py's fused step: enqueue -> RecvTPUEmbeddingActivations ->
      gradient -> SendTPUEmbeddingGradients (the engine applies Adagrad).
  V2  one tf.function, the ops TPUEmbeddingV2 runs for one chip
      (tensorflow/python/tpu/tpu_embedding_v3.py; docs/sparsecore_semantics.md
      §1, §2, §3, §5, §6): per table ConvertToListOfSparseCoreCooTensors,
      SortListOfSparseCoreCooTensors per SparseCore,
      ConvertToSparseCoreCsrWrappedCooTensor, XlaSparseDenseMatmulWithStaticBufferSize
      on the table variable, the gradient, then
      XlaSparseDenseMatmulGradWithAdagradAndStaticBufferSize on the table and
      accumulator variables: in place, as the stand-in SparseCore TPU runs
      TPUEmbeddingV2.apply_gradients' read -> op -> assign
      (tf_tpu_emb/tpu/embedding_v2.py seam 7: our ...InPlace op), or with
      --functional as TF wrote it (the op's outputs assigned back: a copy of
      every table and slot per step).

  JAX the same step written with jax-tpu-embedding 0.2.0 on CPU (tf_tpu_emb.jax),
      one device of --num-sc SparseCores: the package's preprocessing, then one
      jitted lookup + gradient + Adagrad update, the variables donated (in
      place); benchmarks/jax_side.py in .venv-jax (`make venv-jax jax-build`),
      a child process that times its own steps.  Left out where --jax-python
      does not run (default .venv-jax/bin/python).

Before timing, all run one step from the same values and must agree (the
V2 tables read back through the SparseCore layout of §5, JAX's through the
package's unsharding); a mismatch exits non-zero.  The steps alternate in
blocks (bench_lookup.run_alternating).  Reported: ms per step, samples/s,
the V2/V1 ratio (issue 29's target: <= 1.3x), the JAX/V2 ratio (issue 38's:
<= 1.3x), and the V2 step split into preprocessing and lookup+update.

    .venv/bin/python benchmarks/bench_sparsecore.py --quick
    .venv/bin/python benchmarks/bench_sparsecore.py --rows 1000000 --batch 1024
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_lookup as bl  # noqa: E402
import bench_train as bt  # noqa: E402
import numpy as np  # noqa: E402

NUM_SC = 4  # SparseCores per chip, as the V2 stand-in's chip (v5p / v6e)
QUICK = dict(rows=100_000, steps=20, warmup=3, blocks=4)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAX_PYTHON = os.path.join(ROOT, ".venv-jax", "bin", "python")
PAUSE = 0.2  # seconds before a block: the other process's threads go idle
FULL = dict(rows=1_000_000, steps=60, warmup=5, blocks=10)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--num-sc", type=int, default=NUM_SC, help="SparseCores per chip (4)")
    p.add_argument("--functional", action="store_true",
                   help="V2 updates as TF wrote them (outputs assigned back), not in place")
    p.add_argument("--jax-python", default=JAX_PYTHON,
                   help="the JAX venv's python (default %(default)s; 'none': no JAX side)")
    bl.add_workload_args(p)
    bl.add_timing_args(p, FULL, QUICK)
    bl.add_thread_args(p)
    bt.add_optimizer_args(p)
    bl.add_run_args(p)
    a = p.parse_args(argv)
    a.combiner, a.weighted = "sum", False
    a = bl.apply_preset(a, FULL, QUICK)
    if a.rows % a.num_sc or a.batch % a.num_sc:
        p.error("--rows and --batch must divide by --num-sc")
    return a


def sc_layout(values, num_sc):
    """Logical rows in the one-chip SparseCore layout of
    docs/sparsecore_semantics.md §5: id c is row (c % num_sc) * R + c // num_sc."""
    return np.concatenate([values[j::num_sc] for j in range(num_sc)])


def from_sc_layout(values, num_sc):
    r = len(values) // num_sc
    out = np.empty_like(values)
    for j in range(num_sc):
        out[j::num_sc] = values[j * r:(j + 1) * r]
    return out


class V2Side:
    """TPUEmbeddingV2's per-step ops for one chip on tf.Variable tables."""

    def __init__(self, tf, tf_tpu_emb, a, c, inputs):
        self.tf, self.a, self.inputs = tf, a, inputs
        s, raw, dim = a.num_sc, tf.raw_ops, a.dim
        per_sc = a.batch // s
        # Every id of a sample can land on one SparseCore: buffers sized for it.
        max_ids = a.batch * a.ids_per_sample
        self.tables = [tf.Variable(sc_layout(bl.table_values(a, t, dim), s), name="v2_%d" % t)
                       for t in range(a.tables)]
        self.accumulators = [tf.Variable(tf.fill([a.rows, dim], np.float32(a.initial_accumulator)),
                                         name="v2_acc_%d" % t) for t in range(a.tables)]
        lr = tf.constant(a.lr, tf.float32)

        def preprocess(t, splits, ids):
            name = "table_%d" % t
            lists = raw.ConvertToListOfSparseCoreCooTensors(
                indices_or_row_splits=splits, values=ids, weights=tf.constant(1.0),
                sample_count=a.batch, num_sc_per_chip=s, row_offset=0, col_offset=0,
                col_shift=0, num_sc_shards=s, stacked_table_sample_count=a.batch,
                combiner=a.combiner)
            rows, cols, gains = lists
            sorted_ = [raw.SortListOfSparseCoreCooTensors(
                row_ids_list=[rows[k]], col_ids_list=[cols[k]], gains_list=[gains[k]],
                sample_count_list=[per_sc], col_offset_list=[0], num_replica=1,
                table_vocab_size=a.rows, feature_width=dim, num_sc_per_chip=s,
                max_ids_per_sparse_core=max_ids, max_unique_ids_per_sparse_core=max_ids,
                table_name=name) for k in range(s)]
            out = raw.ConvertToSparseCoreCsrWrappedCooTensor(
                sorted_row_ids_list=[x[0] for x in sorted_],
                sorted_col_ids_list=[x[1] for x in sorted_],
                sorted_gains_list=[x[2] for x in sorted_],
                id_counts_list=[x[3] for x in sorted_], splits=tf.constant(0, tf.int64),
                sample_count_per_sc=per_sc, num_replica=1, max_minibatches_per_sc=1,
                max_ids_per_chip_per_sample=a.ids_per_sample * s, table_vocab_size=a.rows,
                feature_width=dim, table_name=name, allow_id_dropping=False)
            return out[:4], out[6]

        in_place = tf_tpu_emb.ops.raw_op(
            "XlaSparseDenseMatmulGradWithAdagradAndStaticBufferSizeInPlace")
        buffers = dict(max_ids_per_sparse_core=max_ids, max_unique_ids_per_sparse_core=max_ids,
                       num_sparsecores_per_device=s)

        def lookup_update(t, csr, m):
            table, acc = self.tables[t], self.accumulators[t]
            rp, sid, tid, gn = csr
            act = raw.XlaSparseDenseMatmulWithStaticBufferSize(
                row_pointers=rp, sorted_sample_ids=sid, sorted_token_ids=tid, sorted_gains=gn,
                embedding_table=table.read_value(), num_minibatches_per_physical_sparse_core=m,
                input_size=a.batch, quantization_config_low=0.0, quantization_config_high=0.0,
                quantization_config_num_buckets=0, table_name="table_%d" % t, **buffers)
            with tf.GradientTape() as tape:
                tape.watch(act)
                loss = tf.reduce_sum(act * c[t])
            # The update after the lookup, as in a model whose gradient needs
            # the activations (this loss's does not: without the edge the
            # in-place update could run first and copy the table the lookup
            # still reads, TF's copy-on-write rule).
            with tf.control_dependencies([act]):
                grad = tf.identity(tape.gradient(loss, act))
            if not a.functional:
                in_place(row_pointers=rp, sorted_sample_ids=sid, sorted_token_ids=tid,
                         sorted_gains=gn, activation_gradients=grad, learning_rate=lr,
                         embedding_table=table.handle, accumulator=acc.handle,
                         num_minibatches_per_physical_sparse_core=m,
                         table_name="table_%d" % t, **buffers)
                return loss
            new_table, new_acc = raw.XlaSparseDenseMatmulGradWithAdagradAndStaticBufferSize(
                row_pointers=rp, sorted_sample_ids=sid, sorted_token_ids=tid, sorted_gains=gn,
                activation_gradients=grad, learning_rate=lr, embedding_table=table.read_value(),
                accumulator=acc.read_value(), num_minibatches_per_physical_sparse_core=m,
                table_name="table_%d" % t, **buffers)
            table.assign(new_table)
            acc.assign(new_acc)
            return loss

        def step(splits, ids):
            losses = []
            for t in range(a.tables):
                csr, m = preprocess(t, splits, ids[t])
                losses.append(lookup_update(t, csr, m))
            return tf.add_n(losses)

        def preprocess_only(splits, ids):
            return [preprocess(t, splits, ids[t])[1] for t in range(a.tables)]

        self.step_fn = tf.function(step)
        self.preprocess_fn = tf.function(preprocess_only)
        splits = tf.constant(np.arange(0, a.batch * a.ids_per_sample + 1, a.ids_per_sample,
                                       dtype=np.int32))
        self.args = [(splits, [tf.cast(x, tf.int32) for x in inp["ids"]]) for inp in inputs]

    def step(self, b):
        return self.step_fn(*self.args[b])

    def preprocess(self, b):
        return self.preprocess_fn(*self.args[b])

    def table(self, t):
        s = self.a.num_sc
        return (from_sc_layout(self.tables[t].numpy(), s),
                from_sc_layout(self.accumulators[t].numpy(), s))


class JaxProcess:
    """benchmarks/jax_side.py in the JAX venv, one JSON command a line."""

    def __init__(self, python, a, inputs, tmp):
        ids = np.stack([np.stack([x.numpy() for x in inp["ids"]]) for inp in inputs])
        self.ids_path = os.path.join(tmp, "ids.npy")
        np.save(self.ids_path, ids)
        env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
        self.proc = subprocess.Popen(
            [python, os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_side.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.versions = self.call(cmd="versions")
        self.call(cmd="setup", ids=self.ids_path, tables=a.tables, rows=a.rows, dim=a.dim,
                  batch=a.batch, ids_per_sample=a.ids_per_sample, num_sc=a.num_sc,
                  seed=a.seed, lr=a.lr, initial_accumulator=a.initial_accumulator)
        self.tmp = tmp

    def call(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the JAX process exited (status %s)" % self.proc.wait())
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def tables(self, batch):
        out = os.path.join(self.tmp, "jax_step.npz")
        self.call(cmd="step_tables", batch=batch, out=out)
        with np.load(out) as f:
            return {t: (f["t%d/p" % t], f["t%d/a" % t]) for t in range(len(f.files) // 2)}

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


def check_step(v1, v2, a, jax_side=None):
    v1.step(0).numpy()
    v2.step(0).numpy()
    others = [("V2", v2.table)]
    if jax_side is not None:
        jax_tables = jax_side.tables(0)
        others.append(("JAX", jax_tables.__getitem__))
    worst = 0.0
    for (name, table), t in [(o, t) for o in others for t in range(a.tables)]:
        (p1, a1), (p2, a2) = v1.table(t), table(t)
        # The two sum a hot row's gradients in different orders (float32):
        # relative to the largest value of the array, as bench_train.py's check.
        worst = max(worst, float(np.max(np.abs(p1 - p2)) / np.abs(p1).max()),
                    float(np.max(np.abs(a1 - a2)) / np.abs(a1).max()))
        if worst > 1e-5:
            print("  MISMATCH in %s table %d after one step: max |diff| / max |value| %.3g"
                  % (name, t, worst))
            return False
    print("  one step from the same values: V1, %s tables and accumulators agree "
          "(max |diff| / max |value| %.2g)" % (" and ".join(n for n, _ in others), worst))
    return True


def main(argv=None):
    a = parse_args(argv)
    tf, tf_tpu_emb = bl.setup_tf(a)
    a.dims = [a.dim]
    print("=" * 78)
    print("SparseCore (TPUEmbeddingV2 ops, one chip of %d SparseCores, update %s) vs the V1 "
          "engine: one Adagrad step" % (a.num_sc, "functional" if a.functional else "in place"))
    print("=" * 78)
    bl.print_environment(tf, tf_tpu_emb, a)
    print("workload        %d tables x %s rows x dim %d, batch %d, %d ids/sample, Zipf(%.2f)"
          % (a.tables, format(a.rows, ","), a.dim, a.batch, a.ids_per_sample, a.zipf))
    inputs, _ = bl.prepare_inputs(tf, a)
    cfg = bl.config_proto(a, a.dim, bt.adagrad_parameters(a))
    c = bt.loss_weights(tf, a, a.dim)
    tmp = tempfile.mkdtemp(prefix="bench_sparsecore_")
    jax_side = None
    if a.jax_python != "none" and os.path.exists(a.jax_python):
        jax_side = JaxProcess(a.jax_python, a, inputs, tmp)
        print("JAX             jax %(jax)s, jax-tpu-embedding %(jax_tpu_embedding)s "
              "(benchmarks/jax_side.py, one CPU device)" % jax_side.versions)
    else:
        print("JAX             not run (no %s: make venv-jax jax-build)" % a.jax_python)
    tf.raw_ops.ConfigureTPUEmbedding(config=cfg)
    try:
        v1 = bt.Ours(tf, a, cfg, c, inputs)
        v1.load(a.dim)
        v2 = V2Side(tf, tf_tpu_emb, a, c, inputs)
        if not check_step(v1, v2, a, jax_side):
            return 1
        nb = a.num_batches
        sides = [("V1", lambda i: v1.step(i % nb).numpy()),
                 ("V2", lambda i: v2.step(i % nb).numpy()),
                 ("V2 preprocessing", lambda i: [x.numpy() for x in v2.preprocess(i % nb)])]
        own, own_prep = [], []  # the JAX process times its own steps (no pipe in them)

        def jax_step(i):
            answer = jax_side.call(cmd="time", n=1)
            own.extend(answer["times"])
            own_prep.extend(answer["preprocessing"])

        if jax_side is not None:
            sides.append(("JAX", jax_step))
        bl.run_alternating(sides, 2 * a.warmup, 2, PAUSE if jax_side else 0.0)
        own.clear()
        own_prep.clear()
        times = bl.run_alternating(sides, a.steps, a.blocks, PAUSE if jax_side else 0.0)
        if jax_side is not None:
            times["JAX"] = own
            times["JAX preprocessing"] = own_prep
    finally:
        tf_tpu_emb.ops.shutdown_tpu_embedding()
        if jax_side is not None:
            jax_side.close()
    ms = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    print("\n  %-18s %10s %12s" % ("side", "ms/step", "samples/s"))
    for k in [k for k in ("V1", "V2", "V2 preprocessing", "JAX", "JAX preprocessing") if k in ms]:
        print("  %-18s %10.2f %12s" % (k, ms[k], format(int(a.batch / ms[k] * 1e3), ",")))
    print("\n  V2 / V1 step time: %.2fx (target <= 1.3x); V2 preprocessing %.0f%% of its step"
          % (ms["V2"] / ms["V1"], 100 * ms["V2 preprocessing"] / ms["V2"]))
    if "JAX" in ms:
        print("  JAX / V2 step time: %.2fx (target <= 1.3x); JAX / V1 %.2fx; JAX preprocessing"
              " (the package's C++) %.0f%% of its step"
              % (ms["JAX"] / ms["V2"], ms["JAX"] / ms["V1"],
                 100 * ms["JAX preprocessing"] / ms["JAX"]))
    print("  loadavg (end) %s" % bl.read_first_line("/proc/loadavg"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
