#!/usr/bin/env python3
"""Peer benchmark: tf_tpu_emb's engine vs FBGEMM's table-batched embedding
bags and torch.nn.EmbeddingBag, forward and training, interleaved.

Ours runs in this process (the project's .venv: TensorFlow + tf_tpu_emb).
The peers run in their own virtualenv (`make bench-peers` creates
.venv-peers with torch CPU + fbgemm-gpu-cpu) as ONE child process,
benchmarks/peer_side.py, driven over a pipe.  The ids are generated once here
(bench_lookup's bounded-Zipf workload, --seed) and handed to the child in a
.npy file; both sides build their tables from the same generator
(bench_lookup.table_values), so they look up the same rows.  Only one side
runs at a time: blocks alternate ours, peer, peer, ours, ...

Per dim, per mode:
  forward   ours: enqueue + Recv (sum)   peers: FBGEMM TBE forward (no grad),
            torch EmbeddingBag(sum) per table.  Batch 0's activations must be
            equal on every side (np.allclose rtol = atol = 1e-4; atol 0.125
            with TF_TPU_EMB_STORAGE=bf16) or the run stops with MISMATCH.
  sgd       ours: enqueue + Recv + loss grad + Send, SGD       peer: FBGEMM EXACT_SGD
  adagrad   ours: the same, exact element-wise Adagrad (TPU math)
            peers: FBGEMM EXACT_ADAGRAD and EXACT_ROWWISE_ADAGRAD (cheaper,
            one accumulator per row: a reference, not the same math)
  adam      ours: lazy Adam (TPU default)                      peer: FBGEMM ADAM
The loss gradient is the same fixed N(0,1) tensor on both sides; learning
rate 0.1, Adagrad accumulators start at 0.1 with epsilon 0, Adam
beta1 0.9, beta2 0.999, epsilon 1e-8.

Printed per row: samples/s (batch / median step), ratio ours/peer, and GB/s
of unique-row traffic: distinct rows per step x row bytes x (1 for the
forward; forward read + parameters and slots read and written for
training), next to the machine's random-gather roofline measured by
gather_roofline.c (compiled here with cc) at the same thread count.

    make bench-peers                                     # the full run, one command
    .venv/bin/python benchmarks/bench_peers.py --quick   # smoke (100,000 rows)
    .venv/bin/python benchmarks/bench_peers.py --dims 64 --modes forward,adagrad
    .venv/bin/python benchmarks/bench_peers.py --no-peers --json out.json  # ours only
"""
import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import bench_lookup as bl
import bench_train as bt
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
QUICK = dict(rows=100_000, steps=20, warmup=3, blocks=4)
FULL = dict(rows=1_000_000, steps=60, warmup=5, blocks=12)
MODES = ("forward", "sgd", "adagrad", "adam")
PEERS = {"forward": ("fbgemm:forward", "torch:forward"), "sgd": ("fbgemm:sgd",),
         "adagrad": ("fbgemm:adagrad", "fbgemm:rowwise_adagrad"), "adam": ("fbgemm:adam",)}
TITLES = {"fbgemm:forward": "FBGEMM TBE forward", "torch:forward": "torch EmbeddingBag",
          "fbgemm:sgd": "FBGEMM EXACT_SGD", "fbgemm:adagrad": "FBGEMM EXACT_ADAGRAD",
          "fbgemm:rowwise_adagrad": "FBGEMM EXACT_ROWWISE_ADAGRAD (other math)",
          "fbgemm:adam": "FBGEMM ADAM"}
# The targets (dim 64, its workload): ours / peer.
TARGETS = {("forward", "best"): 1.2, ("adagrad", "fbgemm:adagrad"): 4.0,
           ("adagrad", "fbgemm:rowwise_adagrad"): 1.2, ("sgd", "fbgemm:sgd"): 1.3}
SLOTS = {"forward": None, "sgd": 0, "adagrad": 1, "adam": 2}
# Seconds between blocks: the side that just ran (TF's Eigen pool, torch's
# OpenMP team) spins a while after its last step and would steal the 2
# cores from the next side's first steps.
PAUSE = 0.3


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", default="16,64,128", help="comma list (default 16,64,128)")
    p.add_argument("--modes", default=",".join(MODES), help="comma list of " + "/".join(MODES))
    bl.add_workload_args(p)
    bl.add_timing_args(p, FULL, QUICK)
    bl.add_thread_args(p)
    p.add_argument("--peer-python", default=os.path.join(HERE, "..", ".venv-peers", "bin",
                                                         "python"),
                   help="python of the peers' virtualenv (default .venv-peers)")
    p.add_argument("--steps-per-call", type=int, default=1, metavar="K",
                   help="ours runs K steps per tf.function call (as a TPU program's "
                        "steps_per_execution does), each timed as a K-th of the call; "
                        "default 1: one Python call per step, as the peers")
    p.add_argument("--no-peers", action="store_true", help="time ours only")
    p.add_argument("--no-roofline", action="store_true")
    p.add_argument("--json", help="also write the results to this file")
    bt.add_optimizer_args(p)
    bl.add_run_args(p)
    a = p.parse_args(argv)
    a.dims = [int(d) for d in a.dims.split(",") if d]
    a.modes = bl.comma_list(p, a.modes, MODES, "mode")
    a.weighted, a.combiner = False, "sum"
    return bl.apply_preset(a, FULL, QUICK)


# ------------------------------------------------------------------ roofline

def roofline(a, dims, tmp):
    """{dim: (gather GB/s, read+write GB/s)} of gather_roofline.c over a
    table of tables x rows x dim floats, at a.threads threads."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or a.no_roofline:
        return {}
    exe = os.path.join(tmp, "gather_roofline")
    subprocess.run([cc, "-O2", "-march=native", "-pthread", "-o", exe,
                    os.path.join(HERE, "gather_roofline.c")], check=True)
    out = {}
    for dim in dims:
        line = subprocess.run([exe, str(a.tables * a.rows), str(dim), str(a.threads), "1.5"],
                              check=True, capture_output=True, text=True).stdout
        kv = dict(x.split("=") for x in line.split())
        out[dim] = (float(kv["gather_gbps"]), float(kv["update_gbps"]))
    return out


# ------------------------------------------------------------------- peers

class PeerProcess:
    """The peers' child process (peer_side.py in the peers' virtualenv)."""

    def __init__(self, python, threads):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.proc = subprocess.Popen([python, os.path.join(HERE, "peer_side.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)

    def call(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the peer process exited (status %s)" % self.proc.wait())
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)


# -------------------------------------------------------------------- ours

def optimizer_fill(a, mode):
    def fill(op):
        if mode == "adagrad":
            op.adagrad.SetInParent()
        elif mode == "adam":
            op.adam.beta1, op.adam.beta2, op.adam.epsilon = 0.9, 0.999, 1e-8
        else:
            op.stochastic_gradient_descent.SetInParent()
        op.learning_rate.constant = a.lr
    return fill


def load_ours(tf, a, mode, dim):
    for t in range(a.tables):
        vals = bl.table_values(a, t, dim)
        kw = dict(table_id=t, num_shards=1, shard_id=0)
        if mode == "adagrad":
            tf.raw_ops.LoadTPUEmbeddingAdagradParameters(
                parameters=vals, accumulators=np.full_like(vals, a.initial_accumulator), **kw)
        elif mode == "adam":
            z = np.zeros_like(vals)
            tf.raw_ops.LoadTPUEmbeddingADAMParameters(parameters=vals, momenta=z,
                                                      velocities=z, **kw)
        else:
            tf.raw_ops.LoadTPUEmbeddingStochasticGradientDescentParameters(parameters=vals, **kw)
        del vals
    gc.collect()


def ours_step_fn(tf, a, cfg, mode, dim):
    """fn(list of the inputs of k batches) -> a tensor to materialise: k
    forwards (enqueue + Recv) or k fused training steps (bench_train.Ours)
    in one tf.function call.  TF's automatic control dependencies run the
    engine's stateful ops in program order, so step j + 1 follows step j."""
    if mode != "forward":
        a.combiner = "sum"
        ours = bt.Ours(tf, a, cfg, bt.loss_weights(tf, a, dim), None)
        one = ours.step_body
    else:
        ntab = a.tables

        def one(indices, ids, weights):
            enqueued = bl.ours_enqueue(tf, ntab, "sum", indices, ids, weights)
            with tf.control_dependencies([enqueued] if enqueued is not None else []):
                return tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=ntab, config=cfg)[0]

    @tf.function
    def steps(batches):
        return [one(*x) for x in batches][-1]
    return lambda xs: steps([(x["indices"], x["ids"], x["weights"]) for x in xs])


def forward_atol():
    """Tolerance of the batch-0 activation check.  With bfloat16 storage
    (TF_TPU_EMB_STORAGE, README "Reduced-precision storage") ours' rows are
    the peers' float32 rows rounded to nearest even (relative error <= 2^-9):
    a bag of 10 N(0,1) rows (|x| < 6) then differs by less than 10 * 6 * 2^-9
    = 0.117, while one wrong row differs by O(1)."""
    return 0.125 if "bf16" in os.environ.get("TF_TPU_EMB_STORAGE", "") else 1e-4


def forward0(tf, a, cfg, inputs):
    x = inputs[0]
    bl.ours_enqueue(tf, a.tables, "sum", x["indices"], x["ids"], x["weights"])
    acts = tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=a.tables, config=cfg)
    return np.concatenate([t.numpy() for t in acts], axis=1)


# --------------------------------------------------------------- measuring

def row_bytes_per_step(a, mode, dim, distinct, peer_mode=None):
    """Unique-row traffic of one step (mean over the batches): the forward
    reads each distinct row once; training also reads and writes its
    parameters and slots (row-wise Adagrad: one float of slot per row)."""
    u = statistics.fmean(sum(d) for d in distinct)
    row = dim * 4
    if mode == "forward":
        return u * row
    if peer_mode == "rowwise_adagrad":
        return u * (row + 2 * (row + 4))
    return u * row * (1 + 2 * (1 + SLOTS[mode]))


def summary(times, batch, nbytes):
    med = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [med, med, med]
    return dict(ms=1e3 * med, spread_ms=1e3 * (q[2] - q[0]), sps=batch / med,
                gbs=nbytes / med / 1e9)


def run_mode(tf, tf_tpu_emb, a, dim, mode, inputs, distinct, peer, results, ids_path, tmp):
    cfg = bl.config_proto(a, dim, optimizer_fill(a, mode))
    tf.raw_ops.ConfigureTPUEmbedding(config=cfg)
    try:
        load_ours(tf, a, mode, dim)
        step = ours_step_fn(tf, a, cfg, mode, dim)
        nb = a.num_batches
        k = a.steps_per_call
        ours_side = ("ours", lambda i: step([inputs[(i * k + j) % nb] for j in range(k)]).numpy(),
                     k)
        ours_bytes = row_bytes_per_step(a, mode, dim, distinct)
        peers = [] if peer is None else PEERS[mode]
        if mode == "forward" and peers:
            reference = forward0(tf, a, cfg, inputs)
        windows = []
        for name in peers:
            kind, peer_mode = name.split(":")
            try:
                peer.call(cmd="setup", peer=kind, mode=peer_mode, ids=ids_path, dim=dim,
                          tables=a.tables, rows=a.rows, batch=a.batch,
                          ids_per_sample=a.ids_per_sample, seed=a.seed, lr=a.lr,
                          eps=1e-8 if peer_mode == "adam" else 0.0,
                          initial_accumulator=a.initial_accumulator, threads=a.threads)
            except RuntimeError as e:
                print("  %-44s not run: %s" % (TITLES[name], e))
                windows.append(dict(peer=name, error=str(e)))
                continue
            if mode == "forward":
                out = os.path.join(tmp, "peer_forward0.npy")
                peer.call(cmd="forward0", out=out)
                theirs = np.load(out)
                if not np.allclose(reference, theirs, rtol=1e-4, atol=forward_atol()):
                    print("MISMATCH: %s's activations differ from ours (max |diff| %g)"
                          % (TITLES[name], np.abs(reference - theirs).max()))
                    raise SystemExit(1)
            # The peer times its own steps (in the child); the parent's wall
            # clock around a call would add the pipe.  So the child's times
            # replace the parent's for the peer.
            own = []
            peer_side = (name, lambda i: own.extend(peer.call(cmd="time", n=1)["times"]))
            sides = [ours_side, peer_side]
            bl.run_alternating(sides, a.warmup, 1, PAUSE)
            own.clear()
            t = bl.run_alternating(sides, a.steps, a.blocks, PAUSE)
            pb = row_bytes_per_step(a, mode, dim, distinct, peer_mode)
            w = dict(peer=name, ours=summary(t["ours"], a.batch, ours_bytes),
                     theirs=summary(own, a.batch, pb))
            w["ratio"] = w["theirs"]["ms"] / w["ours"]["ms"]
            windows.append(w)
            peer.call(cmd="free")
        if not any("ours" in w for w in windows):
            # No peers, or none could run this mode (FBGEMM has no CPU Adam).
            bl.run_alternating([ours_side], a.warmup, 1)
            t = bl.run_alternating([ours_side], a.steps, a.blocks)
            windows.insert(0, dict(peer=None, ours=summary(t["ours"], a.batch, ours_bytes)))
        for w in windows:
            if "ours" in w:
                line = "  %-8s ours %9.0f samples/s (%.2f ms, IQR %.2f) %6.2f GB/s" % (
                    mode, w["ours"]["sps"], w["ours"]["ms"], w["ours"]["spread_ms"],
                    w["ours"]["gbs"])
                if w["peer"]:
                    line += " | %s %9.0f samples/s %6.2f GB/s | ours/peer %.2fx" % (
                        TITLES[w["peer"]], w["theirs"]["sps"], w["theirs"]["gbs"], w["ratio"])
                print(line)
        results.append(dict(dim=dim, mode=mode, windows=windows))
    finally:
        tf_tpu_emb.ops.shutdown_tpu_embedding()
        gc.collect()


def target_applies(a, dim):
    return (dim == 64 and a.threads == 2 and a.tables == 8 and a.rows == 1_000_000
            and a.batch == 4096 and a.ids_per_sample == 10)


def print_summary(a, results, roof):
    print("\n" + "=" * 78)
    print("Summary: samples/s = batch / median step; GB/s = unique-row traffic (distinct "
          "rows x row bytes: forward 1 read; training forward read + parameters and slots "
          "read and written); ours/peer from the same interleaved window")
    print("| dim | mode | ours samples/s | ours GB/s | peer | peer samples/s | peer GB/s "
          "| ours/peer | target |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        best = None
        if r["mode"] == "forward":
            ratios = [w["ratio"] for w in r["windows"] if "ratio" in w]
            best = min(ratios) if ratios else None
        for w in r["windows"]:
            if "ours" not in w:
                print("| %d | %s | | | %s | not run: %s | | | |"
                      % (r["dim"], r["mode"], TITLES[w["peer"]], w["error"]))
                continue
            if w["peer"] is None:
                print("| %d | %s | %.0f | %.2f | – | | | | |"
                      % (r["dim"], r["mode"], w["ours"]["sps"], w["ours"]["gbs"]))
                continue
            key = (r["mode"], "best") if r["mode"] == "forward" else (r["mode"], w["peer"])
            target = ""
            if key in TARGETS:
                ratio = best if r["mode"] == "forward" else w["ratio"]
                if target_applies(a, r["dim"]):
                    target = ">= %gx %s" % (TARGETS[key],
                                            "met" if ratio >= TARGETS[key] else "MISSED")
                else:
                    target = "(>= %gx, issue workload only)" % TARGETS[key]
            print("| %d | %s | %.0f | %.2f | %s | %.0f | %.2f | %.2fx | %s |"
                  % (r["dim"], r["mode"], w["ours"]["sps"], w["ours"]["gbs"], TITLES[w["peer"]],
                     w["theirs"]["sps"], w["theirs"]["gbs"], w["ratio"], target))
    if roof:
        print("\nroofline (gather_roofline.c, %d threads, %s floats): " % (
            a.threads, format(a.tables * a.rows, ",") + " rows x dim") + "; ".join(
            "dim %d: gather %.2f GB/s, read+write %.2f GB/s" % (d, g, u)
            for d, (g, u) in sorted(roof.items())))
    print("peak VmHWM %.2f GB (this process)" % bt.proc_status("VmHWM"))
    print("loadavg (end) %s" % bl.read_first_line("/proc/loadavg"))


def main(argv=None):
    a = parse_args(argv)
    tf, tf_tpu_emb = bl.setup_tf(a)
    print("=" * 78)
    print("tf_tpu_emb peer benchmark: ours vs FBGEMM TBE / torch EmbeddingBag, interleaved")
    print("=" * 78)
    bl.print_environment(tf, tf_tpu_emb, a)
    print("storage         ours: %s (TF_TPU_EMB_STORAGE); the peers: float32"
          % (os.environ.get("TF_TPU_EMB_STORAGE") or "float32"))
    ids_per_step = a.tables * a.batch * a.ids_per_sample
    print("workload        %d tables x %s rows, batch %d, %d ids/sample (%s ids/step), "
          "Zipf(%.2f), unweighted sum, dims %s, modes %s"
          % (a.tables, format(a.rows, ","), a.batch, a.ids_per_sample, format(ids_per_step, ","),
             a.zipf, ",".join(map(str, a.dims)), ",".join(a.modes)))
    print("timing          %d warm-up + %d timed steps per side in %d alternating blocks; "
          "ours %d step(s) per tf.function call, the peers 1 per Python call"
          % (a.warmup, a.steps, a.blocks, a.steps_per_call))
    tmp = tempfile.mkdtemp(prefix="bench_peers_")
    peer = None
    try:
        indices_np, batches_np = bl.make_batches(a)
        ids_path = os.path.join(tmp, "ids.npy")
        np.save(ids_path, np.stack([np.stack(ids) for ids, _ in batches_np]))
        distinct = [[len(np.unique(ids)) for ids in ids_l] for ids_l, _ in batches_np]
        inputs, _ = bl.prepare_inputs(tf, a)
        if not a.no_peers:
            if not os.path.exists(a.peer_python):
                print("peers           %s not found: run `make bench-peers` (or pass "
                      "--peer-python / --no-peers)" % a.peer_python)
                return 2
            peer = PeerProcess(a.peer_python, a.threads)
            v = peer.call(cmd="versions")
            print("peers           torch %s, fbgemm_gpu %s (%s)"
                  % (v["torch"], v["fbgemm_gpu"], a.peer_python))
        roof = roofline(a, a.dims, tmp)
        results = []
        for dim in a.dims:
            print("\n--- dim %d " % dim + "-" * 66)
            if dim in roof:
                print("  roofline: random gather %.2f GB/s, read+write %.2f GB/s"
                      % roof[dim])
            for mode in a.modes:
                run_mode(tf, tf_tpu_emb, a, dim, mode, inputs, distinct, peer, results,
                         ids_path, tmp)
        print_summary(a, results, roof)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(threads=a.threads, rows=a.rows, results=results,
                               roofline={str(k): v for k, v in roof.items()}), f, indent=1)
    finally:
        if peer is not None:
            peer.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
