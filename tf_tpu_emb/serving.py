"""Export a trained embedding model as a SavedModel made of stock TensorFlow ops.

Training runs through the TPU embedding ops (the engine of this library); serving
must not: the exported SavedModel has to load in any TensorFlow (TF Serving, a
process that never imported ``tf_tpu_emb``).  :func:`export_serving` copies the
embedding tables into fresh variables and builds the lookup with
``tf.tpu.experimental.embedding.serving_embedding_lookup`` (TF's CPU lookup:
``embedding_lookup`` / ``safe_embedding_lookup_sparse`` / ``scatter_nd`` ...), with
the same ``FeatureConfig`` structure used for training, so dense, sparse,
ragged, weighted and sequence features give the activations the CPU path of
TF defines (see ``TPUEmbeddingForServing``).  Before saving, every traced
function (and the functions it calls) is checked to contain no op of this
library and no TPU-embedding op (:func:`assert_stock_ops`).

Example:
    ```python
    from tf_tpu_emb.serving import export_serving

    module = export_serving(
        "/tmp/export", embedding,
        input_signature={"user": tf.SparseTensorSpec([None, None], tf.int64),
                         "video": tf.RaggedTensorSpec([None, None], tf.int64)},
        model_fn=lambda act: {"logits": model(act)},   # optional
        weighted_features=["user"])                    # optional

    # Elsewhere (no tf_tpu_emb needed):
    loaded = tf.saved_model.load("/tmp/export")
    loaded.signatures["serving_default"](
        user_indices=..., user_values=..., user_dense_shape=..., user_weights=...,
        video_values=..., video_row_splits=...)
    loaded.lookup({"user": sparse, "video": ragged}, {"user": sparse_weights})
    ```

The serving signature takes plain tensors only (SignatureDefs cannot take
composite tensors); its input and output names follow the one naming rule of
:mod:`tf_tpu_emb.signatures` (e.g. a sparse feature at path ``"user"`` is
served as ``user_indices``, ``user_values``, ``user_dense_shape`` and, if
weighted, ``user_weights``).  :func:`serving_module` builds the module
without saving it (for in-process scoring); :func:`export_serving` builds and
saves.
"""
import os
from typing import Any, Callable, Iterable, List, Optional, Tuple, Union

import tensorflow as tf
# The path flattening TF's serving lookup itself uses to match inputs to features.
from tensorflow.python.util import nest as _nest

from tf_tpu_emb import signatures as _signatures
from tf_tpu_emb.ops import PREFIX
from tf_tpu_emb.signatures import DEFAULT_SIGNATURE

__all__ = ["export_serving", "serving_module", "find_non_stock_ops", "assert_stock_ops",
           "NonStockOpError", "DEFAULT_SIGNATURE"]


class NonStockOpError(ValueError):
    """A function meant for serving contains an op of tf_tpu_emb or a TPU-embedding op."""


# ------------------------------------------------------------------ stock-op check

def _is_forbidden(op_type):
    return op_type.startswith(PREFIX) or "TPUEmbedding" in op_type


def _graph_defs(obj):
    """GraphDefs of `obj`: a ConcreteFunction, tf.function (its concrete functions),
    tf.Graph, GraphDef, or a SavedModel directory (every meta graph)."""
    if isinstance(obj, (str, os.PathLike)):
        from tensorflow.core.protobuf import saved_model_pb2
        sm = saved_model_pb2.SavedModel()
        with open(os.path.join(os.fspath(obj), "saved_model.pb"), "rb") as f:
            sm.ParseFromString(f.read())
        return [mg.graph_def for mg in sm.meta_graphs]
    if isinstance(obj, tf.compat.v1.GraphDef):
        return [obj]
    if isinstance(obj, tf.Graph):
        return [obj.as_graph_def()]
    if hasattr(obj, "graph") and hasattr(obj, "structured_input_signature"):  # concrete fn
        return [obj.graph.as_graph_def()]
    if hasattr(obj, "get_concrete_function"):  # tf.function: all traced variants
        # pylint: disable-next=protected-access
        fns = obj._list_all_concrete_functions_for_serialization()
        return [f.graph.as_graph_def() for f in fns]
    raise TypeError("Expected a ConcreteFunction, tf.function, tf.Graph, GraphDef or "
                    "SavedModel path, got %r" % (obj,))


def find_non_stock_ops(
        obj: Union["tf.types.experimental.ConcreteFunction",
                   "tf.types.experimental.GenericFunction", tf.Graph, "tf.compat.v1.GraphDef",
                   str, "os.PathLike[str]"]
) -> List[Tuple[str, str]]:
    """Sorted ``(where, op_type)`` pairs of forbidden ops in `obj` (see `_graph_defs`).

    Forbidden: any op of this library (type ``TfTpuEmb>...``) and any TPU-embedding
    op of TF (a type containing ``TPUEmbedding``: Enqueue*/Recv*/Send*/
    TPUEmbeddingActivations/Load*/Retrieve*/Configure*/...), none of which a CPU
    serving process can run.  Function-library bodies are walked too; ``where`` is
    ``"<graph>"`` or the library function's name, plus the node name.
    """
    found = set()
    for gd in _graph_defs(obj):
        for node in gd.node:
            if _is_forbidden(node.op):
                found.add(("<graph>:" + node.name, node.op))
        for fdef in gd.library.function:
            for node in fdef.node_def:
                if _is_forbidden(node.op):
                    found.add(("%s:%s" % (fdef.signature.name, node.name), node.op))
    return sorted(found)


def assert_stock_ops(
        obj: Union["tf.types.experimental.ConcreteFunction",
                   "tf.types.experimental.GenericFunction", tf.Graph, "tf.compat.v1.GraphDef",
                   str, "os.PathLike[str]"],
        what: str = "function") -> None:
    """Raise :class:`NonStockOpError` if `obj` contains a non-stock op (see
    :func:`find_non_stock_ops`)."""
    bad = find_non_stock_ops(obj)
    if bad:
        raise NonStockOpError(
            "The %s to export for serving contains ops that only tf_tpu_emb or a TPU can "
            "run, so the SavedModel would not load or serve in stock TensorFlow: %s. "
            "Serving must use stock lookups (tf.tpu.experimental.embedding."
            "serving_embedding_lookup), not the TPU-embedding ops of training."
            % (what, ", ".join("%s (%s)" % (t, w) for w, t in bad)))


# ------------------------------------------------------------------ helpers

def _feature_config_of(embedding):
    fc = getattr(embedding, "feature_config", None)
    if fc is None:
        fc = getattr(embedding, "_feature_config", None)
    if fc is None:
        raise ValueError("%r has no `feature_config` (nor `_feature_config`); pass "
                         "feature_config= explicitly." % (embedding,))
    return fc


def _without_training_batch(embedding, feature_config):
    """A SparseCore (``TPUEmbeddingV2``) object's features carry the
    per-replica training batch as ``output_shape`` (TPUEmbeddingV2 needs it);
    a served batch has any size, so the served features drop it (same
    tables, names and sequence lengths)."""
    import copy
    from tf_tpu_emb import sparsecore_checkpoint
    if not sparsecore_checkpoint.is_v2(embedding):
        return feature_config

    def served(fc):
        fc = copy.copy(fc)
        fc.output_shape = tf.TensorShape(None)
        return fc
    return tf.nest.map_structure(served, feature_config)


def _tables_by_config(embedding, fc_by_path):
    """``{TableConfig: parameters}`` of `embedding`.  A SparseCore
    (``TPUEmbeddingV2``) object keys ``embedding_tables`` by stacked table and
    keeps them sharded and stacked; its per-table parameters come out by its
    layouts (:func:`tf_tpu_emb.sparsecore_checkpoint.tables_of`)."""
    from tf_tpu_emb import sparsecore_checkpoint
    if not sparsecore_checkpoint.is_v2(embedding):
        return embedding.embedding_tables
    per_table = sparsecore_checkpoint.tables_of(embedding)
    out = {}
    for fc in fc_by_path.values():
        name = fc.table.name
        if fc.table not in out:
            if name not in per_table:
                raise ValueError("Table %r of the feature config is not a table of the "
                                 "TPUEmbeddingV2 object (its tables: %s)"
                                 % (name, sorted(per_table)))
            out[fc.table] = per_table[name]["parameters"]
    return out


# ------------------------------------------------------------------ export

def export_serving(path: Union[str, "os.PathLike[str]"], embedding: Any,
                   input_signature: Union[tf.TensorSpec, tf.SparseTensorSpec,
                                          tf.RaggedTensorSpec, Iterable],
                   model_fn: Optional[Callable[[Any], Any]] = None, *,
                   weighted_features: Iterable[str] = (),
                   feature_config: Optional[Union["tf.tpu.experimental.embedding.FeatureConfig",
                                                  Iterable]] = None,
                   signature_name: str = DEFAULT_SIGNATURE,
                   options: Optional[tf.saved_model.SaveOptions] = None) -> tf.Module:
    """Write a SavedModel at `path` that serves `embedding` (+ `model_fn`) with stock ops.

    :func:`serving_module` builds the module (arguments and result there);
    this writes it with its flat ``serve`` function as
    ``signatures[signature_name]`` (``options``: ``tf.saved_model.SaveOptions``).
    Returns the module.
    """
    module = serving_module(embedding, input_signature, model_fn,
                            weighted_features=weighted_features, feature_config=feature_config)
    _signatures.save(module, path, signature_name, options)
    return module


def serving_module(embedding: Any,
                   input_signature: Union[tf.TensorSpec, tf.SparseTensorSpec,
                                          tf.RaggedTensorSpec, Iterable],
                   model_fn: Optional[Callable[[Any], Any]] = None, *,
                   weighted_features: Iterable[str] = (),
                   feature_config: Optional[Union["tf.tpu.experimental.embedding.FeatureConfig",
                                                  Iterable]] = None) -> tf.Module:
    """Builds, without saving, the stock-op module that serves `embedding` (+ `model_fn`).

    Args:
      embedding: an object with ``embedding_tables`` (``{TableConfig: tf.Variable
        or tensor}``, the trained parameters) and a feature config
        (``feature_config`` or, as on TF's ``TPUEmbeddingForServing``,
        ``_feature_config``): e.g. :class:`tf_tpu_emb.TPUEmbedding`,
        ``tf.tpu.experimental.embedding.TPUEmbeddingForServing``, or a
        ``TPUEmbeddingV2`` (SparseCore) object, whose stacked, sharded
        tables are unstacked per table first.  The parameter
        values are copied (at export time) into new variables owned by the
        exported module (``module.tables[<table name>]``).
      input_signature: nested structure of ``tf.TensorSpec`` (dense ids),
        ``tf.SparseTensorSpec`` or ``tf.RaggedTensorSpec`` (rank 2) whose paths are
        a subset of the feature config's paths.
      model_fn: optional callable ``activations -> outputs`` run on the
        activations (same structure as `input_signature`, each ``output_shape +
        [dim]`` as TF's serving lookup defines it), e.g. a built Keras model or a
        plain function; the variables it reads are tracked automatically (build
        Keras models before exporting).  Default: the activations are returned.
      weighted_features: ``/``-joined paths (e.g. ``"user"``, ``"seq/clicks"``) of
        sparse or ragged features that are served with float32 weights.
      feature_config: overrides the feature config read from `embedding`.

    Returns:
      The ``tf.Module`` (usable in-process; a SavedModel written by
      :func:`export_serving` has the same attributes when loaded):

      * ``lookup(features[, weights])`` — tf.function with a composite input
        signature (``input_signature``, and when `weighted_features` is non-empty
        a dict ``{path: SparseTensorSpec/RaggedTensorSpec(float32)}`` of weights);
        returns ``model_fn(activations)`` (or the activations).
      * ``serve(flat_inputs)`` — tf.function taking one ``{input name: Tensor}``
        dict, saved as the serving signature (there called with keyword
        arguments; names by :mod:`tf_tpu_emb.signatures`); returns a flat
        ``{name: Tensor}`` dict.
      * ``tables`` — ``{table name: tf.Variable}``; ``model_variables`` — the
        variables captured from `model_fn`.

    Raises:
      NonStockOpError: a traced function contains an op of tf_tpu_emb or a
        TPU-embedding op (nothing is written).
      ValueError / TypeError: invalid signature, paths or weights.
    """
    if feature_config is None:
        feature_config = _feature_config_of(embedding)
        feature_config = _without_training_batch(embedding, feature_config)
    fc_by_path = dict(_nest.flatten_with_joined_string_paths(feature_config))
    flat_sig = _nest.flatten_with_joined_string_paths(input_signature)
    if not flat_sig:
        raise ValueError("input_signature is empty.")
    weighted = set(weighted_features)

    for p, spec in flat_sig:
        if p not in fc_by_path:
            raise ValueError("input_signature path %r is not a feature of the feature config "
                             "(features: %s)." % (p, sorted(fc_by_path)))
        if not isinstance(spec, (tf.TensorSpec, tf.SparseTensorSpec, tf.RaggedTensorSpec)):
            raise TypeError("input_signature[%r] must be a tf.TensorSpec, tf.SparseTensorSpec "
                            "or tf.RaggedTensorSpec, got %r." % (p, spec))
        if isinstance(spec, tf.RaggedTensorSpec) and (spec.shape.rank != 2
                                                      or spec.ragged_rank != 1):
            raise ValueError("Ragged feature %r must be rank 2 with ragged_rank 1, got %r."
                             % (p, spec))
        if p in weighted:
            if isinstance(spec, tf.TensorSpec):
                raise ValueError("Feature %r is dense; only sparse or ragged features take "
                                 "weights." % p)
            if fc_by_path[p].max_sequence_length > 0:
                raise ValueError("Feature %r is a sequence feature; it takes no weights." % p)
    unknown = weighted - {p for p, _ in flat_sig}
    if unknown:
        raise ValueError("weighted_features %s are not paths of input_signature (paths: %s)."
                         % (sorted(unknown), [p for p, _ in flat_sig]))

    # Fresh variables owned by the module, holding copies of the trained tables.
    src_tables = _tables_by_config(embedding, fc_by_path)
    names = [getattr(t, "name", None) for t in src_tables]
    if None in names or len(set(names)) != len(names):
        names = ["table_%d" % i for i in range(len(names))]
    tables, by_name = {}, {}
    with tf.init_scope():
        for name, (table, value) in zip(names, src_tables.items()):
            if isinstance(value, tf.Variable):
                value = value.read_value()
            var = tf.Variable(tf.identity(value), name=_signatures.input_name(name),
                              trainable=False)
            tables[table] = var
            by_name[name] = var

    used_tables = {fc_by_path[p].table for p, _ in flat_sig}
    missing = [getattr(t, "name", t) for t in used_tables if t not in tables]
    if missing:
        raise ValueError("embedding.embedding_tables has no parameters for tables %s used by "
                         "the input_signature." % missing)

    def compute(features, weights):
        if weights:
            flat_w = [weights.get(p) for p, _ in flat_sig]
            weights = tf.nest.pack_sequence_as(input_signature, flat_w)
        else:
            weights = None
        act = _signatures.serving_embedding_lookup(features, weights, tables, feature_config)
        return act if model_fn is None else model_fn(act)

    return _signatures.build_serving_module(
        compute, input_signature, by_name, weighted=weighted, module_name="serving",
        what="lookup function", stock_check=assert_stock_ops)
