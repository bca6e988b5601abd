"""Plain-dict (JSON) form of TF's TPU embedding feature configs, for Keras configs.

:func:`serialize_feature_config` turns a nested ``FeatureConfig`` structure
(dicts, lists and tuples of ``tf.tpu.experimental.embedding.FeatureConfig``)
and a global optimizer into plain Python values; :func:`deserialize_feature_config`
rebuilds equivalent objects (features sharing a ``TableConfig`` share it again).

What is kept:

* ``TableConfig``: ``vocabulary_size``, ``dim``, ``name``, ``combiner`` (a
  string; ``CustomCombiner`` is refused), ``initializer``, ``optimizer`` (or
  None: the global one), ``quantization_config``, ``dtype``.
* ``FeatureConfig``: its table, ``max_sequence_length``,
  ``validate_weights_and_indices``, ``output_shape``, ``name``.
* Optimizers (TF's ``SGD/Adagrad/AdagradMomentum/FTRL/Adam`` and
  ``tf_tpu_emb``'s classes): the class and every constructor argument, read back
  from the object (``clipvalue`` from ``clip_gradient_min/max``).
* Initializers: TF's own (``TableConfig``'s default ``TruncatedNormal``, the
  ``init_ops_v2`` classes) by class name and ``get_config()``; Keras
  initializers and registered functions through ``keras.saving``.  Any other
  callable is stored as None with a warning: after ``load_model`` the tables
  come from the saved weights anyway, only a fresh layer built from the config
  would fall back to TF's default initializer.
* Callable (dynamic) learning rates and other callable hyper-parameters go
  through ``keras.saving.serialize_keras_object`` (a registered function
  round-trips; a lambda needs ``safe_mode=False`` at load time; a closure over
  live objects, e.g. a model's optimizer step, does not survive saving).
  Callables that are the same object stay the same object (they share a
  dynamic-input tag).
"""
import inspect
import warnings
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple, Union

import keras
import tensorflow as tf
from tensorflow.python.ops import init_ops_v2
from tensorflow.python.tpu import tpu_embedding_v2_utils as v2_utils

from tf_tpu_emb import optimizers as optimizers_lib

__all__ = ["serialize_feature_config", "deserialize_feature_config",
           "serialize_optimizer", "deserialize_optimizer", "layer_arguments", "FORMAT_KEY"]

#: Marks a dict produced by :func:`serialize_feature_config`.
FORMAT_KEY = "tf_tpu_emb_feature_config"
_FEATURE_KEY = "__feature__"
_SEQ_KEY = "__list__"  # a list/tuple node: {"__list__": [...], "tuple": bool}


# ---------------------------------------------------------------- callables

class _Callables:
    """Serializes callables, keeping object identity (shared dynamic inputs)."""

    def __init__(self):
        self.items = []  # [(callable, serialized)]

    def dump(self, fn, what):
        for i, (known, _) in enumerate(self.items):
            if known is fn:
                return {"callable": i}
        try:
            serialized = keras.saving.serialize_keras_object(fn)
        except Exception as e:  # pylint: disable=broad-except
            raise ValueError(
                "%s is a callable (%r) that keras.saving cannot serialize (%s); register "
                "it with keras.saving.register_keras_serializable or use a number."
                % (what, fn, e)) from None
        self.items.append((fn, serialized))
        return {"callable": len(self.items) - 1}


def _load_callables(serialized):
    return [keras.saving.deserialize_keras_object(s) for s in serialized]


def _value(v, callables, what):
    if callable(v):
        return callables.dump(v, what)
    if hasattr(v, "item") and not isinstance(v, (list, tuple, dict)):  # numpy scalar
        return v.item()
    return v


def _unvalue(v, callables):
    if isinstance(v, dict) and set(v) == {"callable"}:
        return callables[v["callable"]]
    if isinstance(v, list):  # JSON turns tuples (clipvalue) into lists
        return tuple(v)
    return v


# ---------------------------------------------------------------- optimizers

def _optimizer_class(name, module):
    if module == "tf_tpu_emb":
        try:
            return optimizers_lib.CLASSES[name]
        except KeyError:
            raise ValueError("Unknown tf_tpu_emb optimizer class %r." % name) from None
    cls = getattr(tf.tpu.experimental.embedding, name, None)
    base = v2_utils._Optimizer  # pylint: disable=protected-access
    if cls is None or not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError("Unknown tf.tpu.experimental.embedding optimizer class %r." % name)
    return cls


def serialize_optimizer(optimizer, callables=None):
    """``{"class_name", "module", "config"}`` of a TPU embedding optimizer object.

    ``config`` holds every constructor argument (read from the object's
    attributes).  ``callables`` is internal (shared callable table)."""
    own = callables is None
    callables = callables or _Callables()
    if not isinstance(optimizer, v2_utils._Optimizer):  # pylint: disable=protected-access
        raise ValueError("%r is not a TPU embedding optimizer object." % (optimizer,))
    cls = type(optimizer)
    if isinstance(optimizer, optimizers_lib.EmbeddingOptimizer):
        module = "tf_tpu_emb"
    elif cls.__module__ == v2_utils.__name__:
        module = "tf"
    else:
        raise ValueError("Cannot serialize optimizer class %s.%s: only TF's "
                         "tf.tpu.experimental.embedding optimizers and tf_tpu_emb's are "
                         "supported." % (cls.__module__, cls.__name__))
    config = {}
    for name in inspect.signature(cls.__init__).parameters:
        if name == "self":
            continue
        if name == "clipvalue":
            lo = getattr(optimizer, "clip_gradient_min", None)
            hi = getattr(optimizer, "clip_gradient_max", None)
            if lo is None and hi is None:
                value = None
            elif lo is not None and hi is not None and lo == -hi:
                value = _value(hi, callables, name)
            else:
                value = [_value(lo, callables, name), _value(hi, callables, name)]
        elif name == "slot_variable_creation_fn":
            if getattr(optimizer, name, None) is not None:
                warnings.warn("%s's slot_variable_creation_fn is not serialized; the "
                              "rebuilt optimizer creates its slots the default way."
                              % cls.__name__)
            value = None
        else:
            if not hasattr(optimizer, name):
                raise ValueError("Cannot serialize %s: no attribute for constructor argument "
                                 "%r." % (cls.__name__, name))
            value = getattr(optimizer, name)
            if name == "low_dimensional_packing_status":
                value = bool(value)
            value = _value(value, callables, "%s.%s" % (cls.__name__, name))
        config[name] = value
    out = {"class_name": cls.__name__, "module": module, "config": config}
    if own:
        out["callables"] = [s for _, s in callables.items]
    return out


def deserialize_optimizer(config, callables=None):
    """Inverse of :func:`serialize_optimizer`."""
    if config is None:
        return None
    if callables is None:
        callables = _load_callables(config.get("callables", []))
    cls = _optimizer_class(config["class_name"], config.get("module", "tf"))
    kwargs = {k: _unvalue(v, callables) for k, v in config["config"].items()}
    return cls(**kwargs)


# -------------------------------------------------------------- initializers

def _serialize_initializer(init, table_name):
    if init is None:
        return None
    if isinstance(init, init_ops_v2.Initializer) and hasattr(init_ops_v2, type(init).__name__):
        return {"module": "init_ops_v2", "class_name": type(init).__name__,
                "config": init.get_config()}
    try:
        return {"module": "keras", "config": keras.saving.serialize_keras_object(init)}
    except Exception:  # pylint: disable=broad-except
        warnings.warn("The initializer %r of table %r cannot be serialized; the layer config "
                      "stores None (TF's default initializer). Weights saved with the model "
                      "are unaffected." % (init, table_name))
        return None


def _deserialize_initializer(config):
    if config is None:
        return None
    if config.get("module") == "init_ops_v2":
        return getattr(init_ops_v2, config["class_name"])(**config["config"])
    return keras.saving.deserialize_keras_object(config["config"])


# --------------------------------------------------------------- feature config

def serialize_feature_config(
        feature_config: Union[v2_utils.FeatureConfig, Iterable],
        optimizer: "Optional[optimizers_lib.Optimizer]" = None,
        table_optimizers: "Optional[Mapping[int, Optional[optimizers_lib.Optimizer]]]" = None
) -> Dict[str, Any]:
    """Plain-dict form of ``feature_config`` and the global ``optimizer``.

    ``table_optimizers`` (internal): ``{id(table): optimizer or None}`` to use
    instead of the tables' current ``optimizer`` attribute (TF's and our
    ``TPUEmbedding`` set it to the global optimizer in place).
    """
    callables = _Callables()
    tables = []
    table_dicts = []

    def table_index(table):
        for i, t in enumerate(tables):
            if t is table:
                return i
        if not isinstance(table, v2_utils.TableConfig):
            raise ValueError("%r is not a tf.tpu.experimental.embedding.TableConfig." % (table,))
        if not isinstance(table.combiner, str):
            raise ValueError("Table %r: only string combiners ('mean', 'sum', 'sqrtn') can "
                             "be serialized, got %r." % (table.name, table.combiner))
        if getattr(table, "layout", None) is not None:
            raise ValueError("Table %r: TableConfig.layout is not supported." % (table.name,))
        opt = (table.optimizer if table_optimizers is None
               else table_optimizers.get(id(table), table.optimizer))
        q = table.quantization_config
        tables.append(table)
        table_dicts.append({
            "vocabulary_size": int(table.vocabulary_size),
            "dim": int(table.dim),
            "name": table.name,
            "combiner": table.combiner,
            "initializer": _serialize_initializer(table.initializer, table.name),
            "optimizer": None if opt is None else serialize_optimizer(opt, callables),
            "quantization_config": None if q is None else {
                "num_buckets": int(q.num_buckets), "lower": float(q.lower),
                "upper": float(q.upper)},
            "dtype": tf.as_dtype(getattr(table, "dtype", tf.float32)).name,
        })
        return len(tables) - 1

    def node(x):
        if isinstance(x, v2_utils.FeatureConfig):
            shape = x.output_shape
            return {_FEATURE_KEY: {
                "table": table_index(x.table),
                "max_sequence_length": int(x.max_sequence_length),
                "validate_weights_and_indices": bool(x.validate_weights_and_indices),
                "output_shape": None if shape is None or shape.rank is None
                else shape.as_list(),
                "name": x.name}}
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise ValueError("Feature config dicts must have string keys, got %s."
                                 % list(x))
            return {k: node(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return {_SEQ_KEY: [node(v) for v in x], "tuple": isinstance(x, tuple)}
        raise ValueError("Feature config leaves must be FeatureConfig objects, got %r." % (x,))

    features = node(feature_config)
    glob = None if optimizer is None else serialize_optimizer(optimizer, callables)
    return {FORMAT_KEY: 1, "tables": table_dicts, "features": features, "optimizer": glob,
            "callables": [s for _, s in callables.items]}


def deserialize_feature_config(
        config: Mapping[str, Any]
) -> "Tuple[Union[v2_utils.FeatureConfig, Iterable], Optional[optimizers_lib.Optimizer]]":
    """Inverse of :func:`serialize_feature_config`: ``(feature_config, optimizer)``."""
    if not isinstance(config, dict) or FORMAT_KEY not in config:
        raise ValueError("Not a serialized tf_tpu_emb feature config: %r" % (config,))
    callables = _load_callables(config.get("callables", []))
    tables = []
    for t in config["tables"]:
        q = t.get("quantization_config")
        kwargs = dict(
            vocabulary_size=t["vocabulary_size"], dim=t["dim"],
            initializer=_deserialize_initializer(t.get("initializer")),
            optimizer=deserialize_optimizer(t.get("optimizer"), callables),
            combiner=t.get("combiner", "mean"), name=t.get("name"),
            quantization_config=None if q is None else
            tf.tpu.experimental.embedding.QuantizationConfig(**q))
        if t.get("dtype", "float32") != "float32":
            kwargs["dtype"] = tf.as_dtype(t["dtype"])
        tables.append(tf.tpu.experimental.embedding.TableConfig(**kwargs))

    def node(x):
        if isinstance(x, dict) and _FEATURE_KEY in x:
            f = x[_FEATURE_KEY]
            return tf.tpu.experimental.embedding.FeatureConfig(
                tables[f["table"]], max_sequence_length=f.get("max_sequence_length", 0),
                validate_weights_and_indices=f.get("validate_weights_and_indices", True),
                output_shape=f.get("output_shape"), name=f.get("name"))
        if isinstance(x, dict) and _SEQ_KEY in x:
            items = [node(v) for v in x[_SEQ_KEY]]
            return tuple(items) if x.get("tuple") else items
        if isinstance(x, dict):
            return {k: node(v) for k, v in x.items()}
        raise ValueError("Malformed serialized feature config node: %r" % (x,))

    features = node(config["features"])
    optimizer = deserialize_optimizer(config.get("optimizer"), callables)
    return features, optimizer


def layer_arguments(feature_config, optimizer):
    """A layer constructor's ``(feature_config, optimizer)`` as objects: both
    layers take either TF's objects or their serialised forms (what
    ``get_config`` wrote).  A serialised feature config carries the global
    optimizer, used when `optimizer` is None; a serialised `optimizer` is
    deserialised."""
    if isinstance(feature_config, dict) and FORMAT_KEY in feature_config:
        feature_config, saved_optimizer = deserialize_feature_config(feature_config)
        if optimizer is None:
            optimizer = saved_optimizer
    if isinstance(optimizer, dict):
        optimizer = deserialize_optimizer(optimizer)
    return feature_config, optimizer
