"""A CPU stand-in for the TPU system: TPU programs, unchanged, on the engine.

``tf_tpu_emb.tpu.install(replicas=N)`` (or ``python -m tf_tpu_emb.run
--replicas N SCRIPT``) puts a TPU system of N CPU replicas behind
TensorFlow's public TPU names: ``TPUClusterResolver`` (any ``tpu``),
``experimental_connect_to_cluster``, ``initialize_tpu_system`` /
``shutdown_tpu_system``, ``tf.distribute.TPUStrategy`` (and the
``experimental`` one) and ``tf.tpu.experimental.embedding.TPUEmbedding``,
which builds ``tf_tpu_emb.TPUEmbedding``.  With ``embedding="v2"``
(``--embedding v2``) the system is a SparseCore TPU instead and
``tf.tpu.experimental.embedding.TPUEmbeddingV2`` is TF's own class on the
op library's SparseCore kernels.  docs/guides/tpu-unchanged.md tells what it
stands in for and what it cannot be.

Modules: ``system`` (the TPU system and its rules), ``strategy`` (resolver
and strategy), ``install`` (rebinding TF's public names), ``embedding_v2``
(what TF's ``TPUEmbeddingV2`` needs of a TPU: the seams).
"""
from tf_tpu_emb.tpu.install import install, installed, uninstall

__all__ = ["install", "installed", "uninstall"]
