#!/usr/bin/env python3
"""Engine memory: resident set size of the engine against the bytes of its
tables + optimizer slots (target <= 1.1x).

The process first imports TF, loads the op library, builds the input batches
and runs one tiny configure/step/shutdown so that TF's kernels, thread pools
and allocator caches exist: its VmRSS then is the baseline.  Then it
configures the engine for the workload (bench_lookup's flags), runs --steps
training steps (enqueue + Recv + gradient + Send, bench_peers' step) and reads
VmRSS again.  engine RSS = VmRSS - baseline, and it is printed after
configure and after the steps, next to tables + slots =
tables x rows x dim x 4 B x (1 + slots), and their ratio.

    .venv/bin/python benchmarks/bench_memory.py                  # 8 x 1M x 64, Adagrad
    .venv/bin/python benchmarks/bench_memory.py --optimizer adam --dim 128
"""
import argparse
import gc
import sys

import bench_lookup as bl
import bench_peers as bp
import bench_train as bt

TARGET = 1.1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--optimizer", default="adagrad", choices=("sgd", "adagrad", "adam"))
    bl.add_workload_args(p)
    bl.add_thread_args(p)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--num-batches", type=int, default=4)
    bt.add_optimizer_args(p)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args(argv)
    if a.rows is None:
        a.rows = 1_000_000
    a.weighted, a.combiner, a.quick = False, "sum", False
    return a


def rss_gb():
    return bt.proc_status("VmRSS")


def run_steps(tf, a, steps, inputs):
    """Configures the engine, runs `steps` training steps; returns (VmRSS
    after configure, after the steps) and leaves the engine configured."""
    cfg = bl.config_proto(a, a.dim, bp.optimizer_fill(a, a.optimizer))
    tf.raw_ops.ConfigureTPUEmbedding(config=cfg)
    configured = rss_gb()
    step = bp.ours_step_fn(tf, a, cfg, a.optimizer, a.dim)
    for i in range(steps):
        step(inputs[i % len(inputs)]).numpy()
    gc.collect()
    return configured, rss_gb()


def main(argv=None):
    a = parse_args(argv)
    tf, tf_tpu_emb = bl.setup_tf(a)
    print("tf_tpu_emb engine memory: VmRSS of the engine vs tables + slots")
    bl.print_environment(tf, tf_tpu_emb, a)
    inputs, _ = bl.prepare_inputs(tf, a)
    # Warm-up: the same program for two steps, then shut down (the tables
    # are separate mmap'd blocks: freeing them returns them to the system).
    run_steps(tf, a, 2, inputs)
    tf_tpu_emb.ops.shutdown_tpu_embedding()
    gc.collect()
    baseline = rss_gb()
    slots = bp.SLOTS[a.optimizer]
    state_gb = a.tables * a.rows * a.dim * 4 * (1 + slots) / 1e9
    configured, stepped = run_steps(tf, a, a.steps, inputs)
    print("workload        %d tables x %s rows x dim %d, %s (%d slot%s), batch %d, "
          "%d ids/sample, %d steps"
          % (a.tables, format(a.rows, ","), a.dim, a.optimizer, slots, "" if slots == 1 else "s",
             a.batch, a.ids_per_sample, a.steps))
    print("baseline VmRSS  %.3f GB (TF, library, inputs, one warm-up engine shut down)" % baseline)
    print("| stage | engine RSS GB | tables + slots GB | ratio | target |")
    print("|---|---|---|---|---|")
    for stage, rss in (("after configure", configured), ("after %d steps" % a.steps, stepped)):
        ratio = (rss - baseline) / state_gb
        print("| %s | %.3f | %.3f | %.3fx | <= %.1fx %s |"
              % (stage, rss - baseline, state_gb, ratio, TARGET,
                 "met" if ratio <= TARGET else "MISSED"))
    print("peak VmHWM %.3f GB" % bt.proc_status("VmHWM"))
    tf_tpu_emb.ops.shutdown_tpu_embedding()
    return 0


if __name__ == "__main__":
    sys.exit(main())
