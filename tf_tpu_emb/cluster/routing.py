"""Routing one replica's enqueue inputs to the embedding hosts that hold the rows.

With ``num_hosts`` = S, host k's engine (``ConfigureTPUEmbeddingHostShard``)
holds shard k of every table in TF's row layout
(docs/tpu_embedding_semantics.md §2.7, the rows ``Load/Retrieve(num_shards=S,
shard_id=k)`` address):
DIV_DEFAULT = contiguous ranges, the first ``vocab % S`` shards one row
longer; MOD = ``id % S`` at local row ``id // S``.

:class:`Router` turns the inputs of one ``EnqueueTPUEmbeddingArbitraryTensorBatch``
(per feature: COO sample indices / row splits / dense, ids, weights; the
mid-level API's form) into one such enqueue per host:

* every host gets every output position of every feature, as row splits
  with one row per position (so sequence and high-rank features keep their
  positions, and a host that owns none of a bag's ids gets an empty bag);
* the ids are the host's local rows, in their original order within a bag;
* the combiner is folded into the weights (``w * 1/sum w`` for mean,
  ``w * 1/sqrt(sum w^2)`` for sqrtn, computed over the whole bag as the
  engine computes it, core/bag.h), and every host enqueues with combiner
  ``sum``; the sum over hosts of the hosts' Recv outputs is then the
  single-host activation, and each host's backward step sees the same
  per-id gradient weight ``w * scale`` as a single host.

Ids outside a table's vocabulary and non-finite weights are rejected here,
before anything is enqueued anywhere (InvalidArgument naming the feature), so
no host takes a batch another host refused.  Everything is stock TF ops
(they run on the worker, in the step's ``tf.function``).
"""
import numpy as np
import tensorflow as tf

COMBINERS = ("sum", "mean", "sqrtn")


def owner_and_local(ids, vocabulary_size, num_hosts, mod):
    """(host, local row) of each id (int64 tensors), ids in [0, vocabulary_size)."""
    ids = tf.convert_to_tensor(ids, tf.int64)
    if mod:
        return ids % num_hosts, ids // num_hosts
    base, extra = divmod(vocabulary_size, num_hosts)
    cut = extra * (base + 1)  # ids below it live on the first `extra` (longer) shards
    host = tf.where(ids < cut, ids // (base + 1), extra + (ids - cut) // base)
    start = host * base + tf.minimum(host, extra)
    return host, ids - start


class FeatureRoute:
    """What routing needs to know of one feature (one Recv output)."""

    def __init__(self, name, output_shape, vocabulary_size, combiner):
        if combiner not in COMBINERS:
            raise ValueError("feature {}: combiner {!r} is not one of {}"
                             .format(name, combiner, COMBINERS))
        self.name = name
        self.shape = [int(d) for d in output_shape]
        self.positions = int(np.prod(self.shape, dtype=np.int64))
        self.vocabulary_size = int(vocabulary_size)
        self.combiner = combiner


class Router:
    """Splits one replica's ArbitraryTensorBatch inputs over ``num_hosts`` hosts.

    ``features``: one :class:`FeatureRoute` per enqueue input, in the
    config's feature-descriptor order.  ``mod``: the config's
    sharding_strategy is MOD (else DIV_DEFAULT).
    """

    def __init__(self, features, num_hosts, mod):
        self.features = list(features)
        self.num_hosts = int(num_hosts)
        self.mod = bool(mod)
        for f in self.features:
            if f.vocabulary_size < self.num_hosts:  # TF refuses empty shards
                raise ValueError(
                    "feature {}: a table of vocabulary_size {} cannot be sharded over {} "
                    "hosts (every host must hold at least one row)".format(
                        f.name, f.vocabulary_size, self.num_hosts))

    @property
    def host_combiners(self):
        """The combiners every host enqueues with (folded into the weights)."""
        return ["sum"] * len(self.features)

    def route(self, indices, values, weights):
        """Per host k: ``(row_splits, ids, weights)`` lists (one entry per
        feature) for host k's enqueue, which runs with :attr:`host_combiners`."""
        if not len(indices) == len(values) == len(weights) == len(self.features):
            raise ValueError("route: {} features are configured, got {} / {} / {} inputs"
                             .format(len(self.features), len(indices), len(values),
                                     len(weights)))
        per_host = [([], [], []) for _ in range(self.num_hosts)]
        for f, idx, ids, w in zip(self.features, indices, values, weights):
            for k, (splits, local, folded) in enumerate(self._route_feature(f, idx, ids, w)):
                per_host[k][0].append(splits)
                per_host[k][1].append(local)
                per_host[k][2].append(folded)
        return per_host

    # ------------------------------------------------------------ one feature

    def _route_feature(self, f, indices, ids, weights):
        ids = tf.reshape(tf.cast(ids, tf.int64), [-1])
        n = tf.size(ids, out_type=tf.int64)
        weights = tf.reshape(tf.cast(weights, tf.float32), [-1])
        weighted = weights.shape.num_elements() != 0
        positions, keep = self._positions(f, tf.convert_to_tensor(indices), n)
        checks = [tf.debugging.assert_equal(
            tf.logical_and(tf.reduce_all(ids >= 0),
                           tf.reduce_all(ids < f.vocabulary_size)), True,
            message="feature {}: an embedding id is outside the table's vocabulary "
                    "[0, {})".format(f.name, f.vocabulary_size))]
        if weighted:
            checks.append(tf.debugging.assert_equal(
                tf.size(weights, out_type=tf.int64), n,
                message="feature {}: the number of weights differs from the number "
                        "of ids".format(f.name)))
            checks.append(tf.debugging.assert_all_finite(
                weights, "feature {}: an aggregation weight is not finite".format(f.name)))
        with tf.control_dependencies(checks):
            ids = tf.identity(ids)
        if not weighted:
            weights = tf.ones_like(ids, tf.float32)
        # Entries past a sequence's length are dropped (as the engine drops them).
        positions, ids, weights = (tf.boolean_mask(t, keep) for t in (positions, ids, weights))
        order = tf.argsort(positions, stable=True)  # bags in position order, ids in order
        positions, ids, weights = (tf.gather(t, order) for t in (positions, ids, weights))
        weights = weights * tf.gather(self._bag_scale(f, positions, weights), positions)
        host, local = owner_and_local(ids, f.vocabulary_size, self.num_hosts, self.mod)
        out = []
        for k in range(self.num_hosts):
            mine = tf.equal(host, k)
            counts = tf.math.bincount(tf.boolean_mask(positions, mine), minlength=f.positions,
                                      maxlength=f.positions, dtype=tf.int64)
            splits = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(counts)], 0)
            out.append((splits, tf.boolean_mask(local, mine), tf.boolean_mask(weights, mine)))
        return out

    @staticmethod
    def _bag_scale(f, positions, weights):
        """The combiner's 1/N per output position (core/bag.h's CombinerScale)."""
        if f.combiner == "sum":
            return tf.ones([f.positions], tf.float32)
        if f.combiner == "mean":
            total = tf.math.unsorted_segment_sum(weights, positions, f.positions)
        else:
            total = tf.sqrt(tf.math.unsorted_segment_sum(weights * weights, positions,
                                                         f.positions))
        # div_no_nan: 0 for an empty bag, and an exact division (grappler turns a
        # plain 1 / x into Reciprocal, whose CPU kernel is not correctly rounded).
        return tf.math.divide_no_nan(tf.ones_like(total), total)

    @staticmethod
    def _positions(f, indices, n):
        """(output position of each id, whether the engine keeps it), by the
        ArbitraryTensorBatch rules of docs/tpu_embedding_semantics.md §4.1."""
        shape = f.shape
        rank = len(shape)
        # The format is static (a known empty first dimension means dense);
        # the number of entries and rows may be known only at run time.
        if indices.shape.rank == 2 and indices.shape[0] != 0:  # COO sample indices
            idx = tf.cast(indices, tf.int64)
            cols = min(int(indices.shape[1]), rank)
            strides = [int(np.prod(shape[j + 1:rank], dtype=np.int64)) for j in range(rank)]
            pos = tf.zeros([tf.shape(idx)[0]], tf.int64)
            keep = tf.ones([tf.shape(idx)[0]], tf.bool)
            for j in range(cols):
                pos += idx[:, j] * strides[j]
                keep = tf.logical_and(keep, idx[:, j] < shape[j])
            return pos, keep
        if indices.shape.rank == 1 and indices.shape[0] != 0:  # row splits
            splits = tf.cast(indices, tf.int64)
            row = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int64)
            if rank < 2:
                return row, tf.ones_like(row, tf.bool)
            # Rows of sequences (width = the last dimension) or one row a position.
            rows = tf.size(splits, out_type=tf.int64) - 1
            width = tf.where(tf.logical_and(tf.equal(rows * shape[-1], f.positions),
                                            tf.not_equal(rows, f.positions)),
                             tf.constant(shape[-1], tf.int64), tf.constant(1, tf.int64))
            inner = tf.range(n, dtype=tf.int64) - tf.gather(splits, row)
            return (tf.where(width > 1, row * width + inner, row),
                    tf.logical_or(tf.equal(width, 1), inner < width))
        return tf.range(n, dtype=tf.int64), tf.ones([n], tf.bool)  # dense: one id a position
