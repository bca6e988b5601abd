"""The single source of truth for the TPU embedding optimizers.

One frozen :class:`OptimizerInfo` entry per ``OptimizationParameters`` oneof
field drives both languages:

* Python (:mod:`tf_tpu_emb.optimizers`): the optimizer classes TF's Python API
  lacks, their argument validation and docstrings, the proto they write, and
  the Load/Retrieve op wrappers of :mod:`tf_tpu_emb.ops`.
* C++: ``tools/gen_optimizers.py`` turns this module into the checked-in
  ``core/optimizer_table.gen.h`` -- one named hyper-parameter struct per
  optimizer, its proto reader, its dynamic inputs, its slots' initial values,
  its laziness and the ``AllOptimizers()`` table.  ``tests/ops/test_gen_optimizers.py``
  regenerates the header and fails when it differs from the checked-in one.

Only the update formulas are written by hand: one C++ function per optimizer
in ``core/optimizer_formulas.h`` (taking the generated struct) and one numpy
reference in ``tests/common/optimizer_reference.py``.  Adding an optimizer is one
entry here, one formula there and one reference; see ARCHITECTURE.md.

This module imports neither TensorFlow nor the op library.
"""
import collections
import dataclasses
import operator
from typing import Any, Callable, Optional, Tuple, Union

REQUIRED = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()
"""Default of an argument that has none (the caller must pass it)."""

Check = collections.namedtuple("Check", ["ok", "requirement"])
Check.__doc__ = """A validation rule: ``ok(value) -> bool`` and the text that
completes "Argument `x` ..." in the ValueError."""


def _interval(lo=None, hi=None, lo_open=False, hi_open=False):
    """Check for lo <(=) value <(=) hi (either bound optional)."""
    parts = []
    if lo is not None:
        parts.append("%s %s" % (">" if lo_open else ">=", lo))
    if hi is not None:
        parts.append("%s %s" % ("<" if hi_open else "<=", hi))

    def ok(v):
        if lo is not None and (v <= lo if lo_open else v < lo):
            return False
        if hi is not None and (v >= hi if hi_open else v > hi):
            return False
        return True
    return Check(ok, "must be " + " and ".join(parts))


POSITIVE = _interval(0, lo_open=True)
NON_NEGATIVE = _interval(0)
UNIT = _interval(0, 1)                      # [0, 1]
UNIT_OPEN = _interval(0, 1, hi_open=True)   # [0, 1)

FLOAT, BOOL, DYNAMIC = "float", "bool", "dynamic"
"""Hyper-parameter kinds: a float or bool proto field, or an
``OptimizerDynamicInput`` message (a value fed at every step by tag)."""


@dataclasses.dataclass(frozen=True)
class Hyper:
    """One typed, named hyper-parameter of an optimizer.

    arg: Python argument (and attribute) name of the generated class; for
      optimizers TF's Python API covers, the name of TF's argument.
    field: field of the optimizer's ``OptimizationParameters`` oneof message
      that receives it (also the C++ struct member), or None for a
      Python-only argument (a slot's initial value).
    default: default value, or REQUIRED.
    check: a :class:`Check` on the value (numbers), or None.
    doc: argument documentation.
    to_proto: value -> proto value (e.g. ``operator.not_`` for ``lazy_*``).
    kind: FLOAT, BOOL or DYNAMIC (the proto field's type; DYNAMIC is an
      ``OptimizerDynamicInput``: a callable fed like a dynamic learning rate,
      a non-negative int tag, or None).
    """
    arg: str
    field: Optional[str]
    default: Any = None
    check: Optional[Check] = None
    doc: str = ""
    to_proto: Optional[Callable[[Any], Any]] = None
    kind: str = FLOAT

    def _replace(self, **changes):
        return dataclasses.replace(self, **changes)


CrossCheck = collections.namedtuple("CrossCheck", ["ok", "message"])
CrossCheck.__doc__ = """A rule over all arguments: ``ok(args: dict) -> bool``
and the ValueError message."""


@dataclasses.dataclass(frozen=True)
class OptimizerInfo:
    """One TPU embedding optimizer.

    proto_field: the ``OptimizationParameters`` oneof field ("adagrad", ...).
    op_infix: ``Load/RetrieveTPUEmbedding<op_infix>Parameters``; the op names
      themselves are :attr:`load_op` / :attr:`retrieve_op`.
    slots: slot names in TF's order (the Load op's inputs after ``parameters``).
    core_has_table_ops: TF 2.21 registers the per-table Load/Retrieve ops
      (otherwise only our prefixed ones exist).
    slot_init: per slot, its initial value (float) or the name of the argument
      that holds it.  The engine starts a slot at the float, at the proto
      field of that argument when it has one, else at the argument's default.
    class_name: name of the class :mod:`tf_tpu_emb.optimizers` generates, or None.
    tf_class: name of TF's own class (``tf.tpu.experimental.embedding.<name>``)
      for optimizers TF's Python API covers, or None.
    hypers: typed hyper-parameters (:class:`Hyper`): the generated class's
      optimizer-specific arguments in order, or TF's class's for tf_class
      entries (documentation only there).  Those with a proto field make the
      C++ struct; DYNAMIC ones are the engine's extra dynamic inputs.
    cross_checks: :class:`CrossCheck` rules over all arguments.
    default_lr: the default learning rate, or REQUIRED.
    formula: the update rule, for the docstring.
    reconstruction: for rules TF does not publish, how ours was reconstructed.
    summary: the docstring's first line.
    lr_doc: documentation of `learning_rate` when it is not the usual one.
    non_lazy_field: bool proto field that, when true, makes the engine also
      update the rows a step did not touch (with g = 0); None: always lazy.
    implemented: False: the engine refuses the optimizer at configure.
    min_tf: (major, minor) of the first TensorFlow whose protos have
      ``proto_field``, or None (all supported versions).  On an older TF the
      generated C++ leaves the optimizer out of the table and the engine
      refuses a config carrying it with Unimplemented; the Python class
      refuses to be built.
    proto_number: the field number of ``proto_field`` in
      ``OptimizationParameters``; required with ``min_tf`` (an older TF's
      parser keeps the field as an unknown field of that number).
    """
    proto_field: str
    op_infix: str
    slots: Tuple[str, ...]
    core_has_table_ops: bool
    slot_init: Tuple[Union[float, str], ...] = ()
    class_name: Optional[str] = None
    tf_class: Optional[str] = None
    hypers: Tuple[Hyper, ...] = ()
    cross_checks: Tuple[CrossCheck, ...] = ()
    default_lr: Any = 0.001
    formula: str = ""
    reconstruction: str = ""
    summary: str = ""
    lr_doc: str = ""
    non_lazy_field: Optional[str] = None
    implemented: bool = True
    min_tf: Optional[Tuple[int, int]] = None
    proto_number: Optional[int] = None

    @property
    def load_op(self):
        """TF's (bare) name of the per-table Load op; ours is prefixed."""
        return "LoadTPUEmbedding%sParameters" % self.op_infix

    @property
    def retrieve_op(self):
        """TF's (bare) name of the per-table Retrieve op; ours is prefixed."""
        return "RetrieveTPUEmbedding%sParameters" % self.op_infix

    @property
    def engine_hypers(self):
        """The hyper-parameters the engine reads from the proto (C++ struct)."""
        return tuple(h for h in self.hypers if h.field is not None and h.kind != DYNAMIC)

    @property
    def dynamic_inputs(self):
        """Hyper-parameters fed at every step by tag, besides the learning rate."""
        return tuple(h for h in self.hypers if h.kind == DYNAMIC)

    def hyper(self, arg):
        """The :class:`Hyper` named `arg`."""
        for h in self.hypers:
            if h.arg == arg:
                return h
        raise KeyError("%s has no hyper-parameter %r" % (self.proto_field, arg))


def _requires_accumulation_when_non_lazy(lazy_arg, name):
    return CrossCheck(
        lambda a: a["use_gradient_accumulation"] or a[lazy_arg],
        "When disabling lazy %s (`%s=False`), gradient accumulation must be used. "
        "Set `use_gradient_accumulation` to True." % (name, lazy_arg))


_L1 = Hyper("l1_regularization_strength", "l1", 0.0, NON_NEGATIVE,
            "L1 regularization strength, >= 0.")
_L2 = Hyper("l2_regularization_strength", "l2", 0.0, NON_NEGATIVE,
            "L2 regularization strength, >= 0.")


def _initial_accumulator(default=0.1, check=POSITIVE, what="accumulator"):
    return Hyper("initial_accumulator_value", None, default, check,
                 "Initial value of the `%s` slot." % what)


OPTIMIZERS = (
    OptimizerInfo("stochastic_gradient_descent", "StochasticGradientDescent", (), True,
                  slot_init=(), tf_class="SGD"),
    OptimizerInfo("adagrad", "Adagrad", ("accumulators",), True,
                  slot_init=(0.1,), tf_class="Adagrad"),
    OptimizerInfo("adagrad_momentum", "AdagradMomentum", ("accumulators", "momenta"), True,
                  slot_init=(0.0, 0.0), tf_class="AdagradMomentum",
                  hypers=(Hyper("momentum", "momentum", REQUIRED),
                          Hyper("use_nesterov", "use_nesterov", False, kind=BOOL),
                          Hyper("exponent", "exponent", 2.0),
                          Hyper("beta2", "beta2", 1.0),
                          Hyper("epsilon", "epsilon", 1e-10))),
    OptimizerInfo(
        "bounded_adagrad", "BoundedAdagrad", ("accumulators",), False,
        slot_init=("initial_accumulator_value",), class_name="BoundedAdagrad",
        summary="Adagrad with a bounded accumulator and a bounded weight update.",
        hypers=(
            Hyper("update_accumulator_first", "update_accumulator_first", False, None,
                  "Use the updated (True) or the old (False) accumulator for the "
                  "effective learning rate.", kind=BOOL),
            Hyper("max_var_update", "max_var_update", 0.0, NON_NEGATIVE,
                  "Bound on |weight update| per element; 0 disables the bound."),
            Hyper("max_accumulator", "max_accumulator", 0.0, NON_NEGATIVE,
                  "Bound on the accumulator; 0 disables the bound."),
            _initial_accumulator(),
        ),
        formula="""\
a_new = a + g^2, then min(a_new, max_accumulator) if max_accumulator > 0
a_eff = a_new if update_accumulator_first else a
delta = lr * g / sqrt(a_eff), clipped to [-max_var_update, max_var_update]
        if max_var_update > 0
w = w - delta;  a = a_new""",
        reconstruction="TF publishes only the meaning of the parameters "
                       "(docs/tpu_embedding_semantics.md §5.4); the formula "
                       "above is tf_tpu_emb's "
                       "reconstruction."),
    OptimizerInfo("adam", "ADAM", ("momenta", "velocities"), True,
                  slot_init=(0.0, 0.0), tf_class="Adam", non_lazy_field="use_non_lazy_adam",
                  hypers=(Hyper("beta_1", "beta1", 0.9),
                          Hyper("beta_2", "beta2", 0.999),
                          Hyper("epsilon", "epsilon", 1e-7),
                          Hyper("lazy_adam", "use_non_lazy_adam", True, kind=BOOL,
                                to_proto=operator.not_),
                          Hyper("sum_inside_sqrt", "use_sum_inside_sqrt", True, kind=BOOL))),
    OptimizerInfo("ftrl", "FTRL", ("accumulators", "linears"), True,
                  slot_init=(0.1, 0.0), tf_class="FTRL",
                  hypers=(Hyper("l1_regularization_strength", "l1", 0.0),
                          Hyper("l2_regularization_strength", "l2", 0.0),
                          Hyper("learning_rate_power", "lr_power", -0.5),
                          Hyper("beta", "beta", 0.0),
                          Hyper("multiply_linear_by_learning_rate", "multiply_linear_by_lr",
                                False, kind=BOOL))),
    OptimizerInfo(
        "momentum", "Momentum", ("momenta",), True,
        slot_init=(0.0,), class_name="Momentum",
        summary="Momentum (heavy ball or Nesterov), as TF's ApplyMomentum.",
        hypers=(
            Hyper("momentum", "momentum", 0.9, UNIT, "The momentum, in [0, 1]."),
            Hyper("use_nesterov", "use_nesterov", False, None,
                  "Use Nesterov momentum (Sutskever et al., 2013).", kind=BOOL),
        ),
        formula="""\
m = momentum * m + g
w = w - lr * (g + momentum * m  if use_nesterov else  m)"""),
    OptimizerInfo(
        "rms_prop", "RMSProp", ("ms", "mom"), True,
        slot_init=(1.0, 0.0), class_name="RMSProp",
        summary="RMSProp, as TF's ApplyRMSProp.",
        hypers=(
            Hyper("rho", "rho", 0.9, UNIT, "Decay of the mean square, in [0, 1]."),
            Hyper("momentum", "momentum", 0.0, UNIT, "The momentum, in [0, 1]."),
            Hyper("epsilon", "epsilon", 1e-7, POSITIVE,
                  "Small constant added to the mean square, > 0."),
        ),
        formula="""\
ms = rho * ms + (1 - rho) * g^2
mom = momentum * mom + lr * g / sqrt(ms + epsilon)
w = w - mom"""),
    OptimizerInfo(
        "centered_rms_prop", "CenteredRMSProp", ("ms", "mom", "mg"), True,
        slot_init=(1.0, 0.0, 0.0), class_name="CenteredRMSProp",
        summary="Centered RMSProp, as TF's ApplyCenteredRMSProp.",
        hypers=(
            Hyper("rho", "rho", 0.9, UNIT, "Decay of the moments, in [0, 1]."),
            Hyper("momentum", "momentum", 0.0, UNIT, "The momentum, in [0, 1]."),
            Hyper("epsilon", "epsilon", 1e-7, POSITIVE,
                  "Small constant added to the variance estimate, > 0."),
        ),
        formula="""\
ms = rho * ms + (1 - rho) * g^2
mg = rho * mg + (1 - rho) * g
mom = momentum * mom + lr * g / sqrt(ms - mg^2 + epsilon)
w = w - mom"""),
    OptimizerInfo("mdl_adagrad_light", "MDLAdagradLight",
                  ("accumulators", "weights", "benefits"), True,
                  slot_init=(0.1, 0.0, 0.0), implemented=False),
    OptimizerInfo(
        "adadelta", "Adadelta", ("accumulators", "updates"), True,
        slot_init=(0.0, 0.0), class_name="Adadelta",
        summary="Adadelta, as TF's ApplyAdadelta.",
        hypers=(
            Hyper("rho", "rho", 0.95, UNIT, "Decay of the accumulators, in [0, 1]."),
            Hyper("epsilon", "epsilon", 1e-7, POSITIVE, "Small constant, > 0."),
        ),
        formula="""\
a = rho * a + (1 - rho) * g^2
delta = sqrt(u + epsilon) / sqrt(a + epsilon) * g
w = w - lr * delta
u = rho * u + (1 - rho) * delta^2
(a = `accumulators`, u = `updates`)"""),
    OptimizerInfo(
        "proximal_adagrad", "ProximalAdagrad", ("accumulators",), True,
        slot_init=("initial_accumulator_value",), class_name="ProximalAdagrad",
        summary="Proximal Adagrad (FOBOS), as TF's ApplyProximalAdagrad.",
        hypers=(_L1, _L2, _initial_accumulator()),
        formula="""\
a = a + g^2;  eta = lr / sqrt(a);  v = w - eta * g
w = sign(v) * max(|v| - eta * l1, 0) / (1 + eta * l2)   if l1 > 0
w = v / (1 + eta * l2)                                   otherwise"""),
    OptimizerInfo(
        "online_yogi", "OnlineYogi", ("vs", "linears"), False,
        slot_init=("initial_accumulator_value", 0.0), class_name="OnlineYogi",
        summary="Online Yogi: FTRL-style Yogi with L1/L2.",
        hypers=(_L1, _L2,
                Hyper("beta_2", "beta2", 0.999, UNIT_OPEN,
                      "Decay of the second moment, in [0, 1)."),
                _initial_accumulator(what="vs")),
        formula="""\
v_new = v - (1 - beta_2) * sign(v - g^2) * g^2
sigma = (sqrt(v_new) - sqrt(v)) / lr
z = z + g - sigma * w
w = (clip(z, -l1, l1) - z) / (sqrt(v_new) / lr + 2 * l2);  v = v_new
(v = `vs`, z = `linears`)""",
        reconstruction="TF does not publish the formula "
                       "(docs/tpu_embedding_semantics.md §5.13: Yogi "
                       "\"plus some extensions based on FTRL\"); the rule above "
                       "-- FTRL whose accumulator is Yogi's second moment -- is "
                       "tf_tpu_emb's reconstruction."),
    OptimizerInfo(
        "proximal_yogi", "ProximalYogi", ("v", "m"), True,
        slot_init=("initial_accumulator_value", 0.0), class_name="ProximalYogi",
        summary="Proximal Yogi: Yogi with proximal L1/L2, no bias correction.",
        hypers=(_L1, _L2,
                Hyper("beta_1", "beta1", 0.9, UNIT_OPEN,
                      "Decay of the first moment, in [0, 1)."),
                Hyper("beta_2", "beta2", 0.999, UNIT_OPEN,
                      "Decay of the second moment, in [0, 1)."),
                Hyper("epsilon", "epsilon", 1e-3, POSITIVE, "Small constant, > 0."),
                _initial_accumulator(check=NON_NEGATIVE, what="v")),
        formula="""\
m = beta_1 * m + (1 - beta_1) * g
v = v - (1 - beta_2) * sign(v - g^2) * g^2
eta = lr / (sqrt(v) + epsilon);  u = w - eta * m
w = sign(u) * max(|u| - eta * l1, 0) / (1 + eta * l2)""",
        reconstruction="TF does not publish the TPU formula "
                       "(docs/tpu_embedding_semantics.md §5.14); the "
                       "rule above (TF-Addons' Yogi with proximal L1/L2) is "
                       "tf_tpu_emb's reconstruction. Bias correction, as for "
                       "Adam, goes through a dynamic learning rate."),
    OptimizerInfo(
        "frequency_estimator", "FrequencyEstimator", ("last_hit_step",), True,
        slot_init=(0.0,), class_name="FrequencyEstimator", default_lr=REQUIRED,
        lr_doc="The global step, as a callable taking no arguments returning "
               "it as a float (fed as a dynamic learning rate); a constant "
               "freezes the step.",
        summary="Estimates how often each id is looked up (not a real optimizer).",
        hypers=(
            Hyper("tau", "tau", REQUIRED, _interval(0, 1, lo_open=True),
                  "Learning rate of the delta estimate, in (0, 1]."),
            Hyper("max_delta", "max_delta", REQUIRED, POSITIVE,
                  "Maximum value of delta (steps since the id's last hit), > 0."),
            Hyper("outlier_threshold", "outlier_threshold", REQUIRED, POSITIVE,
                  "A delta >= outlier_threshold * D is an outlier, > 0."),
            Hyper("weight_exponent", "weight_exponent", REQUIRED, None,
                  "Exponent turning the estimated delta into weights, "
                  "(D / max_delta)^weight_exponent (stored; not applied by the "
                  "engine)."),
        ),
        formula="""\
The table ("parameters", width 1) holds the estimated delta D of each id;
`learning_rate` must carry the global step (a callable, i.e. a dynamic
learning rate); the gradients sent back are ignored (send zeros).
delta = step - last_hit_step
clipped = min(delta, max_delta)
D = clipped  if delta >= outlier_threshold * D  else  D * (1 - tau) + clipped * tau
last_hit_step = step
Estimated frequency = 1 / D; initialise the table to max_delta
(TableConfig(initializer=tf.constant_initializer(max_delta))).""",
        reconstruction="The update sequence is the proto's; that the learning "
                       "rate carries the global step follows TF v1's "
                       "documentation and is how tf_tpu_emb's engine reads it "
                       "(a reconstruction of the TPU behaviour, "
                       "docs/tpu_embedding_semantics.md §5.15)."),
    OptimizerInfo(
        "lion", "Lion", ("momenta",), False,
        slot_init=(0.0,), class_name="Lion",
        summary="Lion (Chen et al. 2023, arXiv 2302.06675).",
        hypers=(
            Hyper("beta_1", "beta1", 0.9, UNIT,
                  "Interpolation factor of the update direction, in [0, 1]."),
            Hyper("beta_2", "beta2", 0.99, UNIT, "Decay of the momentum, in [0, 1]."),
            Hyper("lazy_lion", "use_non_lazy_lion", True, None,
                  "Update only the rows looked up in the step (True), or every "
                  "row, untouched ones with g = 0 (False; needs gradient "
                  "accumulation, as TF's Adam).",
                  operator.not_, kind=BOOL),
        ),
        cross_checks=(_requires_accumulation_when_non_lazy("lazy_lion", "Lion"),),
        non_lazy_field="use_non_lazy_lion",
        formula="""\
c = beta_1 * m + (1 - beta_1) * g
w = w - lr * sign(c)
m = beta_2 * m + (1 - beta_2) * g"""),
    OptimizerInfo(
        "frequency_aware_adagrad", "FrequencyAwareAdagrad", ("accumulators", "counters"),
        False,
        slot_init=("initial_accumulator_value", 0.0), class_name="FrequencyAwareAdagrad",
        min_tf=(2, 19), proto_number=30,
        summary="Adagrad whose step grows for rarely seen ids.",
        hypers=(
            _L1._replace(field="l1_regularization_strength"),
            _L2._replace(field="l2_regularization_strength"),
            Hyper("probability_exponent", "probability_exponent", 0.0, NON_NEGATIVE,
                  "Exponent of the inverse frequency in the step scale, >= 0 "
                  "(0: plain Adagrad)."),
            Hyper("max_lr_multiplier", "max_lr_multiplier", 0.0, NON_NEGATIVE,
                  "Cap on the step scale; 0 disables the cap."),
            Hyper("accumulator_decay", "accumulator_decay", 1.0, UNIT,
                  "Decay of the accumulator, in [0, 1]."),
            Hyper("initial_accumulator_value", "initial_accumulator_value", 0.1, POSITIVE,
                  "Initial value and floor of the accumulator, > 0."),
            Hyper("step_counter", "step_counter", None, None,
                  "The global step: a callable taking no arguments (fed like a "
                  "dynamic learning rate, its tag taken from the same index), "
                  "an int tag of the dynamic inputs, or None (step 1).", kind=DYNAMIC),
        ),
        formula="""\
counter = counter + 1
a = max(accumulator_decay * a + g^2, initial_accumulator_value)
scale = (step / counter)^probability_exponent, capped at max_lr_multiplier if > 0
update = g * scale / sqrt(a) [+ l1 * sign(w) if l1 > 0] [+ l2 * w if l2 > 0]
w = w - lr * update
(a = `accumulators`, counter = `counters`, step = the step counter)""",
        reconstruction="The proto's text is internally inconsistent "
                       "(docs/tpu_embedding_semantics.md §5.18); the rule above, "
                       "with the frequency estimate "
                       "counter / step, is tf_tpu_emb's reconstruction."),
    OptimizerInfo(
        "assign", "Assign", (), False,
        slot_init=(), class_name="Assign",
        lr_doc="Not used by the update (written to the table's proto only).",
        summary="Sets each looked-up row to its gradient.",
        formula="""\
w = g   (the learning rate is not used)
Correct only with gradient accumulation (the gradient summed over the batch)."""),
)

REFUSED = (
    OptimizerInfo("user_defined_program", "UserDefinedProgram", (), False,
                  implemented=False),
)
"""Oneof fields the engine knows only to refuse them (no table ops, no class)."""

BY_PROTO_FIELD = {o.proto_field: o for o in OPTIMIZERS}
BY_TF_CLASS = {o.tf_class: o for o in OPTIMIZERS if o.tf_class}


# ------------------------------------------------------------------ SparseCore

@dataclasses.dataclass(frozen=True)
class ScHyper:
    """One hyper-parameter of a SparseCore optimizer op: an attr of the
    gradient ops or of ``XlaSparseCore<Name>``, or a scalar input of the
    latter.

    name: TF's attr or input name ("beta1", "beta_1", ...).
    member: the member of the formula's hyper-parameter struct it sets
      (``core/optimizer_hypers.gen.h``: the V1 optimizer's struct).
    kind: FLOAT or BOOL.
    nonzero: the op refuses 0 ("<name> must not be 0").
    """
    name: str
    member: str
    kind: str = FLOAT
    nonzero: bool = False


@dataclasses.dataclass(frozen=True)
class SparseCoreOptimizerInfo:
    """One SparseCore (TPUEmbeddingV2) optimizer: the op families
    ``XlaSparseDenseMatmulGradWith<name>And{CsrInput,StaticBufferSize}``,
    ``XlaSparseDenseMatmulCustomCombinerOnTcGradWith<name>AndCsrInput`` and
    ``XlaSparseCore<name>`` (docs/sparsecore_semantics.md §6-§8).

    ``tools/gen_optimizers.py`` turns these entries into
    ``core/sparsecore_optimizers.gen.h`` (TensorFlow-free): the ``Opt``
    enum, the slot counts, the op definitions' inputs, outputs and attrs, the
    standalone op's input positions, the attribute and scalar readers and the
    dispatch to the formula, which the op registration, the kernels and
    :mod:`tf_tpu_emb.ops` read.

    name: the op infix ("Adagrad").
    formula: the row update of ``core/optimizer_formulas.h`` it runs
      (``opt::<formula>(const RowArgs&, const <Hyper>&)``).
    hyper: the V1 ``proto_field`` whose hyper-parameter struct the formula
      takes (``opt::<Camel(hyper)>Hyper``).
    slots: the gradient ops' slot inputs after ``embedding_table``, in TF's
      order (outputs ``updated_<slot>``); the formula's ``RowArgs.s`` order.
    grad_attrs: the gradient ops' hyper-parameter attrs (before the clip
      attrs), in TF's order.
    standalone_inputs: ``XlaSparseCore<name>``'s inputs in TF's order: the
      roles "indices" (int32), "gradient", "learning_rate",
      "embedding_table", the slot names of ``standalone_slots`` and the
      names of ``standalone_scalars`` (float32).
    standalone_slots: its slot inputs' names, in ``slots`` order.
    standalone_outputs: the tables it returns (``updated_<name>``), in order.
    standalone_attrs: its attrs after ``feature_width``.
    standalone_scalars: its scalar hyper-parameter inputs.
    tf_ops: TensorFlow has its ops (False: a JAX-only optimizer, no op defs,
      no kernels).
    own_hypers: ``(member, kind)`` of its own hyper-parameter struct
      (``opt::<Camel(hyper)>Hyper``, generated into
      ``core/optimizer_hypers.gen.h``) where ``hyper`` names no V1 optimizer.
    jax_name: jax-tpu-embedding's name of the optimizer (its primitive
      ``sparse_dense_matmul_grad_with_<jax_name>``), or None.
    jax_formula: the formula the JAX front end runs, where the package's
      arithmetic differs from TF's (default: ``formula``).
    jax_hypers: the package's scalar hyper-parameter operands after the first
      (the learning rate), in its order (``get_hyperparameters``); a BOOL one
      arrives as 0 or 1.
    jax_attrs: the FFI handler's attrs it reads.
    """
    name: str
    formula: str
    hyper: str
    slots: Tuple[str, ...] = ()
    grad_attrs: Tuple[ScHyper, ...] = ()
    standalone_inputs: Tuple[str, ...] = ()
    standalone_slots: Tuple[str, ...] = ()
    standalone_outputs: Tuple[str, ...] = ()
    standalone_attrs: Tuple[ScHyper, ...] = ()
    standalone_scalars: Tuple[ScHyper, ...] = ()
    tf_ops: bool = True
    own_hypers: Tuple[Tuple[str, str], ...] = ()
    jax_name: Optional[str] = None
    jax_formula: Optional[str] = None
    jax_hypers: Tuple[ScHyper, ...] = ()
    jax_attrs: Tuple[ScHyper, ...] = ()

    @property
    def enum(self):
        """The C++ enumerator (``sparsecore::Opt::k<name>``)."""
        return "k" + self.name

    @property
    def grad_op_names(self):
        """TF's names of its two gradient ops."""
        return tuple("XlaSparseDenseMatmulGradWith%sAnd%s" % (self.name, form)
                     for form in ("CsrInput", "StaticBufferSize"))

    @property
    def in_place_op_names(self):
        """Ours: the gradient ops' in-place forms (tables as resources)."""
        return tuple(n + "InPlace" for n in self.grad_op_names)

    @property
    def combiner_grad_op_name(self):
        return "XlaSparseDenseMatmulCustomCombinerOnTcGradWith%sAndCsrInput" % self.name

    @property
    def standalone_op_name(self):
        return "XlaSparseCore" + self.name

    @property
    def op_names(self):
        """TF's names of every op of this optimizer (none for a JAX-only one)."""
        if not self.tf_ops:
            return ()
        return self.grad_op_names + (self.combiner_grad_op_name, self.standalone_op_name)


_SC_TABLE_ROLES = ("indices", "gradient", "learning_rate", "embedding_table")

SPARSECORE_OPTIMIZERS = (
    SparseCoreOptimizerInfo(
        "Sgd", "StochasticGradientDescent", "stochastic_gradient_descent",
        standalone_inputs=_SC_TABLE_ROLES,
        standalone_outputs=("embedding_table",), jax_name="sgd"),
    SparseCoreOptimizerInfo(
        "Adagrad", "Adagrad", "adagrad", slots=("accumulator",),
        standalone_inputs=("indices", "gradient", "learning_rate", "accumulator",
                           "embedding_table"),
        standalone_slots=("accumulator",),
        standalone_outputs=("embedding_table", "accumulator"), jax_name="adagrad"),
    SparseCoreOptimizerInfo(
        "AdagradMomentum", "AdagradMomentum", "adagrad_momentum",
        slots=("accumulator", "momenta"),
        grad_attrs=(ScHyper("use_nesterov", "use_nesterov", BOOL),
                    ScHyper("exponent", "exponent", nonzero=True),
                    ScHyper("beta1", "momentum"), ScHyper("beta2", "beta2"),
                    ScHyper("epsilon", "epsilon")),
        standalone_inputs=("indices", "gradient", "learning_rate", "beta_1", "epsilon",
                           "accumulator", "momentum", "embedding_table"),
        standalone_slots=("accumulator", "momentum"),
        standalone_outputs=("embedding_table", "accumulator", "momentum"),
        standalone_attrs=(ScHyper("use_nesterov", "use_nesterov", BOOL),
                          ScHyper("beta_2", "beta2"),
                          ScHyper("exponent", "exponent", nonzero=True)),
        standalone_scalars=(ScHyper("beta_1", "momentum"), ScHyper("epsilon", "epsilon")),
        jax_name="adagrad_momentum",
        jax_hypers=(ScHyper("momentum", "momentum"), ScHyper("beta2", "beta2"),
                    ScHyper("epsilon", "epsilon"), ScHyper("exponent", "exponent"),
                    ScHyper("nesterov", "use_nesterov", BOOL))),
    SparseCoreOptimizerInfo(
        "Adam", "Adam", "adam", slots=("momenta", "velocity"),
        grad_attrs=(ScHyper("use_sum_inside_sqrt", "use_sum_inside_sqrt", BOOL),
                    ScHyper("beta1", "beta1"), ScHyper("beta2", "beta2"),
                    ScHyper("epsilon", "epsilon")),
        standalone_inputs=("embedding_table", "indices", "gradient", "learning_rate",
                           "momentum", "velocity", "beta_1", "beta_2", "epsilon"),
        standalone_slots=("momentum", "velocity"),
        standalone_outputs=("embedding_table", "velocity", "momentum"),
        standalone_attrs=(ScHyper("use_sum_inside_sqrt", "use_sum_inside_sqrt", BOOL),),
        standalone_scalars=(ScHyper("beta_1", "beta1"), ScHyper("beta_2", "beta2"),
                            ScHyper("epsilon", "epsilon")),
        # The package's Adam: the moments in delta form, its first operand
        # alpha_t (the bias-corrected rate) as the learning rate.
        jax_name="adam", jax_formula="JaxAdam",
        jax_hypers=(ScHyper("beta_1", "beta1"), ScHyper("beta_2", "beta2"),
                    ScHyper("epsilon_hat", "epsilon"))),
    SparseCoreOptimizerInfo(
        # TF's SparseCore builder associates FTRL differently from the V1
        # engine's (docs/sparsecore_semantics.md §6): a formula of its own.
        "Ftrl", "SparseCoreFtrl", "ftrl", slots=("accumulator", "linear"),
        grad_attrs=(ScHyper("multiply_linear_by_learning_rate", "multiply_linear_by_lr", BOOL),
                    ScHyper("beta", "beta"), ScHyper("learning_rate_power", "lr_power"),
                    ScHyper("l1_regularization_strength", "l1"),
                    ScHyper("l2_regularization_strength", "l2")),
        standalone_inputs=("embedding_table", "accumulator", "linear", "learning_rate",
                           "indices", "gradient", "beta", "learning_rate_power",
                           "l2_regularization_strength"),
        standalone_slots=("accumulator", "linear"),
        standalone_outputs=("embedding_table", "accumulator", "linear"),
        standalone_attrs=(ScHyper("multiply_linear_by_learning_rate", "multiply_linear_by_lr",
                                  BOOL),
                          ScHyper("l1_regularization_strength", "l1")),
        standalone_scalars=(ScHyper("beta", "beta"),
                            ScHyper("learning_rate_power", "lr_power"),
                            ScHyper("l2_regularization_strength", "l2")),
        # The package's FTRL takes (dp / lr) * w first without multiply_linear_by_lr.
        jax_name="ftrl", jax_formula="JaxFtrl",
        jax_hypers=(ScHyper("learning_rate_power", "lr_power"), ScHyper("l1", "l1"),
                    ScHyper("l2", "l2"), ScHyper("beta", "beta")),
        jax_attrs=(ScHyper("multiply_linear_by_lr", "multiply_linear_by_lr", BOOL),)),
    SparseCoreOptimizerInfo(
        # jax-tpu-embedding's LaProp (no TF ops).
        "LaProp", "LaProp", "la_prop", slots=("mu", "nu"), tf_ops=False,
        own_hypers=(("b1", FLOAT), ("decay_rate", FLOAT), ("eps", FLOAT)),
        jax_name="laprop",
        jax_hypers=(ScHyper("b1", "b1"), ScHyper("decay_rate", "decay_rate"),
                    ScHyper("eps", "eps"))),
    SparseCoreOptimizerInfo(
        # jax-tpu-embedding's frequency-aware Adagrad (no TF ops).
        "F2a", "F2a", "f2a", slots=("accumulator", "local_step"), tf_ops=False,
        own_hypers=(("rho", FLOAT), ("l1", FLOAT), ("l2", FLOAT),
                    ("max_lr_multiplier", FLOAT), ("global_step", FLOAT)),
        jax_name="f2a",
        jax_hypers=(ScHyper("rho", "rho"), ScHyper("l1", "l1"), ScHyper("l2", "l2"),
                    ScHyper("max_lr_multiplier", "max_lr_multiplier"),
                    ScHyper("global_step", "global_step"))),
)
"""The SparseCore optimizers, in the order of the C++ ``sparsecore::Opt`` enum."""
