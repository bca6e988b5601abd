"""Steady-state step loop of ours alone: the harness for profiling and for
comparing two builds (benchmarks/RESULTS.md, "Issue 11: portable vs native
build" and "the forward profile").

Configures the peer workload (8 tables x 1M rows, dim 64, batch 4096, 10
Zipf(1.05) ids a sample; `--quick`: 100,000 rows), loads random tables, and
runs `--steps` forward (enqueue + Recv) or training (enqueue, Recv, loss
gradient, Send) steps back to back, cycling over the peer benchmarks'
batches (`bench_lookup.prepare_inputs`: Zipf ranks scattered by a
permutation).  Prints wall and
process-CPU milliseconds per step.  `PERF: <pid>` is printed just before the
timed loop, so `perf record -p <pid>` can attach to the loop only.

Compare two builds by running this script with `PYTHONPATH` pointing at
each built tree in alternation.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["forward", "sgd", "adagrad"], default="forward")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="100,000 rows per table")
    p.add_argument("--steps-per-call", type=int, default=1, metavar="K",
                   help="K steps per tf.function call (bench_peers.py --steps-per-call)")
    args = p.parse_args(argv)

    import tensorflow as tf
    import tf_tpu_emb
    import bench_lookup as bl
    import bench_train as bt
    tf_tpu_emb.load_library()

    a = bl.parse_args(["--dims", str(args.dim), "--combiners", "sum"]
                      + (["--quick"] if args.quick else []))
    a.combiner, a.lr, a.initial_accumulator = "sum", 0.1, 0.1
    fill = bt.adagrad_parameters(a) if args.mode == "adagrad" else bl.sgd_parameters
    cfg = bl.config_proto(a, args.dim, fill)
    tf.raw_ops.ConfigureTPUEmbedding(config=cfg)
    try:
        rng = np.random.default_rng(0)
        for t in range(a.tables):
            vals = rng.standard_normal((a.rows, args.dim), dtype=np.float32)
            kw = dict(table_id=t, num_shards=1, shard_id=0)
            if args.mode == "adagrad":
                tf.raw_ops.LoadTPUEmbeddingAdagradParameters(
                    parameters=vals, accumulators=np.full_like(vals, 0.1), **kw)
            else:
                tf.raw_ops.LoadTPUEmbeddingStochasticGradientDescentParameters(
                    parameters=vals, **kw)
        # The peer benchmarks' batches (bench_lookup.prepare_inputs): Zipf
        # ranks scattered over the table by a permutation, so hot rows are not
        # neighbours.
        inputs, _ = bl.prepare_inputs(tf, a)
        batches = [(x["indices"], x["ids"], x["weights"]) for x in inputs]

        if args.mode == "forward":
            def one(indices, ids, weights):
                e = bl.ours_enqueue(tf, a.tables, "sum", indices, ids, weights)
                with tf.control_dependencies([e] if e is not None else []):
                    return tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=a.tables,
                                                                  config=cfg)[0]
        else:
            one = bt.Ours(tf, a, cfg, bt.loss_weights(tf, a, args.dim), None).step_body
        k = args.steps_per_call

        @tf.function
        def steps(xs):
            return [one(*x) for x in xs][-1]

        def call(i):  # steps i*k .. i*k + k - 1
            steps([batches[(i * k + j) % len(batches)] for j in range(k)]).numpy()

        calls = -(-args.steps // k)
        for i in range(-(-args.warmup // k)):
            call(i)
        print("PERF: %d" % os.getpid(), flush=True)
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(calls):
            call(i)
        wall = (time.perf_counter() - t0) / (calls * k) * 1e3
        cpu = (time.process_time() - c0) / (calls * k) * 1e3
        print("%s dim %d, %d x %d rows: %.2f ms/step, %.2f CPU ms/step, %.0f samples/s"
              % (args.mode, args.dim, a.tables, a.rows, wall, cpu, a.batch / wall * 1e3))
    finally:
        tf_tpu_emb.ops.shutdown_tpu_embedding()


if __name__ == "__main__":
    main()
