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
import collections

from tf_tpu_emb import backend

__all__ = ["Feature", "create"]

# One flat feature of the model, as a backend needs it: its path, its
# activation's per-replica output shape (a list), its table's vocabulary size
# and combiner.
Feature = collections.namedtuple("Feature", "path output_shape vocabulary_size combiner")


def create(config, *, owner, combiners, features, cluster=None, engine=None,
           replica_offset=0):
    """The backend of `owner` (the ``TPUEmbedding``) for the serialised
    ``TPUEmbeddingConfiguration`` `config`.  `combiners`: per table (the local
    engine's); `features`: :class:`Feature` s in the config's feature order
    (the hosts' router's).  `cluster`: the ``EmbeddingHosts``, or None for an
    engine of this process; `engine`: the local engine's name (the stand-in
    TPU system's), None for a pooled one of its own; `replica_offset`: the
    engine replica of this worker's replica 0 (``cluster=`` only)."""
    if cluster is None:
        return backend.LocalEngine(config, combiners, owner=owner, name=engine)
    from tf_tpu_emb.cluster import routing  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb.cluster import sharded  # pylint: disable=import-outside-toplevel
    routes = [routing.FeatureRoute(f.path, list(f.output_shape), f.vocabulary_size, f.combiner)
              for f in features]
    return sharded.ShardedEngine(cluster, config, routes, replica_offset=replica_offset,
                                 owner=owner)
