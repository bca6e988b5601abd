"""Fuzz worker: runs cases sent by runner.py until its stdin closes (or it dies).

Protocol: one JSON request per stdin line ({"family", "seed", "index"}); one
JSON result per line on the file descriptor given as argv[1]
({"outcome", "detail"}); {"ready": true} once TensorFlow and the library are
loaded.  The worker sees two logical CPU devices (replicas 0 and 1) and, unless
TF_TPU_EMB_FUZZ_MAX_DATA_GB=0, a data-size rlimit, so that a fuzzed config
asking for huge tables fails to allocate instead of exhausting the machine.
"""
import faulthandler
import json
import os
import resource
import signal
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Engine limits (README): tables of fuzzed configs stay within 256 MiB, and a
# Recv waits at most 0.01 s for its batch or the other replicas (the executor
# runs one op at a time, so a batch is queued before its Recv runs or never:
# a Recv with nothing queued must fail, and it never sends a Recv that waits
# for other replicas on purpose; so no wait can end in anything but the
# timeout, however long it is).  Since Recv waits for its enqueue (issue
# 12), every such negative case costs the whole timeout: 0.3 s made the
# enqueue family 4.6x slower (200 cases: 99 s vs 21.5 s), and at 0.05 s the
# enqueue family's 10,000 cases took 893 s.
os.environ.setdefault("TF_TPU_EMB_MEMORY_LIMIT_BYTES", str(256 << 20))
os.environ.setdefault("TF_TPU_EMB_STEP_TIMEOUT_SECONDS", "0.01")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main():
    out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # crashes are expected: no core files
    asan = "libasan" in os.environ.get("LD_PRELOAD", "")
    limit_gb = float(os.environ.get("TF_TPU_EMB_FUZZ_MAX_DATA_GB", "8"))
    if limit_gb > 0 and not asan:  # ASan reserves terabytes of shadow memory
        limit = int(limit_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    import tensorflow as tf
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    import tf_tpu_emb
    tf_tpu_emb.load_library()
    import executor
    if not asan:
        # TensorFlow's fatal-signal handlers can stall a dying process: make
        # a crash kill the worker at once, after printing the Python stack.
        for sig in (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL):
            signal.signal(sig, signal.SIG_DFL)
    faulthandler.enable()
    import families
    import fuzz_configs
    fuzz_configs.optimizer_templates()
    runner = executor.Executor()
    out.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        runner.verbose = bool(request.get("verbose"))
        try:
            case = families.generate(request["family"], request["seed"], request["index"])
        except Exception:  # a bug of the generator, not of the library
            out.write(json.dumps({"outcome": "harness_error",
                                  "detail": traceback.format_exc()[-3000:]}) + "\n")
            continue
        if runner.verbose:
            print(json.dumps(families.describe(request["family"], request["seed"],
                                               request["index"]))[:20000], flush=True)
        outcome, detail = runner.run(case)
        # A stuck op thread, or a case that left TF's context changed: start afresh.
        restart = bool(runner.abandoned_threads) or runner.restart_worker
        out.write(json.dumps({"outcome": outcome, "detail": detail, "restart": restart}) + "\n")
        if restart:
            out.flush()
            os._exit(0)


if __name__ == "__main__":
    main()
