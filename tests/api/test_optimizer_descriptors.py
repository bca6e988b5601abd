"""Optimizers into TableDescriptors: ``fix_tf_optimizer`` makes TF's own
classes write the expected protos (spec §4.4 "Empirical
_set_optimization_parameters output") without touching the original,
``info_of``, and ``table_descriptor_for`` with TF's classes and ours, its
learning-rate and step-counter tags and its errors.
"""
import pytest
import tensorflow as tf
from google.protobuf import text_format

import engine_util as eu
import tf_features
import tf_tpu_emb
from optimizer_config_common import E, Params, TableDescriptor, assert_proto, make
from tf_tpu_emb import optimizers as O

pytestmark = pytest.mark.tf_version


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
