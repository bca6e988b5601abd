"""Optimizer classes and table descriptors, generated from the single
optimizer source :mod:`tf_tpu_emb.optimizer_specs` (which also generates the
C++ table ``core/optimizer_table.gen.h``).

For the optimizers TensorFlow's Python API lacks, each
:class:`~tf_tpu_emb.optimizer_specs.OptimizerInfo` entry with a
``class_name`` becomes a class here: its hyper-parameters (argument name,
proto field, default, validation), cross-argument checks and the update
formula for the docstring.  ``tests/ops/test_op_defs.py`` checks the registered
OpDefs against the source; ``tests/api/test_optimizer_classes.py``,
``test_optimizer_state.py`` and ``test_optimizer_descriptors.py`` check the
generated classes.  The spec's names (``OPTIMIZERS``, ``BY_PROTO_FIELD``,
``OptimizerInfo``, ``Hyper``, ...) stay importable from here.

Generated classes (``tf_tpu_emb.Momentum``, ``tf_tpu_emb.Lion``, ...) subclass
TensorFlow's ``tpu_embedding_v2_utils._Optimizer``, so they work wherever TF's
own ``tf.tpu.experimental.embedding.SGD/Adagrad/AdagradMomentum/Adam/FTRL``
do (``TableConfig(optimizer=...)``, ``TPUEmbedding*``, ``_create_slots``,
``_slot_names``/``_slot_initializers``, ``_load``/``_retrieve``), without the
protobuf-7 bug of TF's ``_set_optimization_parameters``
(docs/tpu_embedding_semantics.md §7.3: a Python bool assigned to the enum
``low_dimensional_packing_status``).  For TF's own
classes use :func:`fix_tf_optimizer`, and build table descriptors from any of
them with :func:`table_descriptor_for`.

Defaults follow TF's conventions: ``learning_rate=0.001`` as TF's v2 classes,
``beta_1``/``beta_2``/``epsilon``/``*_regularization_strength``/
``initial_accumulator_value`` argument names as TF's v2 Adam/FTRL/Adagrad,
hyper-parameter defaults from Keras' or TF v1's TPU embedding classes where
those exist, and slot initial values equal to the C++ registry's.
"""
import collections
import collections.abc
import copy
import math
import numbers
import warnings

import numpy as np
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as _op_pb2
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as _config_pb2
from tensorflow.python.ops import init_ops_v2
from tensorflow.python.tpu import tpu_embedding_v2_utils as _v2_utils


from tf_tpu_emb import ops as _ops
from tf_tpu_emb.optimizer_specs import (  # noqa: F401  (re-exported)
    BOOL, BY_PROTO_FIELD, BY_TF_CLASS, DYNAMIC, FLOAT, NON_NEGATIVE, OPTIMIZERS, POSITIVE,
    REQUIRED, UNIT, UNIT_OPEN, Check, CrossCheck, Hyper, OptimizerInfo)

_Optimizer = _v2_utils._Optimizer  # pylint: disable=protected-access
# What an optimizer argument of this package takes (the annotations' name):
# TF's own classes (tf.tpu.experimental.embedding.SGD, Adagrad, Adam, FTRL,
# ...) and this package's generated ones, all subclasses of TF's base class
# tpu_embedding_v2_utils._Optimizer.
Optimizer = _Optimizer

# ============================================================ generated classes

_GA = _op_pb2.GradientAccumulationStatus
_PACKING = _op_pb2.LowDimensionalPackingStatus

# Common arguments after the optimizer's own, in order, with defaults.
_COMMON_ARGS = (
    ("use_gradient_accumulation", True),
    ("clip_weight_min", None),
    ("clip_weight_max", None),
    ("weight_decay_factor", None),
    ("multiply_weight_decay_factor_by_learning_rate", None),
    ("clipvalue", None),
    ("slot_variable_creation_fn", None),
    ("low_dimensional_packing_status", False),
)

# The annotations of the generated classes' __init__ (strings: the API
# reference shows them as written), by argument, then by hyper-parameter kind.
_COMMON_TYPES = {
    "learning_rate": "Union[float, Callable[[], float]]",
    "use_gradient_accumulation": "bool",
    "clip_weight_min": "Optional[float]",
    "clip_weight_max": "Optional[float]",
    "weight_decay_factor": "Optional[float]",
    "multiply_weight_decay_factor_by_learning_rate": "Optional[bool]",
    "clipvalue": "Optional[Union[float, Tuple[Optional[float], Optional[float]]]]",
    "slot_variable_creation_fn": "Optional[Callable[..., Dict[str, tf.Variable]]]",
    "low_dimensional_packing_status": "bool",
}
_KIND_TYPES = {FLOAT: "float", BOOL: "bool", DYNAMIC: "Union[None, int, Callable[[], float]]"}

_COMMON_DOCS = {
    "learning_rate": "The learning rate: a float, or a callable taking no "
                     "arguments for a dynamic learning rate.",
    "use_gradient_accumulation": "Setting this to False makes embedding "
                                 "gradients calculation less accurate but faster.",
    "clip_weight_min": "The minimum value to clip the weights by; None means -infinity.",
    "clip_weight_max": "The maximum value to clip the weights by; None means +infinity.",
    "weight_decay_factor": "Amount of (decoupled) weight decay to apply; None "
                           "means that the weights are not decayed.",
    "multiply_weight_decay_factor_by_learning_rate":
        "If true, `weight_decay_factor` is multiplied by the current learning rate.",
    "clipvalue": "Controls clipping of the gradient: a positive scalar c clips "
                 "to [-c, c], a tuple (min, max) sets each side (None: no "
                 "clipping on that side). Needs gradient accumulation.",
    "slot_variable_creation_fn": "If set, a callable (table_variable, slot_names, "
                                 "slot_initializers) -> {slot name: variable} "
                                 "creating the slot variables.",
    "low_dimensional_packing_status": "TPU HBM packing of 1/2/4-wide tables "
                                      "(no effect on CPU).",
}


def _is_bool(v):
    return isinstance(v, (bool, np.bool_))


def _is_number(v):
    return isinstance(v, numbers.Real) and not _is_bool(v)


def _check_value(h, v):
    where = "Argument `%s`" % h.arg
    if h.kind == "bool":
        if not _is_bool(v):
            raise ValueError("%s must be a bool. Received: %r" % (where, v))
        return bool(v)
    if h.kind == "dynamic":
        if v is None or callable(v):
            return v
        if isinstance(v, numbers.Integral) and not _is_bool(v) and v >= 0:
            return int(v)
        raise ValueError("%s must be None, a callable taking no arguments, or a "
                         "non-negative int tag. Received: %r" % (where, v))
    if not _is_number(v) or not math.isfinite(float(v)):
        raise ValueError("%s must be a finite number. Received: %r" % (where, v))
    if h.check is not None and not h.check.ok(v):
        raise ValueError("%s %s. Received: %r" % (where, h.check.requirement, v))
    return v


def tf_has_optimizer(info):
    """Whether this TensorFlow's ``OptimizationParameters`` has the field of
    optimizer `info` (an :class:`OptimizerInfo`).  Only optimizers with a
    ``min_tf`` can be missing: FrequencyAwareAdagrad before TF 2.19."""
    return info.proto_field in _op_pb2.OptimizationParameters.DESCRIPTOR.fields_by_name


def _refuse_missing_in_tf(info):
    if not tf_has_optimizer(info):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        raise NotImplementedError(
            "%s needs TensorFlow >= %d.%d: TensorFlow %s's OptimizationParameters has "
            "no field %r" % ((info.class_name,) + info.min_tf + (tf.__version__, info.proto_field)))


def _check_common(learning_rate, values):
    if not (callable(learning_rate) or
            (_is_number(learning_rate) and math.isfinite(float(learning_rate)))):
        raise ValueError("Argument `learning_rate` must be a float or a callable "
                         "taking no arguments. Received: %r" % (learning_rate,))
    if not callable(learning_rate) and learning_rate < 0:
        raise ValueError("Argument `learning_rate` must be >= 0 (a negative rate moves the "
                         "table up the gradient). Received: %r" % (learning_rate,))
    decay = values["weight_decay_factor"]
    if _is_number(decay) and decay < 0:
        raise ValueError("Argument `weight_decay_factor` must be >= 0 (a negative factor "
                         "grows the weights). Received: %r" % (decay,))
    if not _is_bool(values["use_gradient_accumulation"]):
        raise ValueError("Argument `use_gradient_accumulation` must be a bool. "
                         "Received: %r" % (values["use_gradient_accumulation"],))
    for arg in ("clip_weight_min", "clip_weight_max", "weight_decay_factor"):
        v = values[arg]
        if v is not None and not _is_number(v):
            raise ValueError("Argument `%s` must be None or a number. Received: %r"
                             % (arg, v))
    lo, hi = values["clip_weight_min"], values["clip_weight_max"]
    if lo is not None and hi is not None and lo > hi:
        raise ValueError("Argument `clip_weight_min` (%r) must be <= `clip_weight_max` "
                         "(%r)." % (lo, hi))
    clip = values["clipvalue"]
    if clip is not None:
        if isinstance(clip, tuple):
            if len(clip) != 2 or not all(c is None or _is_number(c) for c in clip):
                raise ValueError("Argument `clipvalue` must be a positive number or a "
                                 "tuple (min, max) of numbers or None. Received: %r"
                                 % (clip,))
            if None not in clip and clip[0] > clip[1]:
                raise ValueError("Argument `clipvalue` (min, max) must have min <= max. "
                                 "Received: %r" % (clip,))
        elif not _is_number(clip) or clip <= 0:
            raise ValueError("Argument `clipvalue` must be a positive number or a tuple "
                             "(min, max) of numbers or None. Received: %r" % (clip,))
    if not _is_bool(values["low_dimensional_packing_status"]):
        raise ValueError("Argument `low_dimensional_packing_status` must be a bool. "
                         "Received: %r" % (values["low_dimensional_packing_status"],))


class EmbeddingOptimizer(_Optimizer):
    """Base of the optimizer classes generated from :data:`OPTIMIZERS`.

    A TF ``tpu_embedding_v2_utils._Optimizer``; the optimizer-specific
    arguments are attributes of the same name.  Subclasses set ``_INFO``.
    """

    _INFO = None  # the class's OptimizerInfo
    _KINDS = ()   # per hyper: its kind, 'float' | 'bool' | 'dynamic'

    def _construct(self, learning_rate, **values):
        info = type(self)._INFO
        _refuse_missing_in_tf(info)
        _check_common(learning_rate, values)
        super().__init__(
            learning_rate,
            values["use_gradient_accumulation"],
            values["clip_weight_min"],
            values["clip_weight_max"],
            values["weight_decay_factor"],
            values["multiply_weight_decay_factor_by_learning_rate"],
            values["clipvalue"],
            values.get("slot_variable_creation_fn"),
            values["low_dimensional_packing_status"],
        )
        for h in info.hypers:
            setattr(self, h.arg, _check_value(h, values[h.arg]))
        for rule in info.cross_checks:
            if not rule.ok(values):
                raise ValueError(rule.message)

    # ------------------------------------------------------- TF's interface

    def _slot_names(self):
        return list(type(self)._INFO.slots)

    def _slot_initial_values(self):
        """The slots' initial values (floats), parallel to ``_slot_names()``."""
        return [float(getattr(self, v) if isinstance(v, str) else v)
                for v in type(self)._INFO.slot_init]

    def _slot_initializers(self):
        return [init_ops_v2.Constant(v, support_partition=True)
                for v in self._slot_initial_values()]

    def _set_optimization_parameters(self, parameters, learning_rate_index=None):
        """Sets the gradient accumulation, clipping, weight decay and packing
        fields and the optimizer's oneof message with its hyper-parameters.

        The learning rate is set by the caller (TF's
        ``TableConfig._set_table_descriptor`` or :func:`table_descriptor_for`).
        ``learning_rate_index`` ({callable: tag} or a sequence of callables)
        gives the tags of callable dynamic inputs other than the learning rate
        (FrequencyAwareAdagrad's ``step_counter``).
        """
        info = type(self)._INFO
        parameters.gradient_accumulation_status = (
            _GA.ENABLED if self.use_gradient_accumulation else _GA.DISABLED)
        if self.clip_weight_min is not None:
            parameters.clipping_limits.lower.value = self.clip_weight_min
        if self.clip_weight_max is not None:
            parameters.clipping_limits.upper.value = self.clip_weight_max
        if self.clip_gradient_min is not None:
            parameters.gradient_clipping_limits.lower.value = self.clip_gradient_min
        if self.clip_gradient_max is not None:
            parameters.gradient_clipping_limits.upper.value = self.clip_gradient_max
        if self.weight_decay_factor:
            parameters.weight_decay_factor = self.weight_decay_factor
            if self.multiply_weight_decay_factor_by_learning_rate:
                parameters.multiply_weight_decay_factor_by_learning_rate = True
        # The enum, not TF's bool (docs/tpu_embedding_semantics.md §7.3).
        parameters.low_dimensional_packing_status = (
            _PACKING.ENABLED if self.low_dimensional_packing_status else _PACKING.UNSPECIFIED)
        msg = getattr(parameters, info.proto_field)
        msg.SetInParent()
        for h in info.hypers:
            if h.field is None:
                continue
            value = getattr(self, h.arg)
            if h.kind == "dynamic":
                if value is None:
                    continue
                if callable(value):
                    value = _tag_of(value, learning_rate_index, h.arg, type(self).__name__)
                getattr(msg, h.field).SetInParent()
                getattr(msg, h.field).tag = value
                continue
            if h.to_proto is not None:
                value = h.to_proto(value)
            setattr(msg, h.field, value)

    def _load(self):
        return _ops.table_ops(type(self)._INFO.proto_field).load

    def _retrieve(self):
        return _ops.table_ops(type(self)._INFO.proto_field).retrieve

    # ------------------------------------------------------------- helpers

    def _dynamic_inputs(self):
        """Callables this optimizer needs fed as dynamic inputs, in order."""
        out = [self.learning_rate] if callable(self.learning_rate) else []
        for h in type(self)._INFO.hypers:
            v = getattr(self, h.arg)
            if h.kind == "dynamic" and callable(v) and not any(v is o for o in out):
                out.append(v)
        return out

    def __repr__(self):
        info = type(self)._INFO
        args = ["learning_rate=%r" % (self.learning_rate,)]
        args += ["%s=%r" % (h.arg, getattr(self, h.arg)) for h in info.hypers]
        return "%s(%s)" % (type(self).__name__, ", ".join(args))


def _tag_of(fn, index, arg, owner):
    """The dynamic-input tag of callable `fn` in `index`."""
    if index is None:
        raise ValueError(
            "%s's `%s` is a callable, so its dynamic-input tag must come from the "
            "index of dynamic inputs: build the table descriptor with "
            "tf_tpu_emb.optimizers.table_descriptor_for(..., learning_rate_index) "
            "and feed the callables of dynamic_input_fns()." % (owner, arg))
    if not isinstance(index, collections.abc.Mapping):
        index = {f: i for i, f in enumerate(index)}
    try:
        return index[fn]
    except (KeyError, TypeError):
        raise ValueError("%s's `%s` callable %r is not in the dynamic-input index "
                         "(learning_rate_index)." % (owner, arg, fn)) from None


def _class_doc(info, params):
    lines = ["%s" % info.summary, "",
             "TPU embedding optimizer `OptimizationParameters.%s`, for "
             "`tf.tpu.experimental.embedding.TableConfig(optimizer=...)` or "
             "`TPUEmbedding(optimizer=...)` like TF's SGD/Adagrad/Adam/FTRL." % info.proto_field,
             "", "Update of each row looked up in a step (element-wise; w = row, "
             "g = its gradient, lr = learning rate):", ""]
    lines += ["    " + line for line in info.formula.splitlines()]
    if info.reconstruction:
        lines += ["", "Reconstruction: " + info.reconstruction]
    if not info.core_has_table_ops:
        lines += ["", "TF 2.21 registers no per-table Load/Retrieve op for this "
                  "optimizer; `_load()`/`_retrieve()` return tf_tpu_emb's "
                  "(TfTpuEmb>%s, TfTpuEmb>%s)." % (info.load_op, info.retrieve_op)]
    if info.slots:
        slots = ", ".join(
            "`%s` (initial value %s)" % (s, ("`%s`" % v) if isinstance(v, str) else v)
            for s, v in zip(info.slots, info.slot_init))
        lines += ["", "Slots: " + slots + "."]
    else:
        lines += ["", "Slots: none."]
    lines += ["", "Args:"]
    docs = dict(_COMMON_DOCS)
    docs.update({h.arg: h.doc for h in info.hypers})
    if info.lr_doc:
        docs["learning_rate"] = info.lr_doc
    for name, default in params:
        d = "" if default is REQUIRED else " Default: %r." % (default,)
        lines.append("  %s: %s%s" % (name, docs[name], d))
    lines += ["", "Raises:",
              "  ValueError: an argument is out of its range or of the wrong type "
              "(the message names it)."]
    return "\n".join(lines)


def _make_class(info):
    params = [("learning_rate", info.default_lr)] + [(h.arg, h.default) for h in info.hypers]
    common = [c for c in _COMMON_ARGS
              if info.slots or c[0] != "slot_variable_creation_fn"]  # as TF's SGD
    params += common
    names = [n for n, _ in params]
    defaults = dict(params)
    sig = ", ".join(n if defaults[n] is REQUIRED else "%s=__defaults[%r]" % (n, n)
                    for n in names)
    call = ", ".join("%s=%s" % (n, n) for n in names)
    src = "def __init__(self, %s):\n    self._construct(%s)\n" % (sig, call)
    namespace = {"__defaults": defaults}
    exec(src, namespace)  # pylint: disable=exec-used
    init = namespace["__init__"]
    types = dict(_COMMON_TYPES, **{
        h.arg: "Optional[%s]" % _KIND_TYPES[h.kind] if h.default is None and h.kind != DYNAMIC
        else _KIND_TYPES[h.kind] for h in info.hypers})
    init.__annotations__ = {n: types[n] for n in names}
    doc = _class_doc(info, params)
    init.__qualname__ = "%s.__init__" % info.class_name
    init.__doc__ = "Optimization parameters for %s.\n\n%s" % (
        info.class_name, doc[doc.index("Args:"):])
    cls = type(info.class_name, (EmbeddingOptimizer,), {
        "__init__": init, "__doc__": doc, "__module__": __name__,
        "_INFO": info, "_KINDS": tuple(h.kind for h in info.hypers)})
    init.__module__ = __name__
    return cls


CLASSES = {}
"""Generated class name -> class."""
for _info in OPTIMIZERS:
    if _info.class_name:
        CLASSES[_info.class_name] = globals()[_info.class_name] = _make_class(_info)
del _info

# ================================================ TF's classes and descriptors


def is_tf_optimizer(optimizer):
    """True for a TF ``_Optimizer`` that is not one of our generated classes."""
    return isinstance(optimizer, _Optimizer) and not isinstance(optimizer, EmbeddingOptimizer)


def fix_tf_optimizer(optimizer):
    """A shallow copy of TF's optimizer object whose
    ``low_dimensional_packing_status`` is the enum int (ENABLED = 1 if it was
    truthy, else UNSPECIFIED = 0), so that TF's ``_set_optimization_parameters``
    and ``TableConfig._set_table_descriptor`` work under protobuf 7 (docs/tpu_embedding_semantics.md
    §7.3).  The original is not modified; the copy compares and hashes equal to
    it.  Our own classes do not need it and are returned unchanged.

    Raises:
      ValueError: `optimizer` is not a TF TPU embedding optimizer object.
    """
    if isinstance(optimizer, EmbeddingOptimizer):
        return optimizer
    if not isinstance(optimizer, _Optimizer):
        raise ValueError("%s is an unsupported optimizer class. Pass an instance of "
                         "one of tf.tpu.experimental.embedding's optimizer classes or of "
                         "tf_tpu_emb's (e.g. tf_tpu_emb.Momentum)." % (type(optimizer),))
    fixed = copy.copy(optimizer)
    status = getattr(optimizer, "low_dimensional_packing_status", False)
    fixed.low_dimensional_packing_status = int(
        _PACKING.ENABLED if status else _PACKING.UNSPECIFIED)
    return fixed


def info_of(optimizer):
    """The :class:`OptimizerInfo` of an optimizer object (ours or TF's), or None."""
    if isinstance(optimizer, EmbeddingOptimizer):
        return type(optimizer)._INFO  # pylint: disable=protected-access
    for cls in type(optimizer).__mro__:
        if cls.__module__ == _v2_utils.__name__ and cls.__name__ in BY_TF_CLASS:
            return BY_TF_CLASS[cls.__name__]
    return None


def dynamic_input_fns(optimizer):
    """The callables `optimizer` needs fed to SendTPUEmbeddingGradients'
    ``learning_rates`` (its learning rate when callable, then any callable
    dynamic hyper-parameter such as FrequencyAwareAdagrad's ``step_counter``).
    The tag of each is its index in the caller's ``learning_rate_index``."""
    if isinstance(optimizer, EmbeddingOptimizer):
        return optimizer._dynamic_inputs()  # pylint: disable=protected-access
    lr = getattr(optimizer, "learning_rate", None)
    return [lr] if callable(lr) else []


class HyperParameterWarning(UserWarning):
    """A hyper-parameter that TF's optimizer class accepts but that can hardly
    be right (a negative learning rate, an inverted clipping range, ...): the
    engine trains with it as given, and says so once per build."""


_COMMON_NUMBERS = ("clip_weight_min", "clip_weight_max", "weight_decay_factor",
                   "clip_gradient_min", "clip_gradient_max")


def check_hyper_parameters(optimizer, table):
    """Checks `optimizer`'s hyper-parameters for table `table` before they go
    into the table's config, naming the table, the class and the field.

    Our classes check theirs at construction (ValueError); TF's accept more.
    For them a value that is not a number (``learning_rate="0.1"``) is a
    ValueError here, and a number that can hardly be right -- a negative
    learning rate or weight decay, a clipping range whose min is above its max,
    a value outside the range our class for the algorithm accepts -- a
    :class:`HyperParameterWarning`.
    """
    where = "table %r: %s" % (table, type(optimizer).__name__)
    lr = getattr(optimizer, "learning_rate", None)
    if not (callable(lr) or _is_number(lr)):
        raise ValueError("%s: `learning_rate` must be a number or a callable taking no "
                         "arguments; got %r (%s)" % (where, lr, type(lr).__name__))
    for arg in _COMMON_NUMBERS:
        v = getattr(optimizer, arg, None)
        if v is not None and not _is_number(v):
            raise ValueError("%s: `%s` must be None or a number; got %r (%s)"
                             % (where, arg, v, type(v).__name__))
    info = info_of(optimizer)
    hypers = [] if info is None else [h for h in info.hypers if h.kind == "float"]
    for h in hypers:
        v = getattr(optimizer, h.arg, None)
        if v is not None and not _is_number(v):
            raise ValueError("%s: `%s` must be a number; got %r (%s)"
                             % (where, h.arg, v, type(v).__name__))
    if isinstance(optimizer, EmbeddingOptimizer):
        return  # checked in full at construction
    doubts = []
    if _is_number(lr) and lr < 0:
        doubts.append("`learning_rate` is %r: a negative rate moves the table up the "
                      "gradient" % (lr,))
    decay = getattr(optimizer, "weight_decay_factor", None)
    if _is_number(decay) and decay < 0:
        doubts.append("`weight_decay_factor` is %r: a negative factor grows the weights"
                      % (decay,))
    for lo_arg, hi_arg, name in (("clip_gradient_min", "clip_gradient_max", "clipvalue"),
                                 ("clip_weight_min", "clip_weight_max", "clip_weight")):
        lo, hi = getattr(optimizer, lo_arg, None), getattr(optimizer, hi_arg, None)
        if _is_number(lo) and _is_number(hi) and lo > hi:
            doubts.append("`%s` (min, max) is (%r, %r): min > max, so every value is "
                          "clipped to one end" % (name, lo, hi))
    for h in hypers:
        v = getattr(optimizer, h.arg, None)
        if _is_number(v) and h.check is not None and not h.check.ok(v):
            doubts.append("`%s` is %r: it %s" % (h.arg, v, h.check.requirement))
    if doubts:
        warnings.warn("%s: %s. TF's class accepts this, so the engine trains with it as "
                      "given." % (where, "; ".join(doubts)), HyperParameterWarning,
                      stacklevel=3)


def table_descriptor_for(table_config, table_name=None, optimizer=None,
                         learning_rate_index=None, *, num_hosts=1,
                         table_descriptor=None):
    """Fills a ``TPUEmbeddingConfiguration.TableDescriptor`` from a TF
    ``TableConfig`` and an optimizer object (ours or TF's).

    Args:
      table_config: a ``tf.tpu.experimental.embedding.TableConfig``.
      table_name: the table's name; defaults to ``table_config.name``.
      optimizer: the optimizer; defaults to ``table_config.optimizer``.
      learning_rate_index: ``{callable: tag}`` (or a sequence of callables,
        tag = position) for dynamic learning rates and other dynamic inputs;
        may be None when none is callable.
      num_hosts: the vocabulary is padded to at least this (as TF does).
      table_descriptor: the descriptor to fill (e.g.
        ``config.table_descriptor.add()``); a new one when None.

    Returns:
      The descriptor: name, vocabulary_size, dimension, learning rate
      (``constant``, or ``dynamic.tag``), the optimizer's parameters and the
      table's simulated quantization.  ``num_features`` is left unset.

    Raises:
      ValueError: no optimizer, an unsupported optimizer object, no name, a
        callable missing from `learning_rate_index`, or a FrequencyEstimator
        table whose dimension is not 1.
    """
    if optimizer is None:
        optimizer = table_config.optimizer
    name = table_name if table_name is not None else table_config.name
    if not name:
        raise ValueError("The table needs a name: pass `table_name` or set "
                         "TableConfig(name=...). Received table %r" % (table_config,))
    if optimizer is None:
        raise ValueError("Table %r has no optimizer: pass `optimizer` or set "
                         "TableConfig(optimizer=...)." % (name,))
    if not isinstance(optimizer, _Optimizer):
        raise ValueError("%s is an unsupported optimizer class (table %r). Pass an "
                         "instance of one of tf.tpu.experimental.embedding's optimizer "
                         "classes or of tf_tpu_emb's." % (type(optimizer), name))
    check_hyper_parameters(optimizer, name)
    info = info_of(optimizer)
    if info is not None and info.proto_field == "frequency_estimator" and table_config.dim != 1:
        raise ValueError("FrequencyEstimator tables should only have a dimension of 1. "
                         "Received dimension %d for table %r." % (table_config.dim, name))
    td = (table_descriptor if table_descriptor is not None
          else _config_pb2.TPUEmbeddingConfiguration.TableDescriptor())
    td.name = name
    td.vocabulary_size = max(table_config.vocabulary_size, num_hosts)
    td.dimension = table_config.dim
    params = td.optimization_parameters
    lr = optimizer.learning_rate
    if callable(lr):
        params.learning_rate.dynamic.tag = _tag_of(
            lr, learning_rate_index, "learning_rate", type(optimizer).__name__)
    else:
        params.learning_rate.constant = lr
    if isinstance(optimizer, EmbeddingOptimizer):
        optimizer._set_optimization_parameters(  # pylint: disable=protected-access
            params, learning_rate_index=learning_rate_index)
    else:
        fixed = fix_tf_optimizer(optimizer)
        fixed._set_optimization_parameters(params)  # pylint: disable=protected-access
    if params.WhichOneof("parameters") is None:
        raise ValueError("%s sets no optimization algorithm (table %r); it cannot run "
                         "on the TPU embedding engine." % (type(optimizer).__name__, name))
    if table_config.quantization_config:
        quantization = table_config.quantization_config
        quantization._set_optimization_parameters(params)  # pylint: disable=protected-access
    return td


__all__ = ["OPTIMIZERS", "BY_PROTO_FIELD", "BY_TF_CLASS", "OptimizerInfo", "Hyper", "Check",
           "HyperParameterWarning", "check_hyper_parameters",
           "CrossCheck", "REQUIRED", "EmbeddingOptimizer", "CLASSES", "fix_tf_optimizer",
           "is_tf_optimizer", "info_of", "dynamic_input_fns", "table_descriptor_for"
           ] + list(CLASSES)
