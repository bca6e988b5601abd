"""Table layouts across host counts: a whole table <-> S host shards.

A checkpoint holds every table (and optimizer slot) whole, in TF's
TPU-embedding layout, whatever the number of embedding hosts; host k of S
holds shard k.  The row layout of a shard is TF's (docs/tpu_embedding_semantics.md,
"Sharding order inside a shard", and the table shard shapes there): shard k has
``vocab // S + (k < vocab % S)`` rows, and its local row r is global row

* DIV_DEFAULT: ``k * (vocab // S) + min(k, vocab % S) + r`` (contiguous ranges);
* MOD: ``r * S + k`` (ids with ``id % S == k``).

These are the rows ``Load/Retrieve…(num_shards=S, shard_id=k)`` address, so
``shard_rows(full, S, k, mod)`` is what host k loads and ``assemble`` of what
the S hosts retrieve is the whole table.  Works on numpy arrays (returns numpy)
and on TF tensors/variables (returns a tensor, stock ops only); both exact.
"""
import numpy as np


def rows_in_shard(vocabulary_size, num_shards, shard_id):
    """Rows of shard `shard_id` of `num_shards` (TF's rule; every shard must be
    non-empty).  Raises ValueError with TF's wording for bad arguments."""
    vocabulary_size, num_shards, shard_id = int(vocabulary_size), int(num_shards), int(shard_id)
    if num_shards <= 0:
        raise ValueError("The number of shards for the embedding layer must be > 0. "
                         "Currently set to: %d" % num_shards)
    if not 0 <= shard_id < num_shards:
        raise ValueError("The value of shard_id must be >= 0 and < %d. Currently set to: %d"
                         % (num_shards, shard_id))
    rows = vocabulary_size // num_shards + (1 if shard_id < vocabulary_size % num_shards else 0)
    if rows <= 0:
        raise ValueError("All embedding shards must be non-empty, shard ID: %d is empty, "
                         "vocabulary size: %d, number of shards: %d"
                         % (shard_id, vocabulary_size, num_shards))
    return rows


def shard_row_ids(vocabulary_size, num_shards, shard_id, mod):
    """The global row of each local row of the shard (int64 numpy vector)."""
    rows = rows_in_shard(vocabulary_size, num_shards, shard_id)
    local = np.arange(rows, dtype=np.int64)
    if mod:
        return local * num_shards + shard_id
    base, extra = divmod(int(vocabulary_size), int(num_shards))
    return local + (shard_id * base + min(shard_id, extra))


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


def shard_rows(full, num_shards, shard_id, mod):
    """Shard `shard_id` of `num_shards` of the whole table `full` ([vocab, dim]):
    what ``Load…(num_shards, shard_id)`` loads for it; `mod` is the config's
    MOD sharding_strategy (else DIV_DEFAULT)."""
    ids = shard_row_ids(_vocab(full), num_shards, shard_id, mod)
    if _is_tf(full):
        import tensorflow as tf

        return tf.gather(full, ids)
    return np.asarray(full)[ids]


def assemble(shards, mod):
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
    for k, s in enumerate(shards):
        want = vocab // num_shards + (1 if k < vocab % num_shards else 0)
        if int(s.shape[0]) != want:
            raise ValueError("shard %d of %d has %d rows; a table of %d rows gives it %d"
                             % (k, num_shards, int(s.shape[0]), vocab, want))
    ids = np.concatenate([shard_row_ids(vocab, num_shards, k, mod) for k in range(num_shards)])
    if any(_is_tf(s) for s in shards):
        import tensorflow as tf

        # position of each global row in the concatenation of the shards
        return tf.gather(tf.concat(shards, axis=0), np.argsort(ids, kind="stable"))
    out = np.empty((vocab, dims.pop()), dtype=np.result_type(*[np.asarray(s) for s in shards]))
    out[ids] = np.concatenate([np.asarray(s) for s in shards])
    return out


def reshard(shards, mod, num_shards, new_mod=None):
    """The `num_shards` shards (layout `new_mod`, default `mod`) of the table
    whose current shards are `shards` (layout `mod`): S -> S'."""
    full = assemble(shards, mod)
    new_mod = mod if new_mod is None else new_mod
    return [shard_rows(full, num_shards, k, new_mod) for k in range(num_shards)]
