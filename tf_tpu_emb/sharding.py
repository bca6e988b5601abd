"""The host-sharding arithmetic, and table layouts across host counts: a
whole table <-> S host shards.

The one Python home of the host-sharding arithmetic, the twin of
``core/sharding.h`` (the C++ data path's; ``tests/cluster/test_shard_arithmetic.py``
checks that the two agree).  It sits outside ``tf_tpu_emb.cluster`` and imports
only numpy (TensorFlow when given tensors), so a single-process user (the
per-shard table views of ``table_views.py``) loads none of the cluster
package (``tests/api/test_lazy_cluster.py``).  A checkpoint holds every table (and optimizer
slot) whole, in TF's TPU-embedding layout, whatever the number of embedding
hosts; host k of S holds shard k.  The row layout of a shard is TF's
(docs/tpu_embedding_semantics.md §2.7, "Sharding order inside a shard"):
shard k has ``vocab // S + (k < vocab % S)`` rows, and its local row r is
global row

* :attr:`Sharding.DIV_DEFAULT`: ``k * (vocab // S) + min(k, vocab % S) + r``
  (contiguous ranges);
* :attr:`Sharding.MOD`: ``r * S + k`` (ids with ``id % S == k``).

A table with fewer rows than hosts leaves the last hosts' shards empty
(``[0, dim]``), as TF's own TPU layout does (``tpu_embedding_v2.py`` gives
host k ``vocab // S + (k < vocab % S)`` rows and creates no variable for an
empty shard).  These are the rows ``Load/Retrieve…(num_shards=S, shard_id=k)``
address on host k, so ``shard_rows(full, S, k, sharding)`` is what host k
loads and ``assemble`` of what the S hosts retrieve is the whole table.
Works on numpy arrays (returns numpy) and on TF tensors/variables (returns a
tensor, stock ops only); both exact.
"""
import enum

import numpy as np


class Sharding(enum.IntEnum):
    """``TPUEmbeddingConfiguration.ShardingStrategy`` (the proto's values)."""
    DIV_DEFAULT = 0
    MOD = 1


def sharding_of(value):
    """`value` (a :class:`Sharding`, its proto number or its name) as a
    :class:`Sharding`; ValueError naming the accepted values otherwise."""
    if isinstance(value, str):
        if value in Sharding.__members__:
            return Sharding[value]
    elif isinstance(value, (int, np.integer)) and int(value) in (0, 1):
        return Sharding(int(value))
    raise ValueError("sharding_strategy must be one of %s, got %r"
                     % (list(Sharding.__members__), value))


def rows_in_shard(vocabulary_size, num_shards, shard_id):
    """Rows of shard `shard_id` of `num_shards` (0 for a shard past a table
    smaller than the number of shards).  ValueError with TF's wording for
    bad arguments."""
    vocabulary_size, num_shards, shard_id = int(vocabulary_size), int(num_shards), int(shard_id)
    if num_shards <= 0:
        raise ValueError("The number of shards for the embedding layer must be > 0. "
                         "Currently set to: %d" % num_shards)
    if not 0 <= shard_id < num_shards:
        raise ValueError("The value of shard_id must be >= 0 and < %d. Currently set to: %d"
                         % (num_shards, shard_id))
    if vocabulary_size <= 0:
        raise ValueError("vocabulary_size must be > 0, got %d" % vocabulary_size)
    return vocabulary_size // num_shards + (1 if shard_id < vocabulary_size % num_shards else 0)


def global_rows(vocabulary_size, num_shards, shard_id, sharding, local):
    """The global rows of the shard's local rows `local` (int64 numpy)."""
    rows_in_shard(vocabulary_size, num_shards, shard_id)  # checks the arguments
    local = np.asarray(local, np.int64)
    if sharding_of(sharding) == Sharding.MOD:
        return local * num_shards + shard_id
    base, extra = divmod(int(vocabulary_size), int(num_shards))
    return local + (shard_id * base + min(shard_id, extra))


def shard_row_ids(vocabulary_size, num_shards, shard_id, sharding):
    """The global row of each local row of the shard (int64 numpy vector)."""
    rows = rows_in_shard(vocabulary_size, num_shards, shard_id)
    return global_rows(vocabulary_size, num_shards, shard_id, sharding,
                       np.arange(rows, dtype=np.int64))


def _is_tf(x):
    import sys

    tf = sys.modules.get("tensorflow")
    return tf is not None and (tf.is_tensor(x) or isinstance(x, tf.Variable))


def _vocab(table):
    shape = table.shape
    if len(shape) != 2 or shape[0] is None:
        raise ValueError("a table must be a [vocabulary_size, dimension] matrix, got shape %s"
                         % (list(shape),))
    return int(shape[0])


def shard_rows(full, num_shards, shard_id, sharding):
    """Shard `shard_id` of `num_shards` of the whole table `full` ([vocab, dim]):
    what ``Load…(num_shards, shard_id)`` loads on that host; `sharding` is the
    config's :class:`Sharding`."""
    ids = shard_row_ids(_vocab(full), num_shards, shard_id, sharding)
    if _is_tf(full):
        import tensorflow as tf

        return tf.gather(full, ids)
    return np.asarray(full)[ids]


def assemble(shards, sharding):
    """The whole table from all its shards (shard k at position k): the inverse
    of `shard_rows`.  Raises ValueError naming the shard whose row count or
    dimension does not fit."""
    shards = list(shards)
    if not shards:
        raise ValueError("assemble needs at least one shard")
    num_shards = len(shards)
    dims = {int(s.shape[1]) if len(s.shape) == 2 else None for s in shards}
    if len(dims) != 1 or None in dims:
        raise ValueError("shards must be matrices of one dimension, got shapes %s"
                         % [list(s.shape) for s in shards])
    vocab = sum(int(s.shape[0]) for s in shards)
    if vocab == 0:
        raise ValueError("the %d shards hold no row" % num_shards)
    for k, s in enumerate(shards):
        want = rows_in_shard(vocab, num_shards, k)
        if int(s.shape[0]) != want:
            raise ValueError("shard %d of %d has %d rows; a table of %d rows gives it %d"
                             % (k, num_shards, int(s.shape[0]), vocab, want))
    ids = np.concatenate([shard_row_ids(vocab, num_shards, k, sharding)
                          for k in range(num_shards)])
    if any(_is_tf(s) for s in shards):
        import tensorflow as tf

        # position of each global row in the concatenation of the shards
        return tf.gather(tf.concat(shards, axis=0), np.argsort(ids, kind="stable"))
    out = np.empty((vocab, dims.pop()), dtype=np.result_type(*[np.asarray(s) for s in shards]))
    out[ids] = np.concatenate([np.asarray(s) for s in shards])
    return out


def reshard(shards, sharding, num_shards, new_sharding=None):
    """The `num_shards` shards (layout `new_sharding`, default `sharding`) of
    the table whose current shards are `shards` (layout `sharding`): S -> S'."""
    full = assemble(shards, sharding)
    new_sharding = sharding if new_sharding is None else new_sharding
    return [shard_rows(full, num_shards, k, new_sharding) for k in range(num_shards)]
