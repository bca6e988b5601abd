"""The engine-backed Keras layer's table mirrors: Keras weights that mirror
the engine's tables and slots (see :mod:`tf_tpu_emb.keras.layers`)."""
import weakref

import keras
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

try:  # Keras-internal: stateless (symbolic) assigns.
    from keras.src.backend.common.stateless_scope import in_stateless_scope
except ImportError:  # pragma: no cover
    def in_stateless_scope():
        return False

__all__ = ["TableVariable", "eager_host_context"]


def eager_host_context():
    """True where a layer may run the engine's Load/Retrieve ops now."""
    return (tf.executing_eagerly() and not in_stateless_scope()
            and (not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context()))


class TableVariable(keras.Variable):
    """Non-trainable Keras weight mirroring one table state of the engine.

    A plain host variable (never a distributed one, whatever strategy is
    active).  Eager assignments are written through to the engine; reads of
    the owner's weights refresh it from the engine first (see the module doc).
    The owner (a ``TPUEmbeddingLayer``) is reached through its public mirror
    hooks only: ``assign_mirror``, ``sync_from_engine``, ``mirror_restored``.
    """

    def __init__(self, *args, owner=None, table_id=0, state="parameters", **kwargs):
        self._owner_ref = weakref.ref(owner) if owner is not None else None
        self.table_id = table_id
        self.state = state
        super().__init__(*args, **kwargs)

    def _initialize(self, value):
        with tf.init_scope(), tf.device("/CPU:0"):
            self._value = resource_variable_ops.ResourceVariable(
                initial_value=value, dtype=self._dtype, trainable=False, name=self.name)

    def _owner(self):
        return self._owner_ref() if self._owner_ref is not None else None

    def assign(self, value):
        owner = self._owner()
        if owner is None:
            return super().assign(value)
        return owner.assign_mirror(self, value, super().assign)

    def _serialize_to_tensors(self):
        owner = self._owner()
        if owner is not None:
            owner.sync_from_engine()
        return super()._serialize_to_tensors()

    def _restore_from_tensors(self, restored_tensors):
        result = super()._restore_from_tensors(restored_tensors)
        owner = self._owner()
        if owner is not None:
            owner.mirror_restored(self)
        return result
