"""The state the optimizer config classes give the engine: slot names and
initial values against the C++ registry (Load op OpDef inputs; slots of a
freshly configured engine), ``_create_slots`` with and without
``slot_variable_creation_fn``, ``_load``/``_retrieve`` being our op
wrappers, and engine round trips (configure, load, enqueue, Recv, Send,
retrieve) compared with tests/common/optimizer_reference.py.
"""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import op_def_registry
from tensorflow.python.ops import init_ops_v2

import engine_util as eu
import optimizer_reference as ref
import tf_features
import tf_tpu_emb
from optimizer_config_common import E, GENERATED, make
from tf_tpu_emb import ops as tte_ops
from tf_tpu_emb import optimizers as O

pytestmark = pytest.mark.tf_version


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
