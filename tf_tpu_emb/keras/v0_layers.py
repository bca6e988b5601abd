"""`TPUEmbeddingV0Layer`: a Keras layer over :class:`tf_tpu_emb.TPUEmbeddingV0`.

The layer's tables are ordinary Keras weights (``trainable_weights``), so
``model.fit`` trains them with the *model's* optimizer, on the default
strategy or under ``MirroredStrategy`` (create the model in
``strategy.scope()``; sparse or ragged inputs there need
:func:`tf_tpu_emb.keras.fix_distributed_fit`, a Keras 3 workaround the layers
apply by themselves, see :mod:`tf_tpu_emb.keras.distributed_fit`).  Inputs are
the nested feature structure of ``feature_config`` (dense, ``tf.SparseTensor``
or ``tf.RaggedTensor`` ids per feature), optionally with a ``weights``
structure; lookups use the fused ``embedding_bag`` op, and the tables'
gradients are ``tf.IndexedSlices`` (unique rows per table).

``get_config`` turns TF's ``TableConfig`` / ``FeatureConfig`` (and the
embedding optimizer, if any) into plain dicts with
:func:`tf_tpu_emb.keras.config.serialize_feature_config` (the format
``TPUEmbeddingLayer`` uses), so ``model.save("m.keras")``
and ``keras.models.load_model`` round-trip (the class is registered as
``tf_tpu_emb>TPUEmbeddingV0Layer`` when this module is imported: import
``tf_tpu_emb.keras`` before loading).

Serving: the fused op is not a stock TensorFlow op.  :func:`export_serving_v0`
writes a SavedModel in which every ``TPUEmbeddingV0Layer`` looks up with
``tf.tpu.experimental.embedding.serving_embedding_lookup`` (stock
``safe_embedding_lookup_sparse`` / gather ops) on the same tables, so it loads
with plain TensorFlow.  The activations are the training lookup's, except
that the serving lookup drops ids < 0 and, for mean/sqrtn, entries with
weight <= 0 (``FeatureConfig.validate_weights_and_indices``).
"""
import contextlib
import os
import threading
import warnings
from typing import Any, Dict, Iterable, Optional, Union

import keras
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v2_utils as v2_utils
from tensorflow.python.util import nest

from tf_tpu_emb import layout as layout_lib
from tf_tpu_emb import optimizers as optimizers_lib
from tf_tpu_emb import signatures as signatures_lib
from tf_tpu_emb import structure
from tf_tpu_emb.keras import config as config_lib
from tf_tpu_emb.keras import distributed_fit
from tf_tpu_emb.keras.distributed_fit import fix_distributed_fit  # noqa: F401 (its old home)
from tf_tpu_emb.v0 import TPUEmbeddingV0

__all__ = ["TPUEmbeddingV0Layer", "export_serving_v0", "serving_lookups", "fix_distributed_fit"]

# ----------------------------------------------------------------- serving

_SERVING = threading.local()


@contextlib.contextmanager
def serving_lookups():
    """Within this context (in this thread) every :class:`TPUEmbeddingV0Layer`
    looks up with ``tf.tpu.experimental.embedding.serving_embedding_lookup``
    (stock TF ops) instead of the fused op -- for tracing serving graphs."""
    depth = getattr(_SERVING, "depth", 0)
    _SERVING.depth = depth + 1
    try:
        yield
    finally:
        _SERVING.depth = depth


def _serving_active():
    return getattr(_SERVING, "depth", 0) > 0


# ------------------------------------------------------------------- layer

@keras.saving.register_keras_serializable(package="tf_tpu_emb")
class TPUEmbeddingV0Layer(keras.layers.Layer):
    """Keras layer for TF's TPU embedding configs, backed by
    :class:`tf_tpu_emb.TPUEmbeddingV0`.

    Args:
      feature_config: a nested structure of
        ``tf.tpu.experimental.embedding.FeatureConfig`` (also accepted: the
        dict :func:`tf_tpu_emb.keras.config.serialize_feature_config` makes;
        its global optimizer is used when ``optimizer`` is None).
      optimizer: optional ``tf.tpu.experimental.embedding`` optimizer; as in
        TF's V0 it only decides which slot variables exist (created as
        non-trainable weights, or by its ``slot_variable_creation_fn``).  The
        tables are trained by the model's optimizer.
      **kwargs: ``keras.layers.Layer`` arguments (``name``, ...).

    Call: ``layer(features, weights=None)`` -> activations in the structure
    of ``feature_config`` (``TPUEmbeddingV0.embedding_lookup``).
    """

    _tf_tpu_emb_layer = True  # models containing it get the distributed-fit fix

    def __init__(self, feature_config: Union[v2_utils.FeatureConfig, Iterable, Dict[str, Any]],
                 optimizer: "Optional[Union[optimizers_lib.Optimizer, Dict[str, Any]]]" = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        distributed_fit.install_distributed_fit_fix()
        feature_config, optimizer = config_lib.layer_arguments(feature_config, optimizer)
        self._embedding_optimizer = optimizer
        # TPUEmbeddingV0 gives tables without optimizer the layer's one in
        # place; remember which had none (or had the layer's), for get_config.
        self._table_optimizers = {}
        for feature in nest.flatten(feature_config):
            table = getattr(feature, "table", None)
            if table is not None and id(table) not in self._table_optimizers:
                opt = table.optimizer
                self._table_optimizers[id(table)] = None if opt is optimizer else opt
        self._embedding = TPUEmbeddingV0(feature_config, optimizer,
                                         variable_creator=self._create_weight)

    @property
    def embedding(self):
        """The underlying :class:`tf_tpu_emb.TPUEmbeddingV0`."""
        return self._embedding

    @property
    def feature_config(self):
        return self._embedding.feature_config

    @property
    def embedding_tables(self):
        """``{TableConfig: keras.Variable}`` (builds the layer if needed)."""
        if not self.built:
            self.build()
        return self._embedding.embedding_tables

    def _create_weight(self, name, shape, initializer, trainable):
        return self.add_weight(name=name.replace("/", "_"), shape=shape,
                               initializer=initializer, dtype="float32",
                               trainable=trainable)

    def build(self, *args, **kwargs):
        del args, kwargs  # the tables do not depend on the input shapes
        if self.built:
            return
        self._embedding.ensure_built()
        self.built = True

    def call(self, features: Union[tf.Tensor, tf.SparseTensor, tf.RaggedTensor, Iterable],
             weights: Optional[Union[tf.SparseTensor, tf.RaggedTensor, Iterable]] = None
             ) -> Union[tf.Tensor, Iterable]:
        if _serving_active():
            tables = {table: variable.value if isinstance(variable, keras.Variable) else variable
                      for table, variable in self._embedding.embedding_tables.items()}
            return signatures_lib.serving_embedding_lookup(
                features, weights, tables, self.feature_config)
        return self._embedding.embedding_lookup(features, weights)

    def compute_output_spec(
            self, features: Union["keras.KerasTensor", Iterable],
            weights: Optional[Union["keras.KerasTensor", Iterable]] = None
    ) -> Union["keras.KerasTensor", Iterable]:
        # Keras traces symbolic calls with dense placeholders for ragged
        # inputs, so the shapes follow TPUEmbeddingV0's rules here.
        del weights
        structure.assert_same_structure(self.feature_config, features, "the layer's inputs")
        specs = [keras.KerasTensor(self._output_shape(x, feature), dtype="float32")
                 for x, feature in zip(nest.flatten(features),
                                       nest.flatten(self.feature_config))]
        return nest.pack_sequence_as(features, specs)

    @staticmethod
    def _output_shape(x, feature):
        if getattr(x, "ragged", False) or isinstance(x, tf.RaggedTensor):
            kind = "ragged"
        elif getattr(x, "sparse", False) or isinstance(x, tf.SparseTensor):
            kind = "sparse"
        else:
            kind = "dense"
        return layout_lib.v0_output_shape(feature, x.shape, kind)

    def get_config(self):
        config = super().get_config()
        table_optimizers = {
            id(feature.table): self._table_optimizers.get(
                id(feature.table),
                None if feature.table.optimizer is self._embedding_optimizer
                else feature.table.optimizer)
            for feature in nest.flatten(self.feature_config)}
        config.update({
            # Holds the layer's (global) optimizer too: one table of callables.
            "feature_config": config_lib.serialize_feature_config(
                self.feature_config, self._embedding_optimizer, table_optimizers),
        })
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)  # the constructor deserialises (config.layer_arguments)


# ------------------------------------------------------------------ export

def _spec_of(x):
    shape = list(x.shape)
    if shape:
        shape[0] = None
    if getattr(x, "sparse", False):
        return tf.SparseTensorSpec(shape, x.dtype)
    if getattr(x, "ragged", False):
        return tf.RaggedTensorSpec(shape, x.dtype, ragged_rank=len(shape) - 1,
                                   row_splits_dtype=tf.int64)
    return tf.TensorSpec(shape, x.dtype)


def _flat_signature(input_signature):
    """The flat signature of the inputs (see :func:`export_serving_v0`), or None
    if some input has no plain-tensor form."""
    for _, spec in nest.flatten_with_joined_string_paths(input_signature):
        if isinstance(spec, tf.RaggedTensorSpec) and spec.ragged_rank != 1:
            return None
        if not isinstance(spec, (tf.SparseTensorSpec, tf.RaggedTensorSpec, tf.TensorSpec)):
            return None
    return signatures_lib.FlatSignature(input_signature,
                                        name_fn=signatures_lib.v0_input_name,
                                        collision_hint="; rename a feature")


def _path_first(path, model, filepath):
    """(path, model) from export_serving_v0's arguments, old orders included
    (with a DeprecationWarning)."""
    def is_path(x):
        return isinstance(x, (str, bytes, os.PathLike))
    if filepath is not None:
        if model is not None and path is not None:
            raise TypeError("export_serving_v0: pass either path or filepath, not both")
        warnings.warn("export_serving_v0(model, filepath=...) is deprecated: pass the path "
                      "first, export_serving_v0(path, model), as export_serving takes them",
                      DeprecationWarning, stacklevel=3)
        return filepath, path if model is None else model
    if not is_path(path) and is_path(model):
        warnings.warn("export_serving_v0(model, filepath) is deprecated: pass the path first, "
                      "export_serving_v0(path, model), as export_serving takes them",
                      DeprecationWarning, stacklevel=3)
        return model, path
    if not is_path(path):
        raise TypeError("export_serving_v0: path must be a str or os.PathLike, got %s"
                        % type(path).__name__)
    if model is None:
        raise TypeError("export_serving_v0(path, model): model is missing")
    return path, model


def export_serving_v0(path: Union[str, "os.PathLike[str]"], model: Optional["keras.Model"] = None,
                      input_signature: Optional[Any] = None, *,
                      filepath: Optional[str] = None) -> "tf.types.experimental.GenericFunction":
    """Writes ``model`` as a TF SavedModel of stock ops only.

    The arguments come in :func:`tf_tpu_emb.keras.export_serving`'s order,
    ``export_serving_v0(path, model)``.  The order of earlier releases,
    ``export_serving_v0(model, filepath)`` (or ``filepath=`` by keyword),
    still works and warns (``DeprecationWarning``).

    Every :class:`TPUEmbeddingV0Layer` in the traced graphs looks up with
    ``serving_embedding_lookup`` on its (same) tables instead of the fused
    op, so ``tf.saved_model.load(path)`` works in a TensorFlow without
    ``tf_tpu_emb``.  The SavedModel has

    * ``serve(inputs)``: a ``tf.function`` taking the model's input structure
      (dense Tensors, SparseTensors, RaggedTensors), returning its outputs;
    * the ``serving_default`` signature (TF Serving): the same, with the
      composite inputs passed as their component tensors, named by the rule
      of :mod:`tf_tpu_emb.signatures` (V0 spelling, :func:`v0_input_name`:
      the joined path, every character but ``[A-Za-z0-9_]`` replaced by
      ``_``, plus ``_indices``, ``_values``, ``_dense_shape`` (sparse) or
      ``_values``, ``_row_splits`` (ragged), e.g. ``item_watched_values``;
      dense inputs are named by their path), outputs as
      :func:`tf_tpu_emb.signatures.output_dict` names them.

    Args:
      path: the SavedModel directory.
      model: a built ``keras.Model``.
      input_signature: the model's input structure of ``tf.TensorSpec`` /
        ``tf.SparseTensorSpec`` / ``tf.RaggedTensorSpec``; default: derived
        from a Functional model's inputs (``keras.Input(sparse=True)`` /
        ``ragged=True`` become sparse / ragged specs).
      filepath: deprecated spelling of ``path``.

    Returns:
      The ``serve`` ``tf.function``.
    """
    path, model = _path_first(path, model, filepath)
    if input_signature is None:
        structure = getattr(model, "_inputs_struct", None)
        if structure is None:
            raise ValueError("Pass input_signature for a model that is not Functional.")
        input_signature = nest.map_structure(_spec_of, structure)

    def outputs_of(inputs):
        return model(inputs, training=False)

    # A plain tf.Module holding the variables: tracking the Keras model itself
    # would make TF trace Keras' default signature, which feeds dense
    # placeholders to sparse and ragged inputs.
    root = tf.Module()
    root.model_variables = [v.value if isinstance(v, keras.Variable) else v
                            for v in model.variables]
    with serving_lookups():
        root.serve = tf.function(outputs_of, input_signature=[input_signature],
                                 autograph=False)
        root.serve.get_concrete_function()
        signatures = None
        flat = _flat_signature(input_signature)
        if flat is not None:
            def serving_default(**tensors):
                return signatures_lib.output_dict(outputs_of(flat.unflatten(tensors)[0]))
            signatures = {signatures_lib.DEFAULT_SIGNATURE: tf.function(
                serving_default, autograph=False).get_concrete_function(**flat.specs)}
        tf.saved_model.save(root, path, signatures=signatures)
    return root.serve
