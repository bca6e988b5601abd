"""Flat serving signatures: the one naming rule, and building a serving
module separated from saving it.

Every stock-op export (:func:`tf_tpu_emb.export_serving`,
:func:`tf_tpu_emb.keras.export_serving`, :func:`tf_tpu_emb.keras.export_serving_v0`,
the demo) goes through here.  SignatureDefs take plain tensors only, so a
composite input structure is served as its component tensors.

**The naming rule** (canonical, :func:`input_name`): for an input at path
``p`` (the ``/``-joined ``tf.nest`` path, e.g. ``"user"`` or
``"seq/clicks"``) the base name ``n`` is ``p`` with every non-alphanumeric
character replaced by ``_`` (TF's own rule for signature argument names), and
``arg_`` put in front when it does not start with a letter; then

* dense ``tf.TensorSpec``: ``n`` (the ids);
* ``tf.SparseTensorSpec``: ``n_indices`` (int64 ``[None, rank]``),
  ``n_values`` (the ids), ``n_dense_shape`` (int64 ``[rank]``) and, if
  weighted, ``n_weights`` (float32 ``[None]``, parallel to ``n_values``);
* ``tf.RaggedTensorSpec`` (rank 2, ragged_rank 1): ``n_values``,
  ``n_row_splits`` and, if weighted, ``n_weights``.

Outputs (:func:`output_dict`): a mapping is flattened with ``/``-joined paths
as names; any other structure is flattened to ``output_<path>`` (a single
tensor is ``output_0``).

The plain-variable V0 export predates this module and spells two corner cases
differently (an input at the empty path is ``input``, and no ``arg_`` prefix
is added): :func:`v0_input_name` keeps those names working; for paths that
start with a letter the two rules give the same names.

Building vs saving: :func:`build_serving_module` returns the module (with
``lookup``, ``serve``, ``tables``, ``model_variables``) and its signatures,
checked to contain stock ops only; :func:`save` writes it.  A caller that
only needs the module in-process (e.g. to score with it) never saves.
"""
import collections
import collections.abc
import os
import re

import tensorflow as tf
from tensorflow.python.util import nest as _nest

__all__ = ["input_name", "v0_input_name", "component_specs", "weight_spec", "output_dict",
           "FlatSignature", "build_serving_module", "save", "DEFAULT_SIGNATURE"]

#: Key of the flat serving signature unless the caller names another.
DEFAULT_SIGNATURE = "serving_default"


def input_name(path, suffix=None):
    """The canonical signature input name of component `suffix` (None for a
    dense input) of the input at `path`."""
    path = path if suffix is None else path + "/" + suffix
    name = "".join(c if c.isalnum() else "_" for c in path)
    return name if name[:1].isalpha() else "arg_" + name


def v0_input_name(path, suffix=None):
    """The V0 export's spelling (see the module doc): ``input`` for the empty
    path, no ``arg_`` prefix."""
    name = (path or "input") + ("/" + suffix if suffix else "")
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def component_specs(spec, weighted=False):
    """[(suffix, TensorSpec)] of the plain tensors making up one input."""
    if isinstance(spec, tf.SparseTensorSpec):
        rank = spec.shape.rank
        out = [("indices", tf.TensorSpec([None, rank], tf.int64)),
               ("values", tf.TensorSpec([None], spec.dtype)),
               ("dense_shape", tf.TensorSpec([rank], tf.int64))]
    elif isinstance(spec, tf.RaggedTensorSpec):
        nrows = spec.shape[0]
        out = [("values", tf.TensorSpec([None], spec.dtype)),
               ("row_splits", tf.TensorSpec([None if nrows is None else nrows + 1],
                                            spec.row_splits_dtype))]
    else:
        out = [(None, spec)]
    if weighted:
        out.append(("weights", tf.TensorSpec([None], tf.float32)))
    return out


def weight_spec(spec):
    """The float32 weights spec matching a sparse or ragged input spec."""
    if isinstance(spec, tf.SparseTensorSpec):
        return tf.SparseTensorSpec(spec.shape, tf.float32)
    return tf.RaggedTensorSpec(spec.shape, tf.float32, ragged_rank=1,
                               row_splits_dtype=spec.row_splits_dtype)


def output_dict(outputs):
    """Flattens `outputs` into the {name: Tensor} dict a SignatureDef needs."""
    if isinstance(outputs, collections.abc.Mapping):
        flat = _nest.flatten_with_joined_string_paths(outputs)
    else:
        flat = [("output_" + (p or "0"), t)
                for p, t in _nest.flatten_with_joined_string_paths(outputs)]
    result = {}
    for name, t in flat:
        if not isinstance(t, tf.Tensor):
            raise TypeError("Serving output %r is a %s; a serving signature can only return "
                            "dense tensors (e.g. call .to_tensor() in model_fn)."
                            % (name, type(t).__name__))
        result[name] = t
    return result


class FlatSignature:
    """The plain-tensor signature of a composite input structure.

    ``input_signature``: nested ``tf.TensorSpec`` / ``SparseTensorSpec`` /
    ``RaggedTensorSpec``; ``weighted``: paths of sparse/ragged inputs served
    with weights; ``name_fn``: the naming rule (:func:`input_name`).
    """

    def __init__(self, input_signature, weighted=(), name_fn=input_name,
                 collision_hint=" (feature paths map to input names by replacing "
                                "non-alphanumerics with '_')."):
        self.input_signature = input_signature
        self.flat = _nest.flatten_with_joined_string_paths(input_signature)
        weighted = set(weighted)
        self.inputs = []  # (path, suffix, name, TensorSpec)
        for p, spec in self.flat:
            for suffix, tspec in component_specs(spec, p in weighted):
                name = name_fn(p, suffix)
                self.inputs.append((p, suffix, name, tf.TensorSpec(tspec.shape, tspec.dtype,
                                                                   name)))
        names = [n for _, _, n, _ in self.inputs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError("Serving signature input names collide: %s%s"
                             % (dup, collision_hint))

    @property
    def specs(self):
        """{input name: TensorSpec}, for ``tf.function(input_signature=[...])``."""
        return {n: s for _, _, n, s in self.inputs}

    def unflatten(self, tensors):
        """(inputs in the structure of ``input_signature``, {path: weights})
        from ``{input name: Tensor}``."""
        parts = collections.defaultdict(dict)
        for p, suffix, name, _ in self.inputs:
            parts[p][suffix] = tensors[name]
        values, weights = [], {}
        for p, spec in self.flat:
            d = parts[p]
            if isinstance(spec, tf.SparseTensorSpec):
                st = tf.SparseTensor(d["indices"], d["values"], d["dense_shape"])
                st.set_shape(spec.shape)
                values.append(st)
                if "weights" in d:
                    w = tf.SparseTensor(d["indices"], d["weights"], d["dense_shape"])
                    w.set_shape(spec.shape)
                    weights[p] = w
            elif isinstance(spec, tf.RaggedTensorSpec):
                values.append(tf.RaggedTensor.from_row_splits(d["values"], d["row_splits"],
                                                              validate=True))
                if "weights" in d:
                    weights[p] = tf.RaggedTensor.from_row_splits(
                        d["weights"], d["row_splits"], validate=False)
            else:
                values.append(d[None])
        return tf.nest.pack_sequence_as(self.input_signature, values), weights


def build_serving_module(compute, input_signature, tables, *, weighted=(),
                         module_name="serving", what="lookup function", stock_check=None,
                         collision_hint=None):
    """Builds (does not save) a serving module.

    ``compute(inputs, weights)`` maps the composite inputs (and ``{path:
    weights}``, empty when nothing is weighted) to the outputs; ``tables``:
    ``{name: tf.Variable}`` the module owns.  The module gets

    * ``lookup(inputs[, weights])``: ``tf.function`` with the composite input
      signature (a weights dict of ``weight_spec`` s when `weighted`);
    * ``serve(flat)``: ``tf.function`` over ``{input name: Tensor}`` returning
      :func:`output_dict` of the outputs -- the flat signature;
    * ``tables`` and ``model_variables`` (every other variable the traced
      functions read).

    ``stock_check(concrete_function, what)`` (e.g.
    :func:`tf_tpu_emb.serving.assert_stock_ops`) runs on both functions.
    Returns the module, ready for :func:`save`.
    """
    kwargs = {} if collision_hint is None else {"collision_hint": collision_hint}
    flat_sig = FlatSignature(input_signature, weighted, **kwargs)
    weighted_paths = [p for p, _ in flat_sig.flat if p in set(weighted)]
    if weighted_paths:
        w_sig = {p: weight_spec(s) for p, s in flat_sig.flat if p in set(weighted)}

        @tf.function(input_signature=[input_signature, w_sig])
        def lookup(inputs, weights):
            return compute(inputs, weights)
    else:
        @tf.function(input_signature=[input_signature])
        def lookup(inputs):
            return compute(inputs, {})

    def serve_impl(tensors):
        inputs, weights = flat_sig.unflatten(tensors)
        return output_dict(compute(inputs, weights))

    serve = tf.function(serve_impl, input_signature=[flat_sig.specs])
    lookup_cf = lookup.get_concrete_function()
    serve_cf = serve.get_concrete_function()
    if stock_check is not None:
        stock_check(lookup_cf, what)
        stock_check(serve_cf, "serving signature")

    module = tf.Module(name=module_name)
    own = {id(v) for v in tables.values()}
    model_vars, seen = [], set()
    for cf in (lookup_cf, serve_cf):
        for v in cf.variables:
            if id(v) not in own and id(v) not in seen:
                seen.add(id(v))
                model_vars.append(v)
    module.tables = dict(tables)
    module.model_variables = model_vars
    module.lookup = lookup
    module.serve = serve
    return module


def save(module, path, signature_name=DEFAULT_SIGNATURE, options=None):
    """Writes a module from :func:`build_serving_module` as a SavedModel whose
    `signature_name` signature is its flat ``serve`` function."""
    signatures = {signature_name: module.serve.get_concrete_function()}
    tf.saved_model.save(module, os.fspath(path), signatures=signatures, options=options)


def serving_embedding_lookup(features, weights, tables, feature_config):
    """``tf.tpu.experimental.embedding.serving_embedding_lookup`` (TF's stock-op
    CPU lookup) for `features` that may cover only some of `feature_config`.

    TF 2.21 accepts inputs whose paths are a subset of the feature config;
    TF 2.16-2.20 require the very same structure (``assert_same_structure``).
    The lookup is therefore given the feature config cut down to the inputs'
    paths, which every version accepts and which returns the same outputs,
    in the inputs' structure.

    Raises:
      ValueError: an input's path is not in `feature_config`.
    """
    by_path = dict(_nest.flatten_with_joined_string_paths(feature_config))
    paths = [p for p, _ in _nest.flatten_with_joined_string_paths(features)]
    missing = [p for p in paths if p not in by_path]
    if missing:
        raise ValueError("Inputs %s are not in the feature config (its features: %s)."
                         % (missing, sorted(by_path)))
    config = _nest.pack_sequence_as(features, [by_path[p] for p in paths])
    return tf.tpu.experimental.embedding.serving_embedding_lookup(
        features, weights, tables, config)
