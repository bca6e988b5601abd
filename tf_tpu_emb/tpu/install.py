"""Putting the stand-in behind TensorFlow's public TPU names, and taking it away.

Only TensorFlow's public API module objects (``tensorflow._api.*``: what
``tf.``, ``tf.compat.v2.``, ``tf.compat.v1.`` and ``import
tensorflow.compat.v2 as tf`` reach) are rebound -- never TF's implementation
modules (``tensorflow.python.*``, whose own ``isinstance`` checks keep
meaning TF's classes) and never a client library:

=================================================  ===================================
public name                                        under the stand-in
=================================================  ===================================
``distribute.cluster_resolver.TPUClusterResolver`` :class:`strategy.TPUClusterResolver`
``config.experimental_connect_to_cluster``         no-op for a stand-in resolver
``tpu.experimental.initialize_tpu_system``         :meth:`system.TPUSystem.initialize`
``tpu.experimental.shutdown_tpu_system``           :meth:`system.TPUSystem.shutdown`
``distribute.TPUStrategy``,                        :class:`strategy.TPUStrategy`
``distribute.experimental.TPUStrategy``
``tpu.experimental.embedding.TPUEmbedding``        ``tf_tpu_emb.TPUEmbedding``
``tpu.experimental.embedding.TPUEmbeddingV2``      :class:`embedding_v2.TPUEmbeddingV2`
                                                   (``embedding="v2"`` only)
=================================================  ===================================

``embedding`` picks the TPU generation the system stands in for: ``"v1"``
(the default; the TensorCore-attached embedding) or ``"v2"`` (a SparseCore
TPU that TF's own ``TPUEmbeddingV2`` drives: tf_tpu_emb/tpu/embedding_v2.py
lists its seams); unset, ``$TF_TPU_EMB_EMBEDDING`` decides.

A library that checks for a TPU the way TF documents (``isinstance`` against
``tf.distribute.TPUStrategy``, ``strategy.extended.tpu_hardware_feature``) and
builds ``tf.tpu.experimental.embedding.TPUEmbedding`` therefore trains
through the engine with no code of its own here.
"""
import importlib
import os
import sys
import threading

import tensorflow as tf

from tf_tpu_emb import mid_level
from tf_tpu_emb.tpu import embedding_v2
from tf_tpu_emb.tpu import strategy as strategy_lib
from tf_tpu_emb.tpu import system as system_lib

__all__ = ["install", "uninstall", "installed"]

# Public API modules that hold the names above (imported first, so that a
# lazily loaded one is rebound too).
_API_MODULES = [prefix + suffix
                for prefix in ("tensorflow._api.v2.", "tensorflow._api.v2.compat.v2.",
                               "tensorflow._api.v2.compat.v1.")
                for suffix in ("distribute", "distribute.experimental",
                               "distribute.cluster_resolver", "config", "config.experimental",
                               "tpu.experimental", "tpu.experimental.embedding")]

_lock = threading.Lock()
_rebound = []   # (module, attribute, TF's object), to restore on uninstall


def installed():
    """The installed stand-in TPU system (:class:`system.TPUSystem`), or None."""
    return system_lib.current()


def _initialize_tpu_system(cluster_resolver=None):
    """``tf.tpu.experimental.initialize_tpu_system`` of the stand-in: resets the
    system's embedding; returns its ``tf.tpu.experimental.Topology``."""
    del cluster_resolver  # every resolver resolves to the one local system
    if not tf.executing_eagerly():
        raise RuntimeError("initialize_tpu_system is not supported within tf.functions.  "
                           "You should call initialize_tpu_system outside of your tf.function. ")
    system = system_lib.current()
    system.initialize()
    return tf.tpu.experimental.Topology(serialized=system.topology_proto().SerializeToString())


def _shutdown_tpu_system(cluster_resolver=None):
    del cluster_resolver
    if not tf.executing_eagerly():
        raise RuntimeError("shutdown_tpu_system is not supported within tf.functions.")
    system_lib.current().shutdown()


def _connect_to_cluster_fn(original):
    def experimental_connect_to_cluster(cluster_spec_or_resolver, *args, **kwargs):
        """A stand-in resolver's TPU system is this process: nothing to connect."""
        if isinstance(cluster_spec_or_resolver, strategy_lib.TPUClusterResolver):
            return None
        return original(cluster_spec_or_resolver, *args, **kwargs)
    return experimental_connect_to_cluster


# The environment variable that picks the embedding generation when
# install() is not told (module doc).
EMBEDDING_VARIABLE = "TF_TPU_EMB_EMBEDDING"


def _embedding_from(embedding):
    if embedding is None:
        embedding = os.environ.get(EMBEDDING_VARIABLE, "") or "v1"
    if embedding not in system_lib.EMBEDDINGS:
        raise ValueError("embedding must be one of %s (install(embedding=...), $%s), got %r"
                         % (", ".join(system_lib.EMBEDDINGS), EMBEDDING_VARIABLE, embedding))
    return embedding


def _replacements(embedding):
    """TF's public object -> the stand-in's."""
    connect = tf.config.experimental_connect_to_cluster
    extra = {}
    if embedding == "v2":
        extra[tf.tpu.experimental.embedding.TPUEmbeddingV2] = embedding_v2.TPUEmbeddingV2
    return {**extra,
        tf.distribute.cluster_resolver.TPUClusterResolver: strategy_lib.TPUClusterResolver,
        connect: _connect_to_cluster_fn(connect),
        tf.tpu.experimental.initialize_tpu_system: _initialize_tpu_system,
        tf.tpu.experimental.shutdown_tpu_system: _shutdown_tpu_system,
        tf.distribute.TPUStrategy: strategy_lib.TPUStrategy,
        tf.distribute.experimental.TPUStrategy: strategy_lib.TPUStrategy,
        tf.tpu.experimental.embedding.TPUEmbedding: mid_level.TPUEmbedding,
    }


def _logical_cpus(replicas):
    """Splits the host CPU into `replicas` logical devices (before TF's runtime
    starts), or checks that enough are there."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        if len(tf.config.get_logical_device_configuration(cpu) or [None]) < replicas:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    except RuntimeError:
        pass  # the runtime is up: the devices it has are what there is
    have = len(tf.config.list_logical_devices("CPU"))
    if have < replicas:
        raise RuntimeError(
            "tf_tpu_emb.tpu.install(replicas={}): TensorFlow's runtime already started "
            "with {} logical CPU device(s).  Install the stand-in before the program "
            "runs any TensorFlow op, or run it with python -m tf_tpu_emb.run --replicas {} "
            "SCRIPT.".format(replicas, have, replicas))


def install(replicas=1, embedding=None):
    """Installs the CPU stand-in for the TPU system (docs/guides/tpu-unchanged.md):
    a TPU system of ``replicas`` cores, each a logical CPU device,
    behind TF's public TPU names.  ``embedding``: ``"v1"`` (TensorCore
    embedding, the default) or ``"v2"`` (a SparseCore TPU for TF's
    ``TPUEmbeddingV2``); None reads ``$TF_TPU_EMB_EMBEDDING``.  Call it
    before the program runs any TensorFlow op (the logical devices must be
    set up first).  Installing again with the same replicas and embedding is
    a no-op; returns the system."""
    embedding = _embedding_from(embedding)
    with _lock:
        system = system_lib.current()
        if system is not None:
            if system.replicas != replicas or system.embedding != embedding:
                raise RuntimeError("the stand-in TPU system is installed with %d replica(s), "
                                   "embedding %s; uninstall() it first"
                                   % (system.replicas, system.embedding))
            return system
        _logical_cpus(replicas)
        system = system_lib.TPUSystem(replicas, embedding)
        system.publish_chips()
        replacements = _replacements(embedding)
        for name in _API_MODULES:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        for name, module in list(sys.modules.items()):
            if module is None or not (name == "tensorflow" or name.startswith("tensorflow._api.")):
                continue
            for attr, value in list(vars(module).items()):
                try:
                    replacement = replacements.get(value)
                except TypeError:  # unhashable
                    continue
                if replacement is not None:
                    setattr(module, attr, replacement)
                    _rebound.append((module, attr, value))
        system_lib._set_current(system)  # pylint: disable=protected-access
        return system


def uninstall():
    """Restores TF's public TPU names and removes the stand-in system (its
    embedding engine is shut down)."""
    with _lock:
        system = system_lib.current()
        if system is None:
            return
        system.shutdown()
        system.publish_chips(installed=False)
        while _rebound:
            module, attr, value = _rebound.pop()
            setattr(module, attr, value)
        system_lib._set_current(None)  # pylint: disable=protected-access
