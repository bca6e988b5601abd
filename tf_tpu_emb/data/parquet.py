"""A Parquet click log, read with tensorflow-io, as ``tf.data`` batches for
``TPUEmbedding.enqueue`` (docs/guides/parquet.md).

The layout is flat, because tensorflow-io's Parquet reader
(``tfio.IODataset.from_parquet``) reads primitive columns only:

* ``label``: float32, one per example;
* ``dense_<k>``: float32 dense features (optional);
* ``<feature>``: the multi-hot ids of a categorical feature, a string of
  space-separated int64 ids per example (empty: no id; any count per example,
  so the batch is ragged);
* ``<feature>_weights``: for weighted features, the ids' float weights in
  the same form and count.

:func:`write_click_log` (or :class:`ClickLogWriter`, chunk by chunk) writes
that layout with pyarrow; :func:`read_click_log`
reads it with tensorflow-io into batches ``(dense [B, n] float32,
{feature: RaggedTensor int64 ids}, {feature: RaggedTensor float32 weights},
labels [B] float32)``; ``enqueue(ids, enqueue_weights(features, weights))``
feeds a batch to ``TPUEmbedding`` (which wants None for unweighted features,
an element a dataset cannot hold).  tensorflow-io is imported only here and only
when reading: it is an optional dependency (its 0.37.1 release loads on
TF 2.16 only; the version table of docs/install.md).
"""
import numpy as np
import tensorflow as tf

LABEL = "label"


def dense_column(k):
    return "dense_%d" % k


def weights_column(feature):
    return feature + "_weights"


def _joined(rows, fmt):
    return [" ".join(fmt % v for v in row) for row in rows]


def _table(labels, ids, weights, dense):
    import pyarrow as pa  # pylint: disable=import-outside-toplevel

    labels = np.asarray(labels, np.float32)
    n = len(labels)
    columns = {LABEL: pa.array(labels, pa.float32())}
    if dense is not None:
        dense = np.asarray(dense, np.float32).reshape(n, -1)
        for k in range(dense.shape[1]):
            columns[dense_column(k)] = pa.array(dense[:, k], pa.float32())
    for feature, rows in ids.items():
        if len(rows) != n:
            raise ValueError("feature %r has %d rows of ids; the log has %d labels"
                             % (feature, len(rows), n))
        columns[feature] = pa.array(_joined(rows, "%d"), pa.string())
    for feature, rows in (weights or {}).items():
        if feature not in ids:
            raise ValueError("weights for %r, which has no ids" % (feature,))
        if [len(r) for r in rows] != [len(r) for r in ids[feature]]:
            raise ValueError("feature %r: every example needs one weight per id" % (feature,))
        columns[weights_column(feature)] = pa.array(_joined(rows, "%.9g"), pa.string())
    return pa.table(columns)


class ClickLogWriter:
    """Writes a click log chunk by chunk (one Parquet row group per
    :meth:`write`), so a long log need not fit in memory; a context manager.
    """

    def __init__(self, path):
        self._path = path
        self._writer = None

    def write(self, labels, ids, weights=None, dense=None):
        """Appends examples.

        Args:
          labels: [n] labels.
          ids: {feature: n sequences of int ids} (ragged: any length per example).
          weights: {feature: n sequences of float weights}, each as long as
            its example's ids; None: no weighted feature.
          dense: [n, k] dense features or None.

        Raises:
          ValueError: a feature's row count or a weight count does not match.
        """
        import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

        table = _table(labels, ids, weights, dense)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._path, table.schema)
        self._writer.write_table(table)

    def close(self):
        if self._writer is not None:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_click_log(path, labels, ids, weights=None, dense=None):
    """Writes a click log in one go (arguments as :meth:`ClickLogWriter.write`)."""
    with ClickLogWriter(path) as writer:
        writer.write(labels, ids, weights, dense)


def _ragged(strings, dtype):
    """A batch of space-separated numbers -> RaggedTensor [B, None] of dtype."""
    parts = tf.strings.split(strings)
    return tf.ragged.map_flat_values(tf.strings.to_number, parts, out_type=dtype)


def enqueue_weights(features, weights):
    """``TPUEmbedding.enqueue``'s weights for a batch of :func:`read_click_log`:
    the weights of each weighted feature, None for the others."""
    return {f: weights.get(f) for f in features}


def read_click_log(path, features, *, batch_size, num_dense=0, weighted=(),
                   drop_remainder=True):
    """The click log at `path` as a ``tf.data.Dataset`` of batches, read with
    ``tfio.IODataset.from_parquet``.

    Args:
      path: the Parquet file (layout in the module doc).
      features: the categorical features to read, in order.
      batch_size: examples per batch.
      num_dense: how many ``dense_<k>`` columns to read (0: none; the dense
        element is then [B, 0]).
      weighted: the features that have a ``<feature>_weights`` column; the
        others get no entry in the weights dict.
      drop_remainder: drop a last, smaller batch (the engine's shapes are
        fixed at build time, so training needs whole batches).

    Returns:
      A dataset of ``(dense, ids, weights, labels)``: dense [B, num_dense]
      float32, ids {feature: RaggedTensor [B, None] int64}, weights
      {feature: RaggedTensor [B, None] float32}, labels [B] float32.

    Raises:
      ImportError: tensorflow-io is not installed (or does not load on this
        TensorFlow).
      ValueError: `weighted` names a feature not in `features`.
    """
    import tensorflow_io as tfio  # pylint: disable=import-outside-toplevel

    features = list(features)
    unknown = [f for f in weighted if f not in features]
    if unknown:
        raise ValueError("weighted features %s are not in features %s" % (unknown, features))
    columns = ([LABEL] + [dense_column(k) for k in range(num_dense)] + features
               + [weights_column(f) for f in weighted])
    rows = tfio.IODataset.from_parquet(path, columns=columns)

    def to_enqueue(batch):
        labels = batch[LABEL]
        if num_dense:
            dense = tf.stack([batch[dense_column(k)] for k in range(num_dense)], axis=1)
        else:
            dense = tf.zeros([tf.shape(labels)[0], 0], tf.float32)
        ids = {f: _ragged(batch[f], tf.int64) for f in features}
        weights = {f: _ragged(batch[weights_column(f)], tf.float32) for f in weighted}
        return dense, ids, weights, labels

    return (rows.batch(batch_size, drop_remainder=drop_remainder)
            .map(to_enqueue, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))
