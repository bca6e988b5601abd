"""Set-up shared by the test child scripts that run as processes of their own
(started through harness.py): TensorFlow's logical CPU devices can only be
configured before its runtime starts, so a test that needs several replicas
in one process runs a script that begins with `tensorflow_with_cpus(R)` and
ends with `run(main)`."""
import os
import sys
import traceback


def tensorflow_with_cpus(n):
    """TensorFlow, quiet, with `n` logical CPU devices (one per replica)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    return tf


def run(main):
    """Runs a script's `main`; on failure prints everything the test reports
    (the traceback) and exits 1."""
    try:
        main()
    except Exception:  # pylint: disable=broad-except
        traceback.print_exc()
        sys.exit(1)
