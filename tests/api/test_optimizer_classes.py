"""The optimizer config classes generated from tf_tpu_emb/optimizers.py (the
optimizers TF's Python API lacks): the registry (tf_tpu_emb.optimizers.CLASSES
against the package's list), signatures, defaults and docstrings, the
OptimizationParameters each writes (against hand-written protos using the
field names of optimization_parameters.proto / core/optimizers.h), TF's own
TableConfig accepting them, and every validation error.
"""
import inspect

import numpy as np
import pytest
from google.protobuf import text_format
from tensorflow.python.tpu import tpu_embedding_v2_utils

import tf_features
import tf_tpu_emb
from optimizer_config_common import E, GENERATED, TableDescriptor, assert_proto, make, written
from tf_tpu_emb import optimizers as O

pytestmark = pytest.mark.tf_version


COMMON = ["use_gradient_accumulation", "clip_weight_min", "clip_weight_max",
          "weight_decay_factor", "multiply_weight_decay_factor_by_learning_rate", "clipvalue",
          "slot_variable_creation_fn", "low_dimensional_packing_status"]


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
