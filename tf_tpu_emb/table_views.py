"""``TPUEmbedding.embedding_tables``: keyed by ``TableConfig`` (TF's contract),
and also by table name, where it gives the per-shard view TPU-era clients read.

Keras-RS (``DistributedEmbedding.get_embedding_tables``) indexes the tables by
*name* and reads ``.values``: the table as S equal shards in MOD layout (shard
k holds rows k, k + S, ...; each padded with zero rows to ``ceil(V / S)``), S
being the number of replicas times the embedding devices per chip (one under
the CPU stand-in for the TPU system).  The shard rows are those of
``tf_tpu_emb.sharding`` (TF's MOD layout); only the padding is the
view's.
"""
import math

import tensorflow as tf

from tf_tpu_emb import sharding

__all__ = ["EmbeddingTables", "ShardedTable"]


class ShardedTable:
    """A table variable seen as ``num_shards`` padded MOD shards (``.values``);
    ``.variable`` is the whole table."""

    def __init__(self, variable, num_shards):
        self.variable = variable
        self.num_shards = int(num_shards)

    @property
    def shape(self):
        return self.variable.shape

    @property
    def values(self):
        """The shards, each ``[ceil(V / S), dim]`` (eager tensors, read now)."""
        vocab, dim = (int(d) for d in self.variable.shape)
        rows = math.ceil(vocab / self.num_shards)
        full = tf.convert_to_tensor(self.variable)
        shards = []
        for k in range(self.num_shards):
            ids = sharding.shard_row_ids(vocab, self.num_shards, k, sharding.Sharding.MOD) \
                if k < vocab else []
            shard = tf.gather(full, ids) if len(ids) else tf.zeros([0, dim], full.dtype)
            shards.append(tf.pad(shard, [[0, rows - len(ids)], [0, 0]]))
        return tuple(shards)

    def numpy(self):
        return self.variable.numpy()

    def __repr__(self):
        return "<ShardedTable %s: %d shard(s)>" % (self.variable.name, self.num_shards)


class EmbeddingTables(dict):
    """``{TableConfig: variable}``; ``tables[name]`` is the :class:`ShardedTable`
    of the table called ``name``."""

    def __init__(self, tables, num_shards):
        super().__init__(tables)
        self._num_shards = num_shards

    def __getitem__(self, key):
        if isinstance(key, str):
            for table, variable in self.items():
                if table.name == key:
                    return ShardedTable(variable, self._num_shards)
        return super().__getitem__(key)

    def __contains__(self, key):
        if isinstance(key, str):
            return any(table.name == key for table in self)
        return super().__contains__(key)
