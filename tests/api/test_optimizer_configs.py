"""The optimizer config classes generated from tf_tpu_emb/optimizers.py.

For each generated class (the optimizers TF's Python API lacks): the
OptimizationParameters it writes (against hand-written protos using the
field names of optimization_parameters.proto / core/optimizers.h),
defaults, every validation error, slot names and initial values against the
C++ registry (Load op OpDef inputs; slots of a freshly configured engine),
``_create_slots`` with and without ``slot_variable_creation_fn``, and
``_load``/``_retrieve`` being our op wrappers.  Also: ``fix_tf_optimizer``
makes TF's own classes write the expected protos (spec §4.4 "Empirical
_set_optimization_parameters output") without touching the original,
``table_descriptor_for``, and engine round trips (configure, load, enqueue,
Recv, Send, retrieve) compared with tests/common/optimizer_reference.py.
"""
import inspect

import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2
from tensorflow.python.framework import op_def_registry
from tensorflow.python.ops import init_ops_v2
from tensorflow.python.tpu import tpu_embedding_v2_utils

import engine_util as eu
import optimizer_reference as ref
import tf_features
import tf_tpu_emb
from tf_tpu_emb import ops as tte_ops
from tf_tpu_emb import optimizers as O

pytestmark = pytest.mark.tf_version

E = tf.tpu.experimental.embedding
Params = optimization_parameters_pb2.OptimizationParameters
TableDescriptor = eu.Config.TableDescriptor

GENERATED = ["Momentum", "RMSProp", "CenteredRMSProp", "ProximalAdagrad", "Adadelta",
             "ProximalYogi", "OnlineYogi", "Lion", "FrequencyEstimator", "BoundedAdagrad",
             "FrequencyAwareAdagrad", "Assign"]
FE_ARGS = dict(tau=0.25, max_delta=8.0, outlier_threshold=2.0, weight_exponent=0.5)
COMMON = ["use_gradient_accumulation", "clip_weight_min", "clip_weight_max",
          "weight_decay_factor", "multiply_weight_decay_factor_by_learning_rate", "clipvalue",
          "slot_variable_creation_fn", "low_dimensional_packing_status"]


def make(name, **kwargs):
    """An instance of generated class `name` (FrequencyEstimator gets its
    required arguments)."""
    cls = getattr(tf_tpu_emb, name)
    if name == "FrequencyEstimator":
        kwargs = dict(dict(learning_rate=1.0, **FE_ARGS), **kwargs)
    return cls(**kwargs)


def written(opt, **kwargs):
    p = Params()
    opt._set_optimization_parameters(p, **kwargs)
    return p


def parse(text):
    return text_format.Parse(text, Params())


def assert_proto(got, want_text):
    want = parse(want_text)
    assert got == want, "got:\n%s\nwant:\n%s" % (got, want)


# ============================================================== the registry

def test_generated_class_list():
    assert sorted(O.CLASSES) == sorted(GENERATED)
    for name in GENERATED:
        cls = getattr(tf_tpu_emb, name)
        assert cls is O.CLASSES[name] is getattr(O, name)
        assert issubclass(cls, tpu_embedding_v2_utils._Optimizer)
        assert cls.__module__ == "tf_tpu_emb.optimizers" and cls.__name__ == name
    # every engine optimizer has a Python class: ours or TF's (MDL Adagrad
    # Light is not implemented by the engine)
    for info in O.OPTIMIZERS:
        assert bool(info.class_name) + bool(info.tf_class) == \
            (info.proto_field != "mdl_adagrad_light"), info.proto_field
    assert sorted(O.BY_TF_CLASS) == ["Adagrad", "AdagradMomentum", "Adam", "FTRL", "SGD"]
    for name, info in O.BY_TF_CLASS.items():
        assert isinstance(getattr(E, name), type)


def test_registry_entries_are_consistent():
    for info in O.OPTIMIZERS:
        assert len(info.slot_init) == len(info.slots), info.proto_field
        args = {h.arg for h in info.hypers}
        for v in info.slot_init:
            assert isinstance(v, float) or v in args, (info.proto_field, v)
        assert len(args) == len(info.hypers)
        if info.class_name:
            assert info.formula and info.summary


# ====================================================== signatures, defaults

DEFAULTS = {
    "Momentum": dict(learning_rate=0.001, momentum=0.9, use_nesterov=False),
    "RMSProp": dict(learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7),
    "CenteredRMSProp": dict(learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7),
    "ProximalAdagrad": dict(learning_rate=0.001, l1_regularization_strength=0.0,
                            l2_regularization_strength=0.0, initial_accumulator_value=0.1),
    "Adadelta": dict(learning_rate=0.001, rho=0.95, epsilon=1e-7),
    "ProximalYogi": dict(learning_rate=0.001, l1_regularization_strength=0.0,
                         l2_regularization_strength=0.0, beta_1=0.9, beta_2=0.999,
                         epsilon=1e-3, initial_accumulator_value=0.1),
    "OnlineYogi": dict(learning_rate=0.001, l1_regularization_strength=0.0,
                       l2_regularization_strength=0.0, beta_2=0.999,
                       initial_accumulator_value=0.1),
    "Lion": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.99, lazy_lion=True),
    "FrequencyEstimator": dict(learning_rate=inspect.Parameter.empty,
                               tau=inspect.Parameter.empty,
                               max_delta=inspect.Parameter.empty,
                               outlier_threshold=inspect.Parameter.empty,
                               weight_exponent=inspect.Parameter.empty),
    "BoundedAdagrad": dict(learning_rate=0.001, update_accumulator_first=False,
                           max_var_update=0.0, max_accumulator=0.0,
                           initial_accumulator_value=0.1),
    "FrequencyAwareAdagrad": dict(learning_rate=0.001, l1_regularization_strength=0.0,
                                  l2_regularization_strength=0.0, probability_exponent=0.0,
                                  max_lr_multiplier=0.0, accumulator_decay=1.0,
                                  initial_accumulator_value=0.1, step_counter=None),
    "Assign": dict(learning_rate=0.001),
}
COMMON_DEFAULTS = dict(use_gradient_accumulation=True, clip_weight_min=None,
                       clip_weight_max=None, weight_decay_factor=None,
                       multiply_weight_decay_factor_by_learning_rate=None, clipvalue=None,
                       slot_variable_creation_fn=None, low_dimensional_packing_status=False)


@pytest.mark.parametrize("name", GENERATED)
def test_signature(name):
    cls = getattr(tf_tpu_emb, name)
    sig = inspect.signature(cls)
    common = [c for c in COMMON if name != "Assign" or c != "slot_variable_creation_fn"]
    own = list(DEFAULTS[name])
    assert list(sig.parameters) == own + common
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in sig.parameters.values())
    want = dict(DEFAULTS[name], **{c: COMMON_DEFAULTS[c] for c in common})
    assert {n: p.default for n, p in sig.parameters.items()} == want
    # the real __init__ has the same signature (help(), tf_inspect, ...)
    assert list(inspect.signature(cls.__init__).parameters)[1:] == own + common
    assert inspect.getfullargspec(cls.__init__).args[1:] == own + common


@pytest.mark.parametrize("name", GENERATED)
def test_defaults_become_attributes(name):
    opt = make(name)
    for arg, default in DEFAULTS[name].items():
        if default is not inspect.Parameter.empty:
            assert getattr(opt, arg) == default, arg
    assert opt.use_gradient_accumulation is True
    assert opt.clip_gradient_min is None and opt.clip_gradient_max is None
    assert opt.low_dimensional_packing_status is False
    assert opt.slot_variable_creation_fn is None


@pytest.mark.parametrize("name", GENERATED)
def test_docstring(name):
    cls = getattr(tf_tpu_emb, name)
    info = cls._INFO
    doc = cls.__doc__
    assert info.formula.splitlines()[0].strip() in doc
    for arg in inspect.signature(cls).parameters:
        assert "  %s: " % arg in doc, arg
        assert "  %s: " % arg in cls.__init__.__doc__, arg
    reconstructed = {"BoundedAdagrad", "OnlineYogi", "ProximalYogi", "FrequencyAwareAdagrad",
                     "FrequencyEstimator"}
    assert ("Reconstruction: " in doc) == (name in reconstructed)
    if name in reconstructed:
        assert "reconstruction" in doc.split("Reconstruction: ", 1)[1]
    assert ("registers no per-table Load/Retrieve op" in doc) == (not info.core_has_table_ops)
    assert "OptimizationParameters.%s" % info.proto_field in doc
    for slot in info.slots:
        assert "`%s`" % slot in doc


def test_positional_arguments_and_errors_like_python():
    m = tf_tpu_emb.Momentum(0.5, 0.25, True)
    assert (m.learning_rate, m.momentum, m.use_nesterov) == (0.5, 0.25, True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'beta'"):
        tf_tpu_emb.Momentum(beta=0.1)
    with pytest.raises(TypeError, match="missing 5 required positional arguments"):
        tf_tpu_emb.FrequencyEstimator()
    with pytest.raises(TypeError, match="'max_delta'"):
        tf_tpu_emb.FrequencyEstimator(1.0, tau=0.1, outlier_threshold=1.0, weight_exponent=1.0)


# ========================================================= protos written

# class -> [(kwargs, expected OptimizationParameters text)]
PROTOS = {
    "Momentum": [
        ({}, "momentum { momentum: 0.9 } gradient_accumulation_status: ENABLED"),
        (dict(learning_rate=0.1, momentum=0.5, use_nesterov=True),
         "momentum { momentum: 0.5 use_nesterov: true } gradient_accumulation_status: ENABLED"),
    ],
    "RMSProp": [
        ({}, "rms_prop { rho: 0.9 epsilon: 1e-7 } gradient_accumulation_status: ENABLED"),
        (dict(rho=0.8, momentum=0.5, epsilon=0.01),
         "rms_prop { rho: 0.8 momentum: 0.5 epsilon: 0.01 } "
         "gradient_accumulation_status: ENABLED"),
    ],
    "CenteredRMSProp": [
        ({}, "centered_rms_prop { rho: 0.9 epsilon: 1e-7 } "
             "gradient_accumulation_status: ENABLED"),
        (dict(rho=0.7, momentum=0.25, epsilon=0.5),
         "centered_rms_prop { rho: 0.7 momentum: 0.25 epsilon: 0.5 } "
         "gradient_accumulation_status: ENABLED"),
    ],
    "ProximalAdagrad": [
        ({}, "proximal_adagrad {} gradient_accumulation_status: ENABLED"),
        (dict(l1_regularization_strength=0.1, l2_regularization_strength=0.2,
              initial_accumulator_value=0.5),
         "proximal_adagrad { l1: 0.1 l2: 0.2 } gradient_accumulation_status: ENABLED"),
    ],
    "Adadelta": [
        ({}, "adadelta { rho: 0.95 epsilon: 1e-7 } gradient_accumulation_status: ENABLED"),
        (dict(rho=0.5, epsilon=1e-3),
         "adadelta { rho: 0.5 epsilon: 1e-3 } gradient_accumulation_status: ENABLED"),
    ],
    "ProximalYogi": [
        ({}, "proximal_yogi { beta1: 0.9 beta2: 0.999 epsilon: 1e-3 } "
             "gradient_accumulation_status: ENABLED"),
        (dict(l1_regularization_strength=0.01, l2_regularization_strength=0.02, beta_1=0.5,
              beta_2=0.75, epsilon=0.1, initial_accumulator_value=0.0),
         "proximal_yogi { l1: 0.01 l2: 0.02 beta1: 0.5 beta2: 0.75 epsilon: 0.1 } "
         "gradient_accumulation_status: ENABLED"),
    ],
    "OnlineYogi": [
        ({}, "online_yogi { beta2: 0.999 } gradient_accumulation_status: ENABLED"),
        (dict(l1_regularization_strength=0.5, l2_regularization_strength=0.25, beta_2=0.5),
         "online_yogi { l1: 0.5 l2: 0.25 beta2: 0.5 } gradient_accumulation_status: ENABLED"),
    ],
    "Lion": [
        ({}, "lion { beta1: 0.9 beta2: 0.99 } gradient_accumulation_status: ENABLED"),
        (dict(beta_1=0.5, beta_2=0.25, lazy_lion=False),
         "lion { beta1: 0.5 beta2: 0.25 use_non_lazy_lion: true } "
         "gradient_accumulation_status: ENABLED"),
    ],
    "FrequencyEstimator": [
        ({}, "frequency_estimator { tau: 0.25 max_delta: 8 outlier_threshold: 2 "
             "weight_exponent: 0.5 } gradient_accumulation_status: ENABLED"),
        (dict(tau=1.0, max_delta=100.0, outlier_threshold=0.5, weight_exponent=-1.0),
         "frequency_estimator { tau: 1 max_delta: 100 outlier_threshold: 0.5 "
         "weight_exponent: -1 } gradient_accumulation_status: ENABLED"),
    ],
    "BoundedAdagrad": [
        ({}, "bounded_adagrad {} gradient_accumulation_status: ENABLED"),
        (dict(update_accumulator_first=True, max_var_update=0.5, max_accumulator=10.0,
              initial_accumulator_value=1.0),
         "bounded_adagrad { update_accumulator_first: true max_var_update: 0.5 "
         "max_accumulator: 10 } gradient_accumulation_status: ENABLED"),
    ],
    "FrequencyAwareAdagrad": [
        ({}, "frequency_aware_adagrad { accumulator_decay: 1 initial_accumulator_value: 0.1 } "
             "gradient_accumulation_status: ENABLED"),
        (dict(l1_regularization_strength=0.1, l2_regularization_strength=0.2,
              probability_exponent=0.5, max_lr_multiplier=4.0, accumulator_decay=0.9,
              initial_accumulator_value=0.3, step_counter=0),
         "frequency_aware_adagrad { l1_regularization_strength: 0.1 "
         "l2_regularization_strength: 0.2 probability_exponent: 0.5 max_lr_multiplier: 4 "
         "accumulator_decay: 0.9 initial_accumulator_value: 0.3 step_counter { tag: 0 } } "
         "gradient_accumulation_status: ENABLED"),
        (dict(step_counter=3),
         "frequency_aware_adagrad { accumulator_decay: 1 initial_accumulator_value: 0.1 "
         "step_counter { tag: 3 } } gradient_accumulation_status: ENABLED"),
    ],
    "Assign": [
        ({}, "assign {} gradient_accumulation_status: ENABLED"),
    ],
}


@pytest.mark.parametrize("name,kwargs,want", [(n, k, w) for n, cases in PROTOS.items()
                                               for k, w in cases])
def test_proto(name, kwargs, want):
    assert_proto(written(make(name, **kwargs)), want)


def test_every_class_has_proto_cases():
    assert sorted(PROTOS) == sorted(GENERATED)


@tf_features.needs_frequency_aware_adagrad
def test_step_counter_tag_zero_is_present():
    p = written(tf_tpu_emb.FrequencyAwareAdagrad(step_counter=0))
    assert p.frequency_aware_adagrad.HasField("step_counter")
    assert not written(tf_tpu_emb.FrequencyAwareAdagrad()).frequency_aware_adagrad.HasField(
        "step_counter")


@pytest.mark.parametrize("name", GENERATED)
def test_base_fields(name):
    """Accumulation, clipping, decay and packing, without TF's bool->enum bug."""
    info = getattr(tf_tpu_emb, name)._INFO
    opt = make(name, clip_weight_min=-2.0, clip_weight_max=3.0, clipvalue=1.5,
               weight_decay_factor=0.01, multiply_weight_decay_factor_by_learning_rate=True,
               low_dimensional_packing_status=True)
    p = written(opt)
    assert p.WhichOneof("parameters") == info.proto_field
    p.ClearField(info.proto_field)
    assert_proto(p, """
        clipping_limits { lower { value: -2 } upper { value: 3 } }
        gradient_clipping_limits { lower { value: -1.5 } upper { value: 1.5 } }
        weight_decay_factor: 0.01
        multiply_weight_decay_factor_by_learning_rate: true
        gradient_accumulation_status: ENABLED
        low_dimensional_packing_status: ENABLED""")
    # tuple clipvalue with an open side; no accumulation; decay without the flag
    kwargs = dict(clipvalue=(None, 2.0), weight_decay_factor=0.5)
    if name == "Lion":
        kwargs["lazy_lion"] = True
    p = written(make(name, **kwargs))
    p.ClearField(info.proto_field)
    assert_proto(p, "gradient_clipping_limits { upper { value: 2 } } weight_decay_factor: 0.5 "
                    "gradient_accumulation_status: ENABLED")
    p = written(make(name, use_gradient_accumulation=False, clipvalue=None))
    p.ClearField(info.proto_field)
    assert_proto(p, "gradient_accumulation_status: DISABLED")


def test_learning_rate_is_not_written_by_set_optimization_parameters():
    assert not written(tf_tpu_emb.Momentum(0.5)).HasField("learning_rate")


@tf_features.needs_frequency_aware_adagrad
def test_callable_step_counter_needs_the_index():
    lr, step = (lambda: 0.1), (lambda: 7.0)
    opt = tf_tpu_emb.FrequencyAwareAdagrad(lr, step_counter=step)
    with pytest.raises(ValueError, match="`step_counter` is a callable.*table_descriptor_for"):
        written(opt)
    with pytest.raises(ValueError, match="`step_counter` callable .* not in the dynamic-input"):
        written(opt, learning_rate_index={lr: 0})
    assert written(opt, learning_rate_index={lr: 0, step: 1}) \
        .frequency_aware_adagrad.step_counter.tag == 1
    assert written(opt, learning_rate_index=[step, lr]) \
        .frequency_aware_adagrad.step_counter.tag == 0
    assert O.dynamic_input_fns(opt) == [lr, step]
    assert O.dynamic_input_fns(tf_tpu_emb.FrequencyAwareAdagrad(lr, step_counter=lr)) == [lr]
    assert O.dynamic_input_fns(tf_tpu_emb.Momentum(0.1)) == []
    assert O.dynamic_input_fns(E.Adam(lr)) == [lr]
    assert O.dynamic_input_fns(E.SGD(0.1)) == []


def test_works_with_tf_table_config():
    """TF's own TableConfig._set_table_descriptor accepts our classes as is."""
    lr = lambda: 0.2  # noqa: E731
    table = E.TableConfig(vocabulary_size=3, dim=4, name="t",
                          optimizer=tf_tpu_emb.Lion(lr, lazy_lion=False,
                                                    low_dimensional_packing_status=True),
                          quantization_config=E.QuantizationConfig(5, -1.0, 1.0))
    E.FeatureConfig(table=table, name="f")
    td = TableDescriptor()
    table._set_table_descriptor(td, 4, {lr: 0})
    want = text_format.Parse("""
        name: "t" vocabulary_size: 4 dimension: 4
        optimization_parameters {
          learning_rate { dynamic { } }
          lion { beta1: 0.9 beta2: 0.99 use_non_lazy_lion: true }
          gradient_accumulation_status: ENABLED
          low_dimensional_packing_status: ENABLED
          simulated_quantization { enabled: true num_buckets: 5
                                   clipping_limits { lower { value: -1 } upper { value: 1 } } }
        }""", TableDescriptor())
    assert td == want
    assert O.table_descriptor_for(table, num_hosts=4, learning_rate_index={lr: 0}) == want


def test_equality_and_hash_like_tf():
    a, b = tf_tpu_emb.Momentum(0.1, 0.5), tf_tpu_emb.Momentum(0.1, 0.5)
    assert a == b and hash(a) == hash(b)
    assert a != tf_tpu_emb.Momentum(0.1, 0.6)
    assert a != E.SGD(0.1)
    assert repr(a) == "Momentum(learning_rate=0.1, momentum=0.5, use_nesterov=False)"


# ============================================================== validation

# class -> [(kwargs, message regex)]
INVALID = {
    "Momentum": [
        (dict(momentum=-0.1), r"Argument `momentum` must be >= 0 and <= 1. Received: -0.1"),
        (dict(momentum=1.5), r"`momentum` must be >= 0 and <= 1"),
        (dict(use_nesterov=1), r"Argument `use_nesterov` must be a bool. Received: 1"),
    ],
    "RMSProp": [
        (dict(rho=1.1), r"`rho` must be >= 0 and <= 1"),
        (dict(momentum=-1.0), r"`momentum` must be >= 0 and <= 1"),
        (dict(epsilon=0.0), r"Argument `epsilon` must be > 0. Received: 0.0"),
    ],
    "CenteredRMSProp": [
        (dict(rho=-0.5), r"`rho` must be >= 0 and <= 1"),
        (dict(momentum=2.0), r"`momentum` must be >= 0 and <= 1"),
        (dict(epsilon=-1e-7), r"`epsilon` must be > 0"),
    ],
    "ProximalAdagrad": [
        (dict(l1_regularization_strength=-0.1), r"`l1_regularization_strength` must be >= 0"),
        (dict(l2_regularization_strength=-1.0), r"`l2_regularization_strength` must be >= 0"),
        (dict(initial_accumulator_value=0.0), r"`initial_accumulator_value` must be > 0"),
    ],
    "Adadelta": [
        (dict(rho=1.01), r"`rho` must be >= 0 and <= 1"),
        (dict(epsilon=0.0), r"`epsilon` must be > 0"),
    ],
    "ProximalYogi": [
        (dict(l1_regularization_strength=-1.0), r"`l1_regularization_strength` must be >= 0"),
        (dict(l2_regularization_strength=-1.0), r"`l2_regularization_strength` must be >= 0"),
        (dict(beta_1=1.0), r"Argument `beta_1` must be >= 0 and < 1. Received: 1.0"),
        (dict(beta_2=-0.1), r"`beta_2` must be >= 0 and < 1"),
        (dict(epsilon=0.0), r"`epsilon` must be > 0"),
        (dict(initial_accumulator_value=-0.1), r"`initial_accumulator_value` must be >= 0"),
    ],
    "OnlineYogi": [
        (dict(l1_regularization_strength=-1.0), r"`l1_regularization_strength` must be >= 0"),
        (dict(l2_regularization_strength=-1.0), r"`l2_regularization_strength` must be >= 0"),
        (dict(beta_2=1.0), r"`beta_2` must be >= 0 and < 1"),
        (dict(initial_accumulator_value=0.0), r"`initial_accumulator_value` must be > 0"),
    ],
    "Lion": [
        (dict(beta_1=1.5), r"`beta_1` must be >= 0 and <= 1"),
        (dict(beta_2=-0.5), r"`beta_2` must be >= 0 and <= 1"),
        (dict(lazy_lion="no"), r"Argument `lazy_lion` must be a bool"),
        (dict(lazy_lion=False, use_gradient_accumulation=False),
         r"When disabling lazy Lion \(`lazy_lion=False`\), gradient accumulation must be used"),
    ],
    "FrequencyEstimator": [
        (dict(tau=0.0), r"`tau` must be > 0 and <= 1"),
        (dict(tau=1.5), r"`tau` must be > 0 and <= 1"),
        (dict(max_delta=0.0), r"`max_delta` must be > 0"),
        (dict(outlier_threshold=-1.0), r"`outlier_threshold` must be > 0"),
        (dict(weight_exponent=float("nan")), r"`weight_exponent` must be a finite number"),
    ],
    "BoundedAdagrad": [
        (dict(update_accumulator_first=None), r"`update_accumulator_first` must be a bool"),
        (dict(max_var_update=-1.0), r"`max_var_update` must be >= 0"),
        (dict(max_accumulator=-1.0), r"`max_accumulator` must be >= 0"),
        (dict(initial_accumulator_value=0.0), r"`initial_accumulator_value` must be > 0"),
    ],
    "FrequencyAwareAdagrad": [
        (dict(l1_regularization_strength=-1.0), r"`l1_regularization_strength` must be >= 0"),
        (dict(l2_regularization_strength=-1.0), r"`l2_regularization_strength` must be >= 0"),
        (dict(probability_exponent=-0.5), r"`probability_exponent` must be >= 0"),
        (dict(max_lr_multiplier=-2.0), r"`max_lr_multiplier` must be >= 0"),
        (dict(accumulator_decay=1.5), r"`accumulator_decay` must be >= 0 and <= 1"),
        (dict(initial_accumulator_value=0.0), r"`initial_accumulator_value` must be > 0"),
        (dict(step_counter=-1), r"`step_counter` must be None, a callable taking no arguments, "
                                r"or a non-negative int tag. Received: -1"),
        (dict(step_counter=1.5), r"`step_counter` must be None, a callable"),
        (dict(step_counter=True), r"`step_counter` must be None, a callable"),
    ],
    "Assign": [],
}

# Every class: the common arguments (TF's own messages where TF checks them).
COMMON_INVALID = [
    (dict(learning_rate="fast"), r"Argument `learning_rate` must be a float or a callable"),
    (dict(learning_rate=float("inf")), r"Argument `learning_rate` must be a float"),
    (dict(use_gradient_accumulation=False, clipvalue=1.0),
     r"When `use_gradient_accumulation` is False, gradient clipping cannot be used"),
    (dict(use_gradient_accumulation="yes"), r"`use_gradient_accumulation` must be a bool"),
    (dict(clip_weight_min=2.0, clip_weight_max=1.0),
     r"Argument `clip_weight_min` \(2.0\) must be <= `clip_weight_max` \(1.0\)"),
    (dict(clip_weight_min="low"), r"Argument `clip_weight_min` must be None or a number"),
    (dict(weight_decay_factor="x"), r"Argument `weight_decay_factor` must be None or a number"),
    (dict(clipvalue=-1.0), r"Argument `clipvalue` must be a positive number or a tuple"),
    (dict(clipvalue=(1.0, 2.0, 3.0)), r"Argument `clipvalue` must be a positive number"),
    (dict(clipvalue=(2.0, 1.0)), r"Argument `clipvalue` \(min, max\) must have min <= max"),
    (dict(low_dimensional_packing_status=1),
     r"Argument `low_dimensional_packing_status` must be a bool"),
]


@pytest.mark.parametrize("name,kwargs,message", [(n, k, m) for n, cases in INVALID.items()
                                                  for k, m in cases])
def test_invalid_argument(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(name, **kwargs)


@pytest.mark.parametrize("name", GENERATED)
@pytest.mark.parametrize("kwargs,message", COMMON_INVALID)
def test_invalid_common_argument(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(name, **kwargs)


@pytest.mark.parametrize("name", [n for n in GENERATED if n != "Assign"])
def test_invalid_slot_variable_creation_fn(name):
    with pytest.raises(ValueError, match="Argument `slot_variable_creation_fn` must be either "
                                         "None or a callable"):
        make(name, slot_variable_creation_fn="not callable")


@pytest.mark.parametrize("name", GENERATED)
def test_every_check_is_tested(name):
    """Each validated hyper-parameter and cross check has an INVALID case."""
    info = getattr(tf_tpu_emb, name)._INFO
    tested = {a for k, _ in INVALID[name] for a in k}
    for h in info.hypers:
        if h.check is not None or isinstance(h.default, bool) or h.arg == "step_counter":
            assert h.arg in tested, h.arg
    assert len([1 for k, _ in INVALID[name] if len(k) > 1]) == len(info.cross_checks)


@pytest.mark.parametrize("name", GENERATED)
def test_non_float_hyper_parameters_rejected(name):
    for h, kind in zip(getattr(tf_tpu_emb, name)._INFO.hypers, getattr(tf_tpu_emb, name)._KINDS):
        if kind == "float":
            with pytest.raises(ValueError, match="Argument `%s` must be a finite number. "
                                                 "Received: '1'" % h.arg):
                make(name, **{h.arg: "1"})
            with pytest.raises(ValueError, match="`%s` must be a finite number" % h.arg):
                make(name, **{h.arg: True})


def test_numpy_scalars_accepted():
    m = tf_tpu_emb.Momentum(np.float32(0.5), np.float64(0.25), np.bool_(True))
    p = written(m)
    assert p.momentum.momentum == 0.25 and p.momentum.use_nesterov


# =========================================== slots: names, values, creation

def _load_op_def(info):
    return op_def_registry.get(tte_ops.PREFIX + "LoadTPUEmbedding%sParameters" % info.op_infix)


@pytest.mark.usefixtures("lib")
@pytest.mark.parametrize("name", GENERATED)
def test_slot_names_match_load_op(name):
    opt = make(name)
    info = type(opt)._INFO
    names = [a.name for a in _load_op_def(info).input_arg]
    assert names == ["parameters"] + opt._slot_names()
    retrieve = op_def_registry.get(tte_ops.PREFIX + "RetrieveTPUEmbedding%sParameters"
                                   % info.op_infix)
    assert [a.name for a in retrieve.output_arg] == ["parameters"] + opt._slot_names()


@pytest.mark.parametrize("name", GENERATED)
def test_slot_initializers_are_constants(name):
    opt = make(name)
    inits = opt._slot_initializers()
    assert len(inits) == len(opt._slot_names())
    for init, value in zip(inits, opt._slot_initial_values()):
        assert type(init) is init_ops_v2.Constant
        assert init.value == value
        got = init(shape=(2, 3), dtype=tf.float32).numpy()
        np.testing.assert_array_equal(got, np.full((2, 3), value, np.float32))


@pytest.mark.parametrize("name,kwargs,want", [
    ("ProximalAdagrad", dict(initial_accumulator_value=0.5), [0.5]),
    ("ProximalYogi", dict(initial_accumulator_value=0.0), [0.0, 0.0]),
    ("OnlineYogi", dict(initial_accumulator_value=2.0), [2.0, 0.0]),
    ("BoundedAdagrad", dict(initial_accumulator_value=0.3), [0.3]),
    ("FrequencyAwareAdagrad", dict(initial_accumulator_value=0.7), [0.7, 0.0]),
    ("RMSProp", dict(), [1.0, 0.0]),
    ("CenteredRMSProp", dict(), [1.0, 0.0, 0.0]),
])
def test_slot_initial_values_follow_arguments(name, kwargs, want):
    assert make(name, **kwargs)._slot_initial_values() == want


@pytest.mark.usefixtures("lib")
def test_slot_initial_values_match_engine():
    """A freshly configured engine (C++ registry initial values) holds exactly
    the values of each class's default slot initializers."""
    config = eu.Config()
    config.mode = eu.TRAINING
    config.num_tensor_cores = 1
    config.batch_size_per_tensor_core = 1
    opts = {}
    for name in GENERATED:
        if tf_features.missing_optimizer_in(name):
            continue  # this TF's protos cannot express it (its own test is skipped)
        dim = 1 if name == "FrequencyEstimator" else 3
        table = E.TableConfig(vocabulary_size=5, dim=dim, name=name.lower())
        opts[name] = make(name)
        O.table_descriptor_for(table, optimizer=opts[name],
                               table_descriptor=config.table_descriptor.add())
        config.table_descriptor[-1].num_features = 1
    with eu.engine(config):
        for name, opt in opts.items():
            outs = opt._retrieve()(table_name=name.lower(), num_shards=1, shard_id=0)
            outs = [outs] if isinstance(outs, tf.Tensor) else list(outs)
            assert len(outs) == 1 + len(opt._slot_names())
            for slot, init, got in zip(opt._slot_names(), opt._slot_initializers(), outs[1:]):
                want = init(shape=got.shape, dtype=tf.float32).numpy()
                np.testing.assert_array_equal(got.numpy(), want, err_msg="%s/%s" % (name, slot))


@pytest.mark.parametrize("name", [n for n in GENERATED if n != "Assign"])
def test_create_slots_default(name):
    opt = make(name)
    table = tf.Variable(tf.zeros([4, 2]))
    created = []

    def creator(slot_name, initializer):
        created.append(slot_name)
        return tf.Variable(initializer(shape=(4, 2), dtype=tf.float32), name=slot_name)

    slots = opt._create_slots(table, creator)
    assert created == opt._slot_names() == list(slots)
    for slot, value in zip(opt._slot_names(), opt._slot_initial_values()):
        np.testing.assert_array_equal(slots[slot].numpy(), np.full((4, 2), value, np.float32))


@pytest.mark.parametrize("name", [n for n in GENERATED if n != "Assign"])
def test_create_slots_with_slot_variable_creation_fn(name):
    calls = []

    def slot_fn(table, slot_names, slot_initializers):
        calls.append((table, slot_names, slot_initializers))
        return {s: ("var", s) for s in slot_names}

    opt = make(name, slot_variable_creation_fn=slot_fn)
    table = tf.Variable(tf.zeros([4, 2]))

    def creator(*_):
        raise AssertionError("the default creator must not be used")

    slots = opt._create_slots(table, creator)
    assert slots == {s: ("var", s) for s in opt._slot_names()}
    ((t, names, inits),) = calls
    assert t is table and names == opt._slot_names()
    assert [i.value for i in inits] == opt._slot_initial_values()


def test_assign_has_no_slots():
    opt = tf_tpu_emb.Assign(0.5)
    assert opt._slot_names() == [] and opt._slot_initializers() == []
    assert opt._create_slots(tf.Variable(tf.zeros([2, 2])), None) == {}


def test_tf_embedding_layer_creates_our_slots():
    """TF's TPUEmbeddingForServing builds parameters + slots through _create_slots."""
    tables = {
        "r": E.TableConfig(vocabulary_size=6, dim=2, name="r",
                           optimizer=tf_tpu_emb.CenteredRMSProp(0.1)),
        "y": E.TableConfig(vocabulary_size=5, dim=3, name="y",
                           optimizer=tf_tpu_emb.ProximalYogi(0.1, initial_accumulator_value=0.25)),
    }
    features = {k: E.FeatureConfig(table=t, name=k) for k, t in tables.items()}
    model = E.TPUEmbeddingForServing(features, optimizer=None)
    model.build()
    v = model._variables
    assert sorted(v["r"]) == ["mg", "mom", "ms", "parameters"]
    np.testing.assert_array_equal(v["r"]["ms"].numpy(), np.ones((6, 2), np.float32))
    assert v["r"]["ms"].name.startswith("r/ms")
    assert sorted(v["y"]) == ["m", "parameters", "v"]
    np.testing.assert_array_equal(v["y"]["v"].numpy(), np.full((5, 3), 0.25, np.float32))


@pytest.mark.parametrize("name", GENERATED)
def test_load_retrieve_are_our_wrappers(name):
    opt = make(name)
    snake = tte_ops._snake(type(opt)._INFO.op_infix)
    assert opt._load() is getattr(tte_ops, "load_tpu_embedding_%s_parameters" % snake)
    assert opt._retrieve() is getattr(tte_ops, "retrieve_tpu_embedding_%s_parameters" % snake)


def test_load_retrieve_names():
    assert tf_tpu_emb.Momentum()._load() is tte_ops.load_tpu_embedding_momentum_parameters
    assert tf_tpu_emb.RMSProp()._retrieve() is tte_ops.retrieve_tpu_embedding_rms_prop_parameters
    assert tf_tpu_emb.Lion()._load() is tte_ops.load_tpu_embedding_lion_parameters


# ================================================ TF's classes: the bug fix

def _fixed_params(opt):
    p = Params()
    O.fix_tf_optimizer(opt)._set_optimization_parameters(p)
    return p


def test_fix_tf_optimizer_sgd():
    opt = E.SGD(0.1, clipvalue=1.0, weight_decay_factor=0.01,
                multiply_weight_decay_factor_by_learning_rate=True)
    assert_proto(_fixed_params(opt), """
        stochastic_gradient_descent {}
        gradient_clipping_limits { lower { value: -1 } upper { value: 1 } }
        weight_decay_factor: 0.01
        gradient_accumulation_status: ENABLED
        multiply_weight_decay_factor_by_learning_rate: true""")


def test_fix_tf_optimizer_adam():
    opt = E.Adam(0.1, lazy_adam=False, sum_inside_sqrt=False, clipvalue=(None, 2.0))
    assert_proto(_fixed_params(opt), """
        adam { beta1: 0.9 beta2: 0.999 epsilon: 1e-07 use_non_lazy_adam: true }
        gradient_clipping_limits { upper { value: 2 } }
        gradient_accumulation_status: ENABLED""")


def test_fix_tf_optimizer_ftrl_packing():
    opt = E.FTRL(0.1, use_gradient_accumulation=False, low_dimensional_packing_status=True)
    assert_proto(_fixed_params(opt), """
        ftrl { lr_power: -0.5 }
        gradient_accumulation_status: DISABLED
        low_dimensional_packing_status: ENABLED""")


def test_fix_tf_optimizer_adagrad_and_momentum():
    assert_proto(_fixed_params(E.Adagrad(0.1)),
                 "adagrad {} gradient_accumulation_status: ENABLED")
    assert_proto(_fixed_params(E.AdagradMomentum(0.1, momentum=0.5, use_nesterov=True)), """
        adagrad_momentum { momentum: 0.5 use_nesterov: true exponent: 2 beta2: 1
                           epsilon: 1e-10 }
        gradient_accumulation_status: ENABLED""")


@pytest.mark.parametrize("cls", [E.SGD, E.Adagrad, E.AdagradMomentum, E.Adam, E.FTRL])
@pytest.mark.parametrize("packing", [False, True])
def test_fix_tf_optimizer_copies(cls, packing):
    opt = cls(0.1, low_dimensional_packing_status=packing)
    before = dict(opt.__dict__)
    fixed = O.fix_tf_optimizer(opt)
    assert fixed is not opt and type(fixed) is cls
    assert opt.__dict__ == before
    assert opt.low_dimensional_packing_status is packing  # still TF's bool
    assert type(fixed.low_dimensional_packing_status) is int
    assert fixed.low_dimensional_packing_status == (1 if packing else 0)
    assert fixed == opt and hash(fixed) == hash(opt)
    # TF's own TableConfig path works with the copy
    table = E.TableConfig(vocabulary_size=3, dim=4, optimizer=fixed, name="t")
    td = TableDescriptor()
    table._set_table_descriptor(td, 1, {})
    p = td.optimization_parameters
    assert p.WhichOneof("parameters") == O.BY_TF_CLASS[cls.__name__].proto_field
    assert p.low_dimensional_packing_status == (1 if packing else 0)
    assert p.learning_rate.constant == pytest.approx(0.1)


def test_fix_tf_optimizer_dynamic_learning_rate_table():
    """Spec §4.4: TableConfig(3, 4, SGD(lr_fn))._set_table_descriptor(td, 4, {lr_fn: 0})."""
    lr_fn = lambda: 0.1  # noqa: E731
    table = E.TableConfig(vocabulary_size=3, dim=4, optimizer=O.fix_tf_optimizer(E.SGD(lr_fn)),
                          name="t")
    td = TableDescriptor()
    table._set_table_descriptor(td, 4, {lr_fn: 0})
    assert td.vocabulary_size == 4
    assert td.optimization_parameters.learning_rate.WhichOneof("learning_rate") == "dynamic"
    assert td.optimization_parameters.learning_rate.dynamic.tag == 0


def test_fix_tf_optimizer_others():
    ours = tf_tpu_emb.Momentum()
    assert O.fix_tf_optimizer(ours) is ours
    with pytest.raises(ValueError, match="is an unsupported optimizer class"):
        O.fix_tf_optimizer("sgd")
    assert O.is_tf_optimizer(E.SGD()) and not O.is_tf_optimizer(ours)
    assert not O.is_tf_optimizer(object())


def test_info_of():
    assert O.info_of(E.Adam()) is O.BY_PROTO_FIELD["adam"]
    assert O.info_of(tf_tpu_emb.Lion()) is O.BY_PROTO_FIELD["lion"]
    assert O.info_of(E.SGD()).slots == ()
    assert O.info_of(object()) is None


# ===================================================== table_descriptor_for

def test_table_descriptor_for_tf_and_ours():
    lr1, lr2 = (lambda: 0.1), (lambda: 0.2)
    quant = E.QuantizationConfig(num_buckets=4, lower=-0.5, upper=0.5)
    t1 = E.TableConfig(vocabulary_size=10, dim=3, name="a", optimizer=E.Adagrad(lr2),
                       quantization_config=quant)
    t2 = E.TableConfig(vocabulary_size=2, dim=5, name="b")
    index = {lr1: 0, lr2: 1}
    td = O.table_descriptor_for(t1, learning_rate_index=index)
    assert td == text_format.Parse("""
        name: "a" vocabulary_size: 10 dimension: 3
        optimization_parameters {
          learning_rate { dynamic { tag: 1 } }
          adagrad {}
          gradient_accumulation_status: ENABLED
          simulated_quantization { enabled: true num_buckets: 4
              clipping_limits { lower { value: -0.5 } upper { value: 0.5 } } }
        }""", TableDescriptor())
    assert t1.optimizer.low_dimensional_packing_status is False  # not mutated
    # explicit name and optimizer (overriding the table's), filled in place
    config = eu.Config()
    out = O.table_descriptor_for(t2, "renamed", tf_tpu_emb.RMSProp(0.05, rho=0.5),
                                 index, num_hosts=4,
                                 table_descriptor=config.table_descriptor.add())
    assert out is config.table_descriptor[0]
    assert out == text_format.Parse("""
        name: "renamed" vocabulary_size: 4 dimension: 5
        optimization_parameters {
          learning_rate { constant: 0.05 }
          rms_prop { rho: 0.5 epsilon: 1e-7 }
          gradient_accumulation_status: ENABLED
        }""", TableDescriptor())
    assert not out.num_features
    # sequence index
    td = O.table_descriptor_for(t2, "s", E.SGD(lr1), [lr2, lr1])
    assert td.optimization_parameters.learning_rate.dynamic.tag == 1


def test_table_descriptor_for_errors():
    lr = lambda: 0.1  # noqa: E731
    t = E.TableConfig(vocabulary_size=4, dim=2, name="t")
    with pytest.raises(ValueError, match="Table 't' has no optimizer"):
        O.table_descriptor_for(t)
    with pytest.raises(ValueError, match="is an unsupported optimizer class"):
        O.table_descriptor_for(t, optimizer="adagrad")
    with pytest.raises(ValueError, match="The table needs a name"):
        O.table_descriptor_for(E.TableConfig(vocabulary_size=4, dim=2), optimizer=E.SGD())
    with pytest.raises(ValueError, match="`learning_rate` is a callable"):
        O.table_descriptor_for(t, optimizer=E.SGD(lr))
    with pytest.raises(ValueError, match="`learning_rate` callable .* not in the dynamic-input"):
        O.table_descriptor_for(t, optimizer=tf_tpu_emb.Momentum(lr), learning_rate_index={})
    with pytest.raises(ValueError, match="FrequencyEstimator tables should only have a "
                                         "dimension of 1. Received dimension 2"):
        O.table_descriptor_for(t, optimizer=make("FrequencyEstimator"))


@pytest.mark.skipif(not hasattr(E, "CustomOptimizer"),
                    reason="TensorFlow %s has no tf.tpu.experimental.embedding."
                    "CustomOptimizer (TF >= 2.18)" % tf.__version__)
def test_table_descriptor_for_custom_optimizer():
    t = E.TableConfig(vocabulary_size=4, dim=2, name="t")
    custom = E.CustomOptimizer(lambda *a: None, learning_rate=0.1)
    with pytest.raises(ValueError, match="CustomOptimizer sets no optimization algorithm"):
        O.table_descriptor_for(t, optimizer=custom)


@tf_features.needs_frequency_aware_adagrad
def test_table_descriptor_for_step_counter():
    lr, step = (lambda: 0.1), (lambda: 3.0)
    t = E.TableConfig(vocabulary_size=4, dim=2, name="t",
                      optimizer=tf_tpu_emb.FrequencyAwareAdagrad(lr, step_counter=step))
    td = O.table_descriptor_for(t, learning_rate_index={step: 0, lr: 1})
    p = td.optimization_parameters
    assert p.learning_rate.dynamic.tag == 1
    assert p.frequency_aware_adagrad.step_counter.tag == 0


# ============================================================ engine round trip

VOCAB, DIM, B = 8, 3, 4
BAGS = [[(1, 1.0), (1, 0.5), (3, 2.0)], [(5, 1.0)], [], [(3, 1.0), (6, 0.25)]]
BAGS2 = [[(3, 1.0)], [(1, 1.0), (5, 1.0)], [(6, 1.0), (6, 1.0)], [(0, 0.5)]]


def _hp(params, info):
    """The optimizer's hyper-parameters as optimizer_reference expects them
    (proto field names; dynamic inputs excluded)."""
    msg = getattr(params, info.proto_field)
    return {f.name: v for f, v in msg.ListFields() if f.message_type is None}


ROUND_TRIP = [
    ("momentum_nesterov", lambda lr, step: tf_tpu_emb.Momentum(0.1, 0.5, use_nesterov=True)),
    ("momentum_dynamic_lr", lambda lr, step: tf_tpu_emb.Momentum(lr, 0.75)),
    ("lion_lazy", lambda lr, step: tf_tpu_emb.Lion(0.05, beta_1=0.5, beta_2=0.75)),
    ("lion_non_lazy", lambda lr, step: tf_tpu_emb.Lion(
        0.05, beta_1=0.5, beta_2=0.75, lazy_lion=False, clipvalue=0.5)),
    ("rmsprop_decay", lambda lr, step: tf_tpu_emb.RMSProp(
        0.1, rho=0.5, momentum=0.25, weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True, clip_weight_max=0.8)),
    ("frequency_aware_adagrad", lambda lr, step: tf_tpu_emb.FrequencyAwareAdagrad(
        lr, probability_exponent=0.5, max_lr_multiplier=3.0, accumulator_decay=0.9,
        step_counter=step)),
]


@pytest.mark.usefixtures("lib")
@pytest.mark.parametrize("case,factory", ROUND_TRIP, ids=[c for c, _ in ROUND_TRIP])
def test_engine_round_trip(case, factory):
    """table_descriptor_for -> ConfigureTPUEmbedding -> _load() -> two steps of
    enqueue / Recv / Send -> _retrieve(), against the numpy reference."""
    lr_fn, step_fn = (lambda: 0.2), (lambda: 5.0)
    opt = factory(lr_fn, step_fn)
    fns = O.dynamic_input_fns(opt)
    index = {fn: i for i, fn in enumerate(fns)}
    table = E.TableConfig(vocabulary_size=VOCAB, dim=DIM, name="t", optimizer=opt,
                          combiner="sum")
    config = eu.Config()
    config.mode = eu.TRAINING
    config.num_tensor_cores = 1
    desc = O.table_descriptor_for(table, learning_rate_index=index,
                                  table_descriptor=config.table_descriptor.add())
    fd = config.feature_descriptor.add(name="f", table_id=0)
    fd.input_shape.append(B)

    info = O.info_of(opt)
    params = desc.optimization_parameters
    p = ref.TableParams(
        optimizer=info.proto_field, hp=_hp(params, info),
        lr=params.learning_rate.constant,
        lr_tag=index[opt.learning_rate] if callable(opt.learning_rate) else None,
        step_counter_tag=index.get(getattr(opt, "step_counter", None)),
        grad_clip=(opt.clip_gradient_min, opt.clip_gradient_max),
        weight_clip=(opt.clip_weight_min, opt.clip_weight_max),
        weight_decay=opt.weight_decay_factor or 0.0,
        decay_by_lr=bool(opt.multiply_weight_decay_factor_by_learning_rate),
        accumulate=opt.use_gradient_accumulation)

    rng = np.random.default_rng(7)
    state = [rng.standard_normal((VOCAB, DIM)).astype(np.float32)]
    for slot in opt._slot_names():
        state.append(rng.uniform(0.1, 1.0, (VOCAB, DIM)).astype(np.float32))
    want = ref.copy_state(state)
    dyn = [float(fn()) for fn in fns]

    with eu.engine(config):
        opt._load()(*state, table_name="t", num_shards=1, shard_id=0)
        for bags in (BAGS, BAGS2):
            eu.enqueue_arbitrary([eu.sparse_to_enqueue(*eu.bags_to_sparse(bags))],
                                 combiners=["sum"])
            (act,) = eu.recv(config)
            eu.assert_close(act, eu.reference_lookup(want[0], bags, "sum"), what="activations")
            grads = rng.standard_normal((B, DIM)).astype(np.float32)
            tte_ops.send_tpu_embedding_gradients([tf.constant(grads)], config.SerializeToString(),
                                                 learning_rates=[tf.constant(x, tf.float32)
                                                                 for x in dyn])
            ref.step(p, want, ref.contributions([(bags, "sum", grads)]), dyn)
        got = opt._retrieve()(table_name="t", num_shards=1, shard_id=0)

    assert len(got) == len(want) == 1 + len(opt._slot_names())
    for name, g, w in zip(["parameters"] + opt._slot_names(), got, want):
        eu.assert_close(g.numpy(), w, rtol=1e-5, atol=1e-6, what="%s %s" % (case, name))
    if case == "lion_non_lazy":  # untouched row 2 moved too
        assert not np.allclose(got[0].numpy()[2], state[0][2])
    if case == "lion_lazy":
        np.testing.assert_array_equal(got[0].numpy()[2], state[0][2])
