"""Runs configs that used to crash the process, in a child process of
tests/engine/test_config_limits.py: a regression kills this process, not pytest.

Reads a JSON list of cases from stdin, each {"name", "config" (base64 of a
serialized TPUEmbeddingConfiguration), "action", "env"}; prints "START
<name>" before a case and one JSON result line after it:
{"name", "error" (the TF error class name, or null), "message"}.

Actions: "configure" (configure then shut down), "configure_recv" (configure,
enqueue one id per output position, Recv; the result carries the output
shapes), "shape_fn" (trace our RecvTPUEmbeddingActivations in a tf.function:
its shape function sees the config)."""
import base64
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "common"))  # the shared test helpers
import engine_util as eu  # noqa: E402
import tf_tpu_emb  # noqa: E402
from tf_tpu_emb import ops as tte_ops  # noqa: E402


def configure(raw, config):
    tf.raw_ops.ConfigureTPUEmbedding(config=raw)
    eu.shutdown()
    return {}


def configure_recv(raw, config):
    tf.raw_ops.ConfigureTPUEmbedding(config=raw)
    try:
        args = []
        for f in config.feature_descriptor:
            n = int(np.prod(list(f.input_shape)))
            args.append((eu.empty(tf.int32), np.zeros(n, np.int64), eu.empty(tf.float32)))
        eu.enqueue_arbitrary(args)
        outs = tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=len(args), config=raw)
        return {"shapes": [o.shape.as_list() for o in outs]}  # numpy stops at rank 64
    finally:
        eu.shutdown()


def shape_fn(raw, config):
    n = max(1, len(config.feature_descriptor) or len(config.table_descriptor))

    @tf.function
    def recv():
        return tte_ops.recv_tpu_embedding_activations(num_outputs=n, config=raw)

    recv.get_concrete_function()
    return {}


def _error_fields(what, e):
    return {what + "_error": type(e).__name__, what + "_message": e.message}


def _send(raw, config):
    grads = [np.zeros(shape, np.float32) for shape in eu.output_shapes(config)]
    tf.raw_ops.SendTPUEmbeddingGradients(inputs=grads, learning_rates=[], config=raw)


def _enqueue_one(config):
    eu.enqueue_arbitrary([(eu.empty(tf.int32), np.zeros(int(np.prod(list(f.input_shape))),
                                                        np.int64), eu.empty(tf.float32))
                          for f in config.feature_descriptor], mode="train", device_ordinal=0)


def recv_waits(raw, config):
    """Replica 0 of a num_tensor_cores >= 2 config runs a step; replica 1
    (no such CPU device) never sends, so the next Recv of replica 0 waits.
    Without a step timeout in the environment, ShutdownTPUEmbedding ends the
    wait; then the process configures and runs a step again."""
    import threading
    tf.raw_ops.ConfigureTPUEmbedding(config=raw)
    _enqueue_one(config)
    eu.recv(config)
    _send(raw, config)
    _enqueue_one(config)
    outcome = {}

    def waiting_recv():
        try:
            eu.recv(config)
        except tf.errors.OpError as e:
            outcome["error"] = e
    # daemon: a Recv that never returns (the bug) must not keep the child alive
    thread = threading.Thread(target=waiting_recv, daemon=True)
    thread.start()
    if "TF_TPU_EMB_STEP_TIMEOUT_SECONDS" not in os.environ:
        thread.join(2.0)  # let the Recv start waiting (if it has not, it fails differently)
        eu.shutdown()
    thread.join(120)  # a hang, not a slow machine: the fixed wait ends at once
    result = {"finished": not thread.is_alive()}
    eu.shutdown()
    tf.raw_ops.ConfigureTPUEmbedding(config=raw)
    try:
        _enqueue_one(config)
        result["shapes"] = [list(o.shape) for o in eu.recv(config)]
    finally:
        eu.shutdown()
    if "error" in outcome:
        result.update(_error_fields("recv", outcome["error"]))
    return result


def enqueue_oom(raw, config):
    """An enqueue whose scratch cannot be allocated (address space capped
    just above what the process uses) fails with ResourceExhausted and
    leaves the engine unchanged."""
    import resource
    tf.raw_ops.ConfigureTPUEmbedding(config=raw)
    try:
        n = 20_000_000
        ids = tf.zeros([n], tf.int32)
        splits = tf.constant([0, n, n, n, n], tf.int32)
        weights = eu.empty(tf.float32)
        eu.enqueue_arbitrary([(eu.empty(tf.int32), np.zeros(4, np.int64), weights)])
        eu.recv(config)  # the first op run starts the thread pools
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), hard))
        error = None
        try:
            eu.enqueue_arbitrary([(splits, ids, weights)])
        except tf.errors.OpError as e:
            error = e
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        result = {}
        try:
            eu.recv(config)
            result["queue_after"] = "not empty"
        except tf.errors.DeadlineExceededError as e:
            result["queue_after"] = e.message
        eu.enqueue_arbitrary([(eu.empty(tf.int32), np.arange(4, dtype=np.int64), weights)])
        result["shapes"] = [list(o.shape) for o in eu.recv(config)]
        if error is not None:
            result.update(_error_fields("enqueue", error))
        return result
    finally:
        eu.shutdown()


ACTIONS = {"configure": configure, "configure_recv": configure_recv, "shape_fn": shape_fn,
           "recv_waits": recv_waits, "enqueue_oom": enqueue_oom}


def main():
    tf_tpu_emb.load_library()
    for case in json.load(sys.stdin):
        print("START", case["name"], flush=True)
        saved = {k: os.environ.get(k) for k in case.get("env", {})}
        os.environ.update(case.get("env", {}))
        raw = base64.b64decode(case["config"])
        config = eu.Config()
        config.ParseFromString(raw)
        result = {"name": case["name"], "error": None, "message": ""}
        try:
            result.update(ACTIONS[case["action"]](raw, config))
        except (tf.errors.OpError, ValueError) as e:  # ValueError: a shape function's error
            result["error"] = type(e).__name__
            result["message"] = str(e)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        print(json.dumps(result), flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
