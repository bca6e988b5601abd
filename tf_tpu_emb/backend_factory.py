"""Which :class:`tf_tpu_emb.backend.Backend` a ``TPUEmbedding`` gets: the one
place that knows the kinds and what each is built from.

* no ``cluster``: :class:`tf_tpu_emb.backend.LocalEngine`, an engine of this
  process;
* ``cluster=`` (an ``EmbeddingHosts``):
  :class:`tf_tpu_emb.cluster.sharded.ShardedEngine`, imported here and only
  here, so a single-process user loads none of the cluster package
  (``tests/api/test_lazy_cluster.py``).

A module of its own rather than a function of ``backend.py``: the sharded
kind subclasses ``backend.Backend``, so ``backend`` importing
``cluster.sharded`` (even inside a function) would close an import cycle
(``tests/api/test_import_graph.py``).
"""
from tf_tpu_emb import backend

__all__ = ["create"]


def create(config, *, owner, combiners, features, cluster=None, engine=None,
           replica_offset=0):
    """The backend of `owner` (the ``TPUEmbedding``) for the serialised
    ``TPUEmbeddingConfiguration`` `config`.  `combiners`: per table (the local
    engine's); `features`: :class:`tf_tpu_emb.features.Feature` s in the
    config's feature order (the hosts' router's).  `cluster`: the
    ``EmbeddingHosts``, or None for an engine of this process; `engine`: the
    local engine's name (the stand-in TPU system's), None for a pooled one of
    its own; `replica_offset`: the engine replica of this worker's replica 0
    (``cluster=`` only)."""
    if cluster is None:
        return backend.LocalEngine(config, combiners, owner=owner, name=engine)
    from tf_tpu_emb.cluster import sharded  # pylint: disable=import-outside-toplevel
    return sharded.ShardedEngine(cluster, config, features, replica_offset=replica_offset,
                                 owner=owner)
