"""Input handling of the Keras ``TPUEmbeddingLayer``: the training flag,
dense padded bags as SparseTensors, batch sizes and padding a short last
batch to the engine's batch size."""
import tensorflow as tf
from tensorflow.python.util import nest

__all__ = ["as_bool", "dense_bags_to_sparse", "static_batch", "dynamic_batch", "pad_sparse",
           "pad_ragged", "batch_hint"]


def as_bool(training):
    if training is None:
        return False
    if isinstance(training, bool):
        return training
    value = tf.get_static_value(training)
    if value is None:
        raise ValueError("TPUEmbeddingLayer needs a Python bool `training` (got a tensor).")
    return bool(value)


def dense_bags_to_sparse(flat_x, flat_w):
    """Dense ids ``[B, ..., L]`` with a last dimension other than 1 are bags (or
    sequences) padded with negative ids: they become SparseTensors without the
    padding (dense weights of the same shape follow the same mask)."""
    out_x, out_w = [], []
    for x, w in zip(flat_x, flat_w):
        if (isinstance(x, (tf.SparseTensor, tf.RaggedTensor)) or x.shape.rank is None
                or x.shape.rank < 2 or x.shape[-1] == 1):
            out_x.append(x)
            out_w.append(w)
            continue
        x = tf.convert_to_tensor(x)
        indices = tf.where(x >= 0)
        shape = tf.shape(x, out_type=tf.int64)
        sp = tf.SparseTensor(indices, tf.gather_nd(x, indices), shape)
        sp.set_shape(x.shape)
        out_x.append(sp)
        if w is not None and not isinstance(w, (tf.SparseTensor, tf.RaggedTensor)):
            w = tf.SparseTensor(indices, tf.gather_nd(tf.convert_to_tensor(w, tf.float32),
                                                      indices), shape)
            w.set_shape(x.shape)
        out_w.append(w)
    return out_x, out_w


def static_batch(x):
    shape = x.shape
    if shape.rank is None or shape.rank == 0:
        return None
    return shape[0]


def dynamic_batch(x):
    if isinstance(x, tf.SparseTensor):
        return tf.cast(x.dense_shape[0], tf.int32)
    if isinstance(x, tf.RaggedTensor):
        return tf.cast(x.nrows(), tf.int32)
    return tf.shape(x)[0]


def pad_sparse(x, batch):
    shape = tf.concat([tf.constant([batch], tf.int64), x.dense_shape[1:]], 0)
    out = tf.SparseTensor(x.indices, x.values, shape)
    out.set_shape([batch] + x.shape.as_list()[1:])
    return out


def pad_ragged(x, batch):
    splits = x.row_splits
    n = tf.shape(splits, out_type=splits.dtype)[0] - 1
    splits = tf.concat([splits, tf.fill([tf.cast(batch, splits.dtype) - n], splits[-1])], 0)
    return tf.RaggedTensor.from_row_splits(x.values, splits, validate=False)


def batch_hint(feature_config, input_shape):
    """The static (global) batch dimension of the build shapes, if any."""
    if input_shape is None:
        return None
    try:
        flat = nest.flatten_up_to(feature_config, input_shape, check_types=False)
    except (TypeError, ValueError):
        return None
    for shape in flat:
        try:
            dims = list(shape)
        except TypeError:
            continue
        if dims and isinstance(dims[0], int):
            return dims[0]
    return None
