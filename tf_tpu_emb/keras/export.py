"""Serving export of a Keras model that contains :class:`TPUEmbeddingLayer` s.

:func:`export_serving` writes a SavedModel of the *whole* model (any
functional or subclassed Keras model, other inputs and layers included) in
which every ``TPUEmbeddingLayer`` is replaced by a stock-op lookup
(``tf.tpu.experimental.embedding.serving_embedding_lookup``) of its trained
tables (refreshed from the engine first).  Every traced function is checked to
contain no op of tf_tpu_emb and no TPU-embedding op, so the SavedModel loads
and serves in any TensorFlow (no tf_tpu_emb, no Keras needed).

The exported module has the surface of :func:`tf_tpu_emb.export_serving`:

* ``lookup(inputs)``: ``tf.function`` with the composite input signature (the
  model's input structure: ``tf.TensorSpec`` / ``tf.SparseTensorSpec`` /
  ``tf.RaggedTensorSpec``), returning the model's outputs;
* ``signatures["serving_default"]``: flat, plain-tensor inputs and outputs
  named by the one rule of :mod:`tf_tpu_emb.signatures` (dense ``n``; sparse
  ``n_indices``, ``n_values``, ``n_dense_shape``; ragged ``n_values``,
  ``n_row_splits``; ``output_0`` for a single output tensor, joined paths for
  a dict);
* ``tables``: ``{table name: tf.Variable}`` (``<layer>/<table>`` when the
  model has several embedding layers); ``model_variables``: the rest.
"""
import collections
import os
from typing import Iterable, Optional, Union

import keras

import tensorflow as tf
from tensorflow.python.util import nest as _nest

from tf_tpu_emb import serving as serving_lib
from tf_tpu_emb import signatures as signatures_lib
from tf_tpu_emb.keras import layers as layers_lib

__all__ = ["export_serving", "serving_module", "input_signature_of"]


def _spec_of(kt):
    shape = tf.TensorShape(kt.shape)
    dtype = tf.as_dtype(kt.dtype)
    if getattr(kt, "sparse", False):
        return tf.SparseTensorSpec(shape, dtype)
    if getattr(kt, "ragged", False):
        return tf.RaggedTensorSpec(shape, dtype, ragged_rank=1)
    return tf.TensorSpec(shape, dtype)


def input_signature_of(model: "keras.Model") -> Union[tf.TypeSpec, Iterable]:
    """The model's input structure as ``tf.TensorSpec`` / ``SparseTensorSpec`` /
    ``RaggedTensorSpec`` (functional models: from their ``keras.Input`` s)."""
    struct = getattr(model, "_inputs_struct", None)
    if struct is None:
        raise ValueError("Cannot derive an input signature from %r (not a functional "
                         "model); pass input_signature=." % (model,))
    return tf.nest.map_structure(_spec_of, struct)


def export_serving(path: Union[str, "os.PathLike[str]"], model: "keras.layers.Layer",
                   input_signature: Optional[Union[tf.TensorSpec, tf.SparseTensorSpec,
                                                   tf.RaggedTensorSpec, Iterable]] = None, *,
                   signature_name: str = "serving_default",
                   options: Optional[tf.saved_model.SaveOptions] = None) -> tf.Module:
    """Writes a stock-op SavedModel of `model` at `path` (see the module doc).

    Args:
      path: export directory.
      model: a built Keras model (or layer) containing
        :class:`~tf_tpu_emb.keras.TPUEmbeddingLayer` s.
      input_signature: the model's input structure of ``tf.TensorSpec`` /
        ``tf.SparseTensorSpec`` / ``tf.RaggedTensorSpec`` (rank 2, ragged_rank 1);
        default: from a functional model's ``keras.Input`` s (batch dimension
        left free).
      signature_name: key of the flat serving signature.
      options: optional ``tf.saved_model.SaveOptions``.

    Returns:
      The exported ``tf.Module``.

    Raises:
      tf_tpu_emb.serving.NonStockOpError: a traced function contains an op of
        tf_tpu_emb or a TPU-embedding op (nothing is written).
    """
    input_signature, emb_layers = _check(model, input_signature)
    with layers_lib.stock_lookup(emb_layers):
        module = _build(model, emb_layers, input_signature)
        # Saving may trace again: still in stock-lookup mode.
        signatures_lib.save(module, path, signature_name, options)
    serving_lib.assert_stock_ops(os.fspath(path), "exported SavedModel")
    return module


def _check(model, input_signature):
    if input_signature is None:
        input_signature = input_signature_of(model)
    emb_layers = [layer for layer in model._flatten_layers()  # pylint: disable=protected-access
                  if isinstance(layer, layers_lib.TPUEmbeddingLayer)]
    if not emb_layers:
        raise ValueError("%r has no TPUEmbeddingLayer." % (model,))
    flat_sig = _nest.flatten_with_joined_string_paths(input_signature)
    for p, spec in flat_sig:
        if not isinstance(spec, (tf.TensorSpec, tf.SparseTensorSpec, tf.RaggedTensorSpec)):
            raise TypeError("input_signature[%r] must be a tf.TensorSpec, SparseTensorSpec or "
                            "RaggedTensorSpec, got %r." % (p, spec))
        if isinstance(spec, tf.RaggedTensorSpec) and (spec.shape.rank != 2
                                                      or spec.ragged_rank != 1):
            raise ValueError("Ragged input %r must be rank 2 with ragged_rank 1." % p)

    return input_signature, emb_layers


def serving_module(model: "keras.layers.Layer",
                   input_signature: Optional[Union[tf.TensorSpec, tf.SparseTensorSpec,
                                                   tf.RaggedTensorSpec, Iterable]] = None
                   ) -> tf.Module:
    """Builds, without saving, the stock-op module :func:`export_serving`
    writes (same attributes), e.g. to score in-process.  Its functions are
    traced once, for `input_signature`."""
    input_signature, emb_layers = _check(model, input_signature)
    with layers_lib.stock_lookup(emb_layers):
        return _build(model, emb_layers, input_signature)


def _build(model, emb_layers, input_signature):
    tables = collections.OrderedDict()
    several = len(emb_layers) > 1
    for layer in emb_layers:
        for tname, states in layer.table_variables().items():
            key = "%s/%s" % (layer.name, tname) if several else tname
            tables[key] = states["parameters"].value
    return signatures_lib.build_serving_module(
        lambda inputs, weights: model(inputs, training=False), input_signature, tables,
        module_name="keras_serving", what="Keras model's serving function",
        stock_check=serving_lib.assert_stock_ops, collision_hint=".")

