"""The strategy a client script trains under: ``tpu`` -- a TPU program's own
lines (resolver, connect, initialize, TPUStrategy), which the stand-in of
``python -m tf_tpu_emb.run`` answers -- or ``mirrored``, MirroredStrategy over
the same number of logical CPUs (the reference for reported losses)."""
import tensorflow as tf


def make(mode, replicas):
    if mode == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    else:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
        strategy = tf.distribute.MirroredStrategy(["/cpu:%d" % k for k in range(replicas)])
    assert strategy.num_replicas_in_sync == replicas
    return strategy
