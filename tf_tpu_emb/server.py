"""One embedding host: ``python -m tf_tpu_emb.server``.

An embedding host is a task of TensorFlow's distributed runtime (a
``tf.distribute.Server``, gRPC) that has tf_tpu_emb's kernels: the engine of a
table shard lives in the host's process, and clients place the embedding ops on
its devices (``/job:embedding/replica:0/task:K/device:CPU:R``, one CPU device per
replica).  The library must be loaded before the server starts, otherwise the
task has no kernels for the ops and every op placed there fails.

usage:

    python -m tf_tpu_emb.server --cluster HOST:PORT,HOST:PORT --task 0
    python -m tf_tpu_emb.server --cluster '{"embedding": ["a:2222", "b:2222"]}' --task 1 \\
        --replicas 2 --lifetime-seconds 3600 --exit-with-parent

``--cluster`` is a JSON cluster spec (``{"job": ["host:port", ...], ...}``) or a
comma-separated list of the embedding job's addresses.  Without ``--cluster``,
``--job`` or ``--task`` the values come from ``TF_CONFIG``
(``{"cluster": {...}, "task": {"type": "embedding", "index": K}}``); flags win.

When serving, the host prints one line on stdout:

    tf_tpu_emb.server ready job=embedding task=K address=HOST:PORT devices=N

and then serves until SIGTERM or SIGINT (exit status 0), until
``--lifetime-seconds`` have passed (exit status 0), or -- with
``--exit-with-parent`` -- until the process that started it has gone
(exit status 0).  Bad arguments exit with status 2 and a message on stderr.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

READY_PREFIX = "tf_tpu_emb.server ready"
DEFAULT_JOB = "embedding"
_POLL_S = 0.5  # how often the serving loop looks at the parent and the clock


def parse_cluster(text):
    """A cluster spec dict from ``--cluster``: JSON, or ``host:port,...``
    (the addresses of the job named by ``--job``, filled in by the caller)."""
    text = text.strip()
    if text.startswith("{"):
        spec = json.loads(text)
        if not isinstance(spec, dict) or not all(
                isinstance(v, (list, dict)) for v in spec.values()):
            raise ValueError("--cluster JSON must map job names to address lists")
        return spec
    addresses = [a.strip() for a in text.split(",") if a.strip()]
    for a in addresses:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("--cluster address %r is not HOST:PORT" % a)
    if not addresses:
        raise ValueError("--cluster names no address")
    return {None: addresses}


def resolve(args, environ=None):
    """(cluster dict, job, task) from the parsed flags and TF_CONFIG.

    Raises ValueError naming the missing or inconsistent piece."""
    environ = os.environ if environ is None else environ
    tf_config = {}
    if environ.get("TF_CONFIG"):
        try:
            tf_config = json.loads(environ["TF_CONFIG"])
        except ValueError as e:
            raise ValueError("TF_CONFIG is not JSON: %s" % e) from None
    task_cfg = tf_config.get("task", {}) or {}
    job = args.job or task_cfg.get("type") or DEFAULT_JOB
    task = args.task if args.task is not None else task_cfg.get("index")
    if args.cluster is not None:
        cluster = parse_cluster(args.cluster)
    elif tf_config.get("cluster"):
        cluster = dict(tf_config["cluster"])
    else:
        raise ValueError("no cluster: give --cluster or set TF_CONFIG")
    if None in cluster:  # a bare address list is the job's
        cluster[job] = cluster.pop(None)
    if task is None:
        raise ValueError("no task index: give --task or TF_CONFIG's task.index")
    task = int(task)
    if job not in cluster:
        raise ValueError("job %r is not in the cluster (jobs: %s)" % (job, sorted(cluster)))
    if not 0 <= task < len(cluster[job]):
        raise ValueError("task %d is out of range: job %r has %d tasks"
                         % (task, job, len(cluster[job])))
    return cluster, job, task


def _arg_parser():
    p = argparse.ArgumentParser(prog="python -m tf_tpu_emb.server",
                                description="Start one tf_tpu_emb embedding host.")
    p.add_argument("--cluster", help="JSON cluster spec or HOST:PORT,... of the job")
    p.add_argument("--job", help="job name of this task (default: TF_CONFIG or %r)" % DEFAULT_JOB)
    p.add_argument("--task", type=int, help="task index of this host in its job")
    p.add_argument("--replicas", type=int, default=1,
                   help="CPU devices to expose, one per replica (default 1)")
    p.add_argument("--lifetime-seconds", type=float, default=None,
                   help="exit by itself after this many seconds")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="exit when the process that started this one exits")
    return p


def main(argv=None):
    parser = _arg_parser()
    args = parser.parse_args(argv)
    try:
        cluster, job, task = resolve(args)
    except ValueError as e:
        parser.error(str(e))
    if args.replicas < 1:
        parser.error("--replicas must be >= 1, got %d" % args.replicas)
    if args.lifetime_seconds is not None and args.lifetime_seconds <= 0:
        parser.error("--lifetime-seconds must be > 0")

    parent = os.getppid()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    import tf_tpu_emb

    # The kernels must be registered before the server creates its devices'
    # function runtime: a task started without them cannot run our ops.
    tf_tpu_emb.load_library()
    config = tf.compat.v1.ConfigProto(device_count={"CPU": args.replicas})
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job,
                                  task_index=task, protocol="grpc", config=config, start=True)
    address = tf.train.ClusterSpec(cluster).task_address(job, task)
    print("%s job=%s task=%d address=%s devices=%d"
          % (READY_PREFIX, job, task, address, args.replicas), flush=True)

    started = time.monotonic()
    while not stop.wait(_POLL_S):
        if (args.lifetime_seconds is not None
                and time.monotonic() - started >= args.lifetime_seconds):
            break
        if args.exit_with_parent and os.getppid() != parent:
            break
    del server
    sys.stdout.flush()
    sys.stderr.flush()
    # TF's gRPC server has no clean stop; its threads would keep the
    # interpreter alive (or crash in teardown), so leave without finalizers.
    os._exit(0)


if __name__ == "__main__":
    main()
