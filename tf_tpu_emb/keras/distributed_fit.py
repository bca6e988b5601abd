"""Keras 3's ``fit`` under a ``tf.distribute`` strategy, with SparseTensor /
RaggedTensor inputs: the workaround both tf_tpu_emb layers install
(``TPUEmbeddingLayer`` in :mod:`tf_tpu_emb.keras.layers`,
``TPUEmbeddingV0Layer`` in :mod:`tf_tpu_emb.keras.v0_layers`), in a module of
its own so that neither layer module depends on the other.

A model gets it by containing a layer whose class sets
``_tf_tpu_emb_layer = True`` (both layers do), or explicitly with
:func:`fix_distributed_fit`.
"""
import functools
import threading

import keras
import tensorflow as tf

__all__ = ["fix_distributed_fit", "install_distributed_fit_fix"]


def fix_distributed_fit(model: "keras.Model") -> "keras.Model":
    """Lets ``model.fit/evaluate/predict`` under a ``tf.distribute`` strategy
    take SparseTensor / RaggedTensor inputs (returns ``model``).

    Keras 3 (TF backend), before the first step under a strategy, averages the
    first distributed batch across replicas (``strategy.reduce("MEAN")``,
    which fails on composite tensors: "'SparseTensor' object has no attribute
    'device'") and then traces the model on *dense* symbolic stand-ins of the
    inputs.  This replaces that build step, on this model instance, by one
    that calls the model on the first replica's actual batch (composite
    tensors intact) and builds the compiled loss, metrics and the optimizer
    from the output shapes, as Keras does.  Without a strategy, and for
    models whose inputs are all dense, Keras' own step runs unchanged.
    """
    original = model._maybe_symbolic_build  # pylint: disable=protected-access

    def _maybe_symbolic_build(iterator=None, data_batch=None):
        return _composite_aware_build(model, original, iterator, data_batch)

    object.__setattr__(model, "_maybe_symbolic_build", _maybe_symbolic_build)
    return model


_auto_fix_lock = threading.Lock()
_auto_fix_installed = False


def install_distributed_fit_fix():
    """Applies :func:`fix_distributed_fit` automatically (called by the
    layers' constructors; idempotent): ``keras.Model``'s symbolic build step
    takes the composite-aware path for every model that contains a
    tf_tpu_emb layer (``TPUEmbeddingLayer`` / ``TPUEmbeddingV0Layer``) and runs
    under a strategy; every other model keeps Keras' own step unchanged."""
    global _auto_fix_installed
    with _auto_fix_lock:
        if _auto_fix_installed:
            return
        original = keras.Model._maybe_symbolic_build  # pylint: disable=protected-access

        def _maybe_symbolic_build(self, iterator=None, data_batch=None):
            if getattr(self, "_distribute_strategy", None) is not None and any(
                    getattr(layer, "_tf_tpu_emb_layer", False)
                    for layer in self._flatten_layers()):  # pylint: disable=protected-access
                return _composite_aware_build(
                    self, functools.partial(original, self), iterator, data_batch)
            return original(self, iterator=iterator, data_batch=data_batch)

        # pylint: disable-next=protected-access
        keras.Model._maybe_symbolic_build = _maybe_symbolic_build
        _auto_fix_installed = True


def _composite_aware_build(model, original, iterator, data_batch):
    """The symbolic build step of :func:`fix_distributed_fit`; ``original``
    is Keras' own (bound to ``model``)."""
    from keras.src import backend as keras_backend  # pylint: disable=import-outside-toplevel

    strategy = model._distribute_strategy  # pylint: disable=protected-access
    if strategy is None:
        return original(iterator=iterator, data_batch=data_batch)
    batch = data_batch
    if iterator is not None:
        for _, _, it in iterator:
            batch = next(it)  # fit/evaluate/predict reset the iterator afterwards
            break

    def local(v):
        if isinstance(v, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(v)[0]
        return v

    flat = tf.nest.flatten(batch)
    if not any(isinstance(local(v), (tf.SparseTensor, tf.RaggedTensor)) for v in flat):
        # All dense: Keras' own step (average of the replicas' batches).
        if all(isinstance(v, tf.distribute.DistributedValues) for v in flat):
            batch = strategy.reduce("MEAN", batch, axis=None)
        return original(data_batch=batch)
    data_batch = tf.nest.map_structure(local, batch)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data_batch)

    def spec(t):
        return None if t is None else keras.KerasTensor(t.shape, t.dtype)

    with strategy.scope():
        metrics = model._compile_metrics  # pylint: disable=protected-access
        loss = model._compile_loss  # pylint: disable=protected-access
        metrics_unbuilt = metrics is not None and not metrics.built
        loss_unbuilt = loss is not None and not loss.built
        layers = model._flatten_layers()  # pylint: disable=protected-access
        if metrics_unbuilt or loss_unbuilt or not all(layer.built for layer in layers):
            y_pred = tf.nest.map_structure(spec, model(x, training=False))
            y, sample_weight = (tf.nest.map_structure(spec, y),
                                tf.nest.map_structure(spec, sample_weight))
            if metrics_unbuilt:
                keras_backend.compute_output_spec(model.compute_metrics, None, y, y_pred,
                                                  sample_weight=sample_weight)
            if loss_unbuilt:
                compute_loss = model._compute_loss  # pylint: disable=protected-access
                keras_backend.compute_output_spec(compute_loss, None, y, y_pred,
                                                  sample_weight=sample_weight,
                                                  training=False)
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        model._post_build()  # pylint: disable=protected-access
    return None
