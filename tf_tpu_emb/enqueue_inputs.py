"""Enqueue inputs of :class:`tf_tpu_emb.TPUEmbedding`: what ``build`` and
``enqueue`` make of the user's inputs (TF's v2 rules and error texts): the
flattened ``build`` shapes, an input's per-replica shape, and one replica's
dense / ``tf.SparseTensor`` / ``tf.RaggedTensor`` inputs and weights as the
lists ``EnqueueTPUEmbeddingArbitraryTensorBatch`` takes; the replica an
``enqueue(device=...)`` feeds."""
import collections.abc

import tensorflow as tf
from tensorflow.python.util import nest

__all__ = ["flatten_shapes", "input_shape", "arbitrary_tensor_batch", "replica_devices",
           "replica_of_device", "mode_of"]


def flatten_shapes(shapes):
    """``build``'s per-replica input shapes, flattened (TF compares flattened
    structures), each shape -- a ``TensorShape`` or a list/tuple of ints and
    None -- one leaf."""
    def to_shapes(x):
        if isinstance(x, tf.TensorShape) or (
                isinstance(x, (list, tuple)) and all(d is None or isinstance(d, int) for d in x)):
            return tf.TensorShape(x)
        if isinstance(x, collections.abc.Mapping):
            return {k: to_shapes(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [to_shapes(v) for v in x]
        return x
    return nest.flatten(to_shapes(shapes))


def input_shape(path, x, feature):
    """The per-replica input shape of feature `path`'s input `x`, with TF's
    checks and errors (rank >= 2 sparse, rank 2 ragged, dense rank >= 1 with a
    last dimension of 1)."""
    shape = None
    if isinstance(x, (tf.SparseTensor, tf.RaggedTensor)) and x.shape.rank is not None:
        shape = x.shape.as_list()
    if isinstance(x, tf.SparseTensor):
        if shape is None or len(shape) < 2:
            raise ValueError("Only rank 2 and above sparse tensor is supported, find "
                             "rank {} sparse tensor for input {}"
                             .format(None if shape is None else len(shape), path))
        return tf.TensorShape(shape)
    if isinstance(x, tf.RaggedTensor):
        if shape is None or len(shape) != 2:
            raise ValueError("Only rank 2 ragged tensor is supported, find rank {} "
                             "ragged tensor for input {}"
                             .format(None if shape is None else len(shape), path))
        return tf.TensorShape(shape)
    if isinstance(x, tf.Tensor) or hasattr(x, "shape"):
        x = tf.convert_to_tensor(x)
        shape = x.shape.as_list()
        if len(shape) < 1:
            raise ValueError("Only rank 1 and above dense tensor is supported, find "
                             "rank {} sparse tensor for input {}".format(len(shape), path))
        if len(shape) > 1 and shape[-1] != 1:
            raise ValueError(
                "Rank 2 or above dense tensor should have last dimension as 1 as the "
                "last dimension will always be reduced. Instead got dense tensor as "
                "shape {}".format(shape))
        return tf.TensorShape(shape)
    raise ValueError("Input {} is of unknown type {}. Please only pass Tensor, "
                     "SparseTensor or RaggedTensor as input to enqueue."
                     .format(path, type(x)))


def arbitrary_tensor_batch(features, flat_inputs, flat_weights):
    """One replica's inputs (flat, feature-config order; ``features``: the
    :class:`tf_tpu_emb.features.Feature` s, their paths and TF configs) as the
    lists of ``EnqueueTPUEmbeddingArbitraryTensorBatch``, as TF's v2 builds
    them (semantics §4.4): per feature, COO indices (a sequence's padded with
    a position column), row splits or empty; int64 ids; weights or empty."""
    indices, values, weights = [], [], []
    int_zeros = tf.zeros([0], tf.int32)
    float_zeros = tf.zeros([0], tf.float32)
    for f, x, w in zip(features, flat_inputs, flat_weights):
        path, feature = f.path, f.config
        if isinstance(x, tf.SparseTensor):
            sample_indices = tf.cast(x.indices, tf.int32)
            if (x.shape.rank == 2 and not feature.output_shape
                    and feature.max_sequence_length > 0):
                sample_indices = tf.pad(sample_indices, [[0, 0], [0, 1]])
            indices.append(sample_indices)
            values.append(tf.cast(x.values, tf.int64))
            if w is not None and not isinstance(w, tf.SparseTensor):
                raise ValueError("Weight for {} is type {} which does not match type "
                                 "input which is SparseTensor.".format(path, type(w)))
            weights.append(float_zeros if w is None else tf.cast(w.values, tf.float32))
        elif isinstance(x, tf.RaggedTensor):
            indices.append(tf.cast(x.row_splits, tf.int32))
            values.append(tf.cast(x.values, tf.int64))
            if w is not None and not isinstance(w, tf.RaggedTensor):
                raise ValueError("Weight for {} is type {} which does not match type "
                                 "input which is RaggedTensor.".format(path, type(w)))
            weights.append(float_zeros if w is None else tf.cast(w.values, tf.float32))
        else:
            if w is not None:
                raise ValueError("Weight specified for dense input {}, which is not "
                                 "allowed. Weight will always be 1 in this case."
                                 .format(path))
            indices.append(int_zeros)
            values.append(tf.cast(tf.reshape(x, [-1]), tf.int64))
            weights.append(float_zeros)
    return indices, values, weights


def replica_devices(strategy):
    """The device of each replica of ``strategy`` (the default strategy has
    no ``worker_devices``: its one replica is the host CPU)."""
    try:
        return tuple(strategy.extended.worker_devices)
    except RuntimeError:
        return ("/job:localhost/replica:0/task:0/device:CPU:0",)


def replica_of_device(strategy, device):
    """The replica of ``strategy`` that ``enqueue(device=...)`` feeds.  TF
    maps a TPU device to its index (``/device:TPU:k`` -> queue k); here a
    replica is a CPU device, so one of the strategy's worker devices (or
    ``/CPU:k`` / ``/TPU:k`` with k < replicas, for code written for a TPU)
    picks replica k."""
    spec = tf.DeviceSpec.from_string(device)
    if spec.device_type not in ("CPU", "TPU"):
        raise ValueError("Non-TPU device {} passed to enqueue.".format(device))
    devices = replica_devices(strategy)
    for k, worker in enumerate(devices):
        worker = tf.DeviceSpec.from_string(worker)
        if spec.device_type == "CPU" and worker.make_merged_spec(spec) == worker:
            return k
    index = spec.device_index or 0
    replicas = strategy.num_replicas_in_sync
    if spec.device_type == "CPU" or not 0 <= index < replicas:
        raise ValueError(
            "enqueue(device={!r}): device index {} is not a replica of this "
            "strategy ({} replica(s): {})".format(device, index, replicas, list(devices)))
    return index


def mode_of(training):
    """The enqueue's mode_override for a Python or tensor bool."""
    if isinstance(training, bool):
        return "train" if training else "inference"
    return tf.where(tf.convert_to_tensor(training), "train", "inference")
