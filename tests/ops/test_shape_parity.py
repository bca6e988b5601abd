"""Shape-function parity: our ``TfTpuEmb>`` ops infer exactly what TF's core ops infer.

A deterministic generator produces several hundred ``TPUEmbeddingConfiguration``
byte strings -- valid and invalid, table mode and feature-descriptor mode,
every optimizer (but user_defined_program) with every gradient-accumulation
status, zero/negative/unknown sizes, and malformed bytes.  For every config,
each op whose shape function reads the config (RecvTPUEmbeddingActivations,
LoadAll/RetrieveAllTPUEmbeddingParameters) and, with the config attr set, the
ops that must *not* read it (SendTPUEmbeddingGradients, per-table Load/Retrieve),
are built in a fresh graph both as TF's core op and as ours.  Both must fail or
succeed together -- with the same exception type and, for the InvalidArgument
messages we reproduce, the same message -- and infer the same static shapes.
Config-independent ops (TPUEmbeddingActivations, SendTPUEmbeddingGradients,
EnqueueTPUEmbeddingSparseBatch, per-table Load/Retrieve) get their own sweeps
over input shapes and attrs.

Intentional differences, excluded from the comparison and tested on their own:
(a) a feature_descriptor whose table_id is outside [0, num_tables): TF reads out
of bounds (undefined behaviour), ours raises an error naming the feature;
(b) table mode with num_features * batch_size_per_tensor_core overflowing int32:
not generated; (c) user_defined_program: not generated; (d) TF's LoadAll /
RetrieveAll report some errors as an Internal RET_CHECK where ours reports
InvalidArgument: for those two ops only error-or-success is compared, plus the
messages when TF's error is an InvalidArgument one.
"""
import collections
import random
import re

import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_shape_pb2
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as opt_pb2
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as config_pb2
from tensorflow.python.framework import op_def_library
from tensorflow.python.framework import op_def_registry

from tf_tpu_emb import ops as tte_ops
from tf_tpu_emb.optimizers import OPTIMIZERS, tf_has_optimizer

PREFIX = tte_ops.PREFIX
Config = config_pb2.TPUEmbeddingConfiguration
GA = opt_pb2.GradientAccumulationStatus
GA_STATUSES = (GA.UNSPECIFIED, GA.ENABLED, GA.DISABLED)
MODES = (Config.UNSPECIFIED, Config.INFERENCE, Config.TRAINING, Config.BACKWARD_PASS_ONLY)
# No user_defined_program (c); only the optimizers this TF's protos can express
# (FrequencyAwareAdagrad from TF 2.19, tests/common/tf_features.py).
OPT_FIELDS = tuple(o.proto_field for o in OPTIMIZERS if tf_has_optimizer(o))
SPMD_FIELDS = Config.SpmdSharding.DESCRIPTOR.fields_by_name
MAX_STATE_VARIABLES = 8
GROUPS = ("parameters",) + tuple("auxiliary%d" % i for i in range(1, MAX_STATE_VARIABLES))

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]

# Config names -> reason, for parity bugs found and not yet fixed (xfail, strict).
KNOWN_PARITY_BUGS = {}  # name -> reason; none known

# ================================================================ generator

GeneratedConfig = collections.namedtuple("GeneratedConfig", ["name", "data"])


def _set_optimizer(table, field, status, rng):
    params = table.optimization_parameters
    if field is not None:
        getattr(params, field).SetInParent()
        if field == "adam":
            params.adam.beta1 = 0.9
        elif field == "ftrl":
            params.ftrl.lr_power = -0.5
    if rng.random() < 0.5:
        params.learning_rate.constant = rng.choice([0.1, 0.01, 1.0])
    elif rng.random() < 0.3:
        params.learning_rate.dynamic.tag = rng.randrange(2)
    params.gradient_accumulation_status = status


def _table(config, rng, *, vocab=10, dim=4, num_features=0, optimizer="adagrad",
           status=GA.UNSPECIFIED, name=None):
    table = config.table_descriptor.add()
    table.name = name if name is not None else "t%d" % (len(config.table_descriptor) - 1)
    table.vocabulary_size = vocab
    table.dimension = dim
    table.num_features = num_features
    _set_optimizer(table, optimizer, status, rng)
    return table


def _feature(config, table_id, shape, name=None):
    feature = config.feature_descriptor.add()
    feature.name = name if name is not None else "f%d" % (len(config.feature_descriptor) - 1)
    feature.table_id = table_id
    feature.input_shape.extend(shape)
    return feature


def _varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _tag(field, wire_type):
    return _varint(field << 3 | wire_type)


def _len_field(field, payload):
    return _tag(field, 2) + _varint(len(payload)) + payload


def _parse(data):
    """The config as Python's protobuf parses it, or None."""
    try:
        return Config.FromString(data)
    except Exception:  # noqa: BLE001 - any decode failure
        return None


def _has_out_of_range_table_id(data):
    config = _parse(data)
    return config is not None and any(
        not 0 <= f.table_id < len(config.table_descriptor) for f in config.feature_descriptor)


def _spec_configs(rng):
    """Hand-written edge cases (mostly the empirical table of the spec, section 2)."""
    out = []

    def add(name, config):
        out.append(GeneratedConfig(name, config.SerializeToString()))

    c = Config(batch_size_per_tensor_core=16, mode=Config.TRAINING)
    _table(c, rng, dim=8, num_features=1)
    _table(c, rng, dim=4, num_features=3, optimizer="stochastic_gradient_descent")
    add("spec_A_tables", c)
    c2 = Config()
    c2.CopyFrom(c)
    c2.batch_size_per_tensor_core = 0
    add("spec_B_batch0", c2)
    c = Config(batch_size_per_tensor_core=4, mode=Config.TRAINING)
    _table(c, rng, dim=2, num_features=0)
    add("spec_C_num_features0", c)
    c = Config(batch_size_per_tensor_core=16, mode=Config.TRAINING)
    _table(c, rng, dim=8)
    _table(c, rng, dim=4, optimizer="adam")
    _feature(c, 0, [16])
    _feature(c, 1, [16, 5])
    _feature(c, 0, [2, 3, 4])
    add("spec_D_features", c)
    c = Config(mode=Config.INFERENCE)
    _table(c, rng, dim=8)
    _feature(c, 0, [])
    add("spec_E_rank0_feature", c)
    c = Config(batch_size_per_tensor_core=4)
    _table(c, rng, dim=2, num_features=2)
    add("spec_K_mode_unspecified", c)
    c = Config(batch_size_per_tensor_core=999, mode=Config.TRAINING)
    _table(c, rng, dim=3, num_features=5)
    _feature(c, 0, [8, 2])
    add("features_ignore_table_fields", c)
    c = Config(mode=Config.TRAINING)
    _table(c, rng, dim=3)
    _feature(c, 0, [0, -1])
    add("feature_zero_and_unknown_dims", c)
    c = Config(batch_size_per_tensor_core=-2, mode=Config.TRAINING)
    _table(c, rng, dim=3, num_features=1)
    add("batch_below_minus1", c)
    c = Config(batch_size_per_tensor_core=2, mode=Config.TRAINING)
    _table(c, rng, dim=-3, num_features=1)
    add("dimension_below_minus1", c)
    c = Config(batch_size_per_tensor_core=2, mode=Config.TRAINING)
    _table(c, rng, dim=-1, num_features=1)
    _table(c, rng, dim=5, num_features=-1)
    add("unknown_dim_and_rows", c)
    c = Config(batch_size_per_tensor_core=-1, mode=Config.TRAINING)
    _table(c, rng, dim=2, num_features=-1)
    _table(c, rng, dim=2, num_features=1)
    _table(c, rng, dim=2, num_features=-3)
    add("negative_times_negative", c)
    c = Config(mode=Config.TRAINING)
    _table(c, rng, name="video", dim=4, vocab=8)
    _table(c, rng, name="user", dim=2, vocab=5, optimizer="ftrl")
    _feature(c, 0, [2], "watched")
    _feature(c, 0, [2], "favorited")
    _feature(c, 1, [2], "friends")
    _feature(c, 1, [2, 3], "seq")
    _feature(c, 0, [2, 4], "hd")
    add("v2_style_shared_tables", c)
    add("empty_config", Config())
    add("mode_only", Config(mode=Config.TRAINING))
    add("batch_only", Config(batch_size_per_tensor_core=8))
    c = Config(batch_size_per_tensor_core=2, mode=Config.TRAINING)
    _table(c, rng, num_features=1, optimizer=None)
    add("no_optimizer", c)
    c = Config(batch_size_per_tensor_core=2, mode=Config.TRAINING)
    _table(c, rng, num_features=1, optimizer=None, status=GA.DISABLED)
    _table(c, rng, num_features=1)
    add("no_optimizer_second_ok", c)
    c = Config(batch_size_per_tensor_core=2, mode=7)  # unknown (open) enum value
    _table(c, rng, num_features=1)
    add("unknown_mode_enum", c)
    c = Config(mode=Config.TRAINING)
    _table(c, rng, dim=4)
    _feature(c, 0, [2147483647, 2147483647, 2147483647])
    add("feature_too_many_elements", c)
    c = Config(mode=Config.TRAINING)
    _table(c, rng, dim=2147483647, vocab=2 ** 40)
    _feature(c, 0, [2147483647])
    add("huge_sizes", c)
    c = Config(mode=Config.TRAINING)
    _table(c, rng, dim=4)
    _feature(c, 0, [2, 3, 4, 5, 1, 2])
    add("feature_rank6", c)
    c = Config(mode=Config.TRAINING)
    _table(c, rng, dim=4)
    _feature(c, 0, [3, -2])
    add("feature_dim_below_minus1", c)
    c = Config(mode=Config.TRAINING)
    _table(c, rng, dim=0, vocab=3)
    _feature(c, 0, [3])
    add("dimension0", c)
    for vocab in (0, 1, 2, 3, -1, -2, -3, -5):
        c = Config(batch_size_per_tensor_core=2, mode=Config.TRAINING)
        _table(c, rng, vocab=vocab, num_features=1)
        _table(c, rng, vocab=7, num_features=1, optimizer="adam")
        add("vocab_%d" % vocab, c)
    c = Config(batch_size_per_tensor_core=2, mode=Config.TRAINING, num_hosts=2,
               num_tensor_cores=8, sharding_strategy=Config.MOD,
               pipeline_execution_with_tensor_core=True, profile_data_directory="/tmp/x")
    c.spmd_sharding.enabled = True
    c.spmd_sharding.num_cores_per_replica = 2
    _table(c, rng, num_features=2)
    add("all_top_level_fields", c)
    for name, features, spmd in (
            ("spmd_tables_x2", None, dict(enabled=True, num_cores_per_replica=2)),
            ("spmd_tables_x3_manual", None, dict(enabled=True, num_cores_per_replica=3,
                                                 use_manual_partitioning=True)),
            ("spmd_tables_disabled", None, dict(enabled=False, num_cores_per_replica=3)),
            ("spmd_tables_x1", None, dict(enabled=True, num_cores_per_replica=1)),
            ("spmd_tables_x0", None, dict(enabled=True, num_cores_per_replica=0)),
            ("spmd_tables_enabled_only", None, dict(enabled=True)),
            ("spmd_tables_minus1", None, dict(enabled=True, num_cores_per_replica=-1)),
            ("spmd_tables_shardy_x4", None, dict(enabled=True, num_cores_per_replica=4,
                                                 use_shardy_partitioner=True)),
            ("spmd_features_x2", [[5], [5, 3], []], dict(enabled=True, num_cores_per_replica=2)),
            ("spmd_features_x2_manual", [[5], [5, 3], []],
             dict(enabled=True, num_cores_per_replica=2, use_manual_partitioning=True)),
            ("spmd_features_unknown_x2", [[-1, 3]], dict(enabled=True, num_cores_per_replica=2)),
            ("spmd_features_unknown_x1", [[-1, 3]], dict(enabled=True, num_cores_per_replica=1)),
            ("spmd_features_x8", [[16, 2, 3, 4]], dict(enabled=True, num_cores_per_replica=8))):
        if not all(f in SPMD_FIELDS for f in spmd):
            continue  # e.g. use_manual_partitioning: TF >= 2.19 only
        c = Config(mode=Config.TRAINING, batch_size_per_tensor_core=0 if features else 2)
        _table(c, rng, dim=4, num_features=0 if features else 3)
        for shape in features or ():
            _feature(c, 0, shape)
        for field, value in spmd.items():
            setattr(c.spmd_sharding, field, value)
        add(name, c)
    return out


def _optimizer_configs(rng):
    """Every optimizer with every gradient-accumulation status, plus none set."""
    out = []
    for field in OPT_FIELDS + (None,):
        for status in GA_STATUSES:
            c = Config(batch_size_per_tensor_core=rng.choice([1, 2, 8]),
                       mode=rng.choice(MODES))
            _table(c, rng, vocab=rng.choice([5, 10, 13]), dim=rng.choice([1, 3, 4]),
                   num_features=rng.choice([1, 2]), optimizer=field, status=status)
            if rng.random() < 0.5:  # a second table, so per-table layouts differ
                _table(c, rng, vocab=rng.choice([4, 9]), dim=2, num_features=1,
                       optimizer=rng.choice(OPT_FIELDS), status=rng.choice(GA_STATUSES))
            out.append(GeneratedConfig(
                "opt_%s_%s" % (field or "none", GA.Status.Name(status).lower()),
                c.SerializeToString()))
    return out


def _random_table_mode(rng, i):
    c = Config(mode=rng.choice(MODES))
    c.batch_size_per_tensor_core = rng.choice([1, 2, 4, 16, 128, 0, -1, -2, rng.randrange(1, 999)])
    for _ in range(rng.choice([0, 1, 1, 2, 3, 4])):
        _table(c, rng,
               vocab=rng.choice([1, 2, 3, 4, 10, 100, 2 ** 33 + 1, 0, -1, -3]),
               dim=rng.choice([1, 2, 4, 8, 64, 0, -1, -2, rng.randrange(1, 300)]),
               num_features=rng.choice([1, 1, 2, 3, 0, -1, -2, rng.randrange(1, 999)]),
               optimizer=rng.choice(OPT_FIELDS + (None,)), status=rng.choice(GA_STATUSES))
    # (b): keep num_features * batch_size_per_tensor_core inside int32.
    assert all(abs(t.num_features * c.batch_size_per_tensor_core) < 2 ** 31
               for t in c.table_descriptor)
    return GeneratedConfig("rand_tables_%03d" % i, c.SerializeToString())


def _random_shape(rng):
    rank = rng.choice([0, 1, 1, 2, 2, 3, 4])
    dims = []
    for d in range(rank):
        r = rng.random()
        if r < 0.08:
            dims.append(0)
        elif r < 0.18:
            dims.append(-1)
        elif r < 0.21:
            dims.append(-2)
        elif d == 0:
            dims.append(rng.choice([1, 2, 8, 16, 128, rng.randrange(1, 5000)]))
        else:
            dims.append(rng.choice([1, 2, 3, 5, 7, 20]))
    return dims


def _random_feature_mode(rng, i):
    c = Config(mode=rng.choice(MODES))
    if rng.random() < 0.3:
        c.batch_size_per_tensor_core = rng.choice([1, 16, -5, 0])
    n_tables = rng.choice([1, 1, 2, 3])
    for _ in range(n_tables):
        _table(c, rng, vocab=rng.choice([1, 2, 3, 10, 50, 0, -2]),
               dim=rng.choice([1, 2, 4, 16, -1, 0, -4] if rng.random() < 0.2 else [1, 2, 4, 16]),
               num_features=rng.choice([0, 0, 0, 3, -1]),
               optimizer=rng.choice(OPT_FIELDS), status=rng.choice(GA_STATUSES))
    batch = rng.choice([1, 2, 4, 16, 64])
    for _ in range(rng.choice([1, 1, 2, 3, 5])):
        kind = rng.random()
        if kind < 0.3:
            shape = [batch]
        elif kind < 0.55:
            shape = [batch, rng.choice([1, 3, 10])]  # sequence-like [B, L]
        else:
            shape = _random_shape(rng)
        _feature(c, rng.randrange(n_tables), shape)  # features may share a table
    return GeneratedConfig("rand_features_%03d" % i, c.SerializeToString())


def _wire_type_configs():
    """Hand-made wire encodings: wrong wire types, bad tags, unpacked repeated, ..."""
    table = (_len_field(1, b"t") + _tag(2, 0) + _varint(10) + _tag(3, 0) + _varint(4)
             + _tag(4, 0) + _varint(1)
             + _len_field(5, _len_field(3, b"")))  # optimization_parameters {adagrad {}}
    good = _len_field(1, table) + _tag(3, 0) + _varint(2)
    feature = _len_field(1, b"f") + _tag(2, 0) + _varint(0)
    cases = {
        "wire_reference_ok": good,
        "wire_table_as_varint": _tag(1, 0) + _varint(5),
        "wire_batch_as_len": _len_field(1, table) + _len_field(3, b"\x01\x02"),
        "wire_batch_as_fixed32": _len_field(1, table) + _tag(3, 5) + b"\x02\x00\x00\x00",
        "wire_mode_as_fixed64": good + _tag(2, 1) + b"\x02" + b"\x00" * 7,
        "wire_feature_as_fixed32": good + _tag(10, 5) + b"\x00\x00\x00\x00",
        "wire_start_group_unterminated": good + _tag(1, 3),
        "wire_lone_end_group": good + _tag(1, 4),
        "wire_type_6": good + _tag(3, 6) + b"\x00",
        "wire_type_7": _tag(2, 7),
        "wire_field_number_0": _tag(0, 0) + b"\x01" + good,
        "wire_overlong_varint": good + _tag(3, 0) + b"\xff" * 10 + b"\x01",
        "wire_len_past_end": good + _tag(1, 2) + _varint(50) + b"\x00",
        "wire_truncated_varint": good + _tag(3, 0) + b"\x80",
        "wire_nested_dimension_as_len": _len_field(1, _len_field(3, b"\x04")
                                                   + _tag(4, 0) + _varint(1))
                                        + _tag(3, 0) + _varint(2),
        "wire_invalid_utf8_table_name": _len_field(1, _len_field(1, b"\xff\xfe") + table[3:])
                                        + _tag(3, 0) + _varint(2),
        "wire_invalid_utf8_feature_name": good + _len_field(
            10, _len_field(1, b"\xc3\x28") + _tag(2, 0) + _varint(0) + _len_field(3, b"\x02")),
        "wire_input_shape_unpacked": good + _len_field(
            10, feature + _tag(3, 0) + _varint(2) + _tag(3, 0) + _varint(3)),
        "wire_input_shape_packed": good + _len_field(
            10, feature + _len_field(3, _varint(2) + _varint(3))),
        "wire_input_shape_mixed": good + _len_field(
            10, feature + _len_field(3, _varint(2)) + _tag(3, 0) + _varint(3)),
        "wire_input_shape_bad_packed": good + _len_field(10, feature + _len_field(3, b"\x80")),
        "wire_batch_minus1_5byte_varint": _len_field(1, table) + _tag(3, 0)
                                          + b"\xff\xff\xff\xff\x0f",
        "wire_batch_minus1_10byte_varint": _len_field(1, table) + _tag(3, 0) + _varint(-1),
        "wire_unknown_field_99": good + _len_field(99, b"junk"),
        "wire_reserved_field_8": good + _len_field(8, b"\x08\x01"),
        "wire_repeated_scalar_last_wins": good + _tag(3, 0) + _varint(5),
        "wire_optimizer_oneof_twice": _len_field(1, table + _len_field(5, _len_field(4, b"")))
                                      + _tag(3, 0) + _varint(2),
        "wire_other_message_optimization_parameters":
            opt_pb2.OptimizationParameters(adam=opt_pb2.AdamParameters(beta1=0.5))
            .SerializeToString(),
        "wire_other_message_tensor_shape": tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=3, name="x")]).SerializeToString(),
    }
    return [GeneratedConfig(name, data) for name, data in cases.items()]


def _garbage_configs(rng, valid):
    out = []
    while len(out) < 16:
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 48)))
        if not _has_out_of_range_table_id(data):
            out.append(GeneratedConfig("garbage_%02d" % len(out), data))
    sources = [g for g in valid if len(g.data) > 4]
    while len(out) < 36:
        source = rng.choice(sources)
        data = source.data[:rng.randrange(1, len(source.data))]
        if not _has_out_of_range_table_id(data):
            out.append(GeneratedConfig("truncated_%02d_%s" % (len(out) - 16, source.name), data))
    return out


def _out_of_range_configs(rng):
    """(a): feature_descriptor table_id outside [0, num_tables)."""
    out = []
    for name, n_tables, ids in (("oob_table_id_3_of_1", 1, [3]),
                                ("oob_table_id_minus1", 1, [-1, 0]),
                                ("oob_table_id_2_of_2", 2, [0, 1, 2]),
                                ("oob_table_id_large", 2, [1000]),
                                ("oob_no_tables", 0, [0]),
                                ("oob_int32_min", 1, [-2 ** 31])):
        c = Config(mode=Config.TRAINING)
        for _ in range(n_tables):
            _table(c, rng, dim=7, vocab=6)
        for k, table_id in enumerate(ids):
            _feature(c, table_id, [4], name="feat%d_tbl%d" % (k, table_id))
        out.append(GeneratedConfig(name, c.SerializeToString()))
    return out


def generate_configs(seed=20240521):
    rng = random.Random(seed)
    valid = _spec_configs(rng) + _optimizer_configs(rng)
    valid += [_random_table_mode(rng, i) for i in range(60)]
    valid += [_random_feature_mode(rng, i) for i in range(70)]
    configs = valid + _wire_type_configs() + _garbage_configs(rng, valid)
    names = [c.name for c in configs]
    assert len(set(names)) == len(names)
    assert not any(_has_out_of_range_table_id(c.data) for c in configs)
    return configs


CONFIGS = generate_configs()
OOB_CONFIGS = _out_of_range_configs(random.Random(7))


def test_generator_is_deterministic_and_large():
    assert len(CONFIGS) >= 200
    assert generate_configs() == CONFIGS
    parsed = [_parse(c.data) for c in CONFIGS]
    assert sum(p is None for p in parsed) >= 20  # malformed bytes are really there
    assert sum(p is not None and len(p.feature_descriptor) > 0 for p in parsed) >= 60
    assert sum(p is not None and not p.feature_descriptor and len(p.table_descriptor) > 0
               for p in parsed) >= 60
    cases = {p.table_descriptor[0].optimization_parameters.WhichOneof("parameters")
             for p in parsed if p is not None and p.table_descriptor}
    assert cases == set(OPT_FIELDS) | {None}


# ====================================================== building and comparing

Outcome = collections.namedtuple("Outcome", ["error", "message", "shapes"])


class Ph(collections.namedtuple("Ph", ["shape", "dtype"])):
    """A placeholder spec: shape is a tuple (None entries = unknown) or None."""
    __slots__ = ()

    def __new__(cls, shape, dtype=tf.float32):
        return super().__new__(cls, None if shape is None else tuple(shape), dtype)


def _shape_of(tensor):
    return None if tensor.shape.rank is None else tensor.shape.as_list()


def _materialize(value, cache):
    if isinstance(value, Ph):
        if value not in cache:
            cache[value] = tf.compat.v1.placeholder(
                value.dtype, shape=None if value.shape is None else list(value.shape))
        return cache[value]
    if isinstance(value, list) and value and isinstance(value[0], Ph):
        return [_materialize(v, cache) for v in value]
    return value


def _try_build(op_type, kwargs, cache, name):
    try:
        _, _, op, _ = op_def_library._apply_op_helper(
            op_type, name=name, **{k: _materialize(v, cache) for k, v in kwargs.items()})
    except Exception as e:  # noqa: BLE001 - the exception itself is the result
        return Outcome(type(e), str(e), None)
    return Outcome(None, "", [_shape_of(t) for t in op.outputs])


def build_pair(bare, **kwargs):
    """Builds TF's op `bare` and ours in a fresh graph; returns (core, ours)."""
    with tf.Graph().as_default():
        cache = {}
        core = _try_build(bare, kwargs, cache, "core")
        ours = _try_build(PREFIX + bare, _with_engine(bare, kwargs), cache, "ours")
    return core, ours


def _with_engine(bare, kwargs):
    """Our op's kwargs: its last attr `engine` (absent from TF's op) as the
    generated wrapper passes it by default."""
    attrs = [a.name for a in op_def_registry.get(PREFIX + bare).attr]
    return dict(kwargs, engine="") if "engine" in attrs else kwargs


def build_ours(bare, **kwargs):
    with tf.Graph().as_default():
        return _try_build(PREFIX + bare, _with_engine(bare, kwargs), {}, "ours")


# InvalidArgument messages our shape functions reproduce (or share with TF's
# shape-inference helpers).  Every instance in TF's message, numbers included,
# must be in ours.
KEY_PHRASES = tuple(re.compile(p) for p in (
    r"Malformed tpu_embedding_config\.",
    r"num outputs != size of output shapes",
    r"Shape \[[-0-9,?]*\] has dimensions with values below -1",
    r"Shape \[[-0-9,?]*\] is too large",
    r"exactly one of table_id or table_name must be non-default",
    r"Invalid length of combiners\. Have \d+ but expected 0 or \d+",
    r"Shape must be rank \d+ but is rank \d+",
    r"Shape must be at least rank \d+ but is rank \d+",
    r"Dimension \d+ in both shapes must be equal, but are -?\d+ and -?\d+",
    r"Dimension must be -?\d+ but is -?\d+",
    r"All embedding shards must be non-empty, shard ID: -?\d+ is empty, "
    r"vocabulary size: -?\d+, number of shards: -?\d+",
    r"The number of shards for the embedding layer must be > 0\. Currently set to: -?\d+",
    r"The value of shard_id must be >= 0 and < -?\d+\. Currently set to: -?\d+",
    r"No optimization algorithm specified",
))

ALL_TABLES_OPS = ("LoadAllTPUEmbeddingParameters", "RetrieveAllTPUEmbeddingParameters")


def mismatch(bare, core, ours, case):
    """A description of how `ours` differs from `core`, or None."""
    where = "%s %s" % (bare, case)
    if core.error is TypeError:  # the op was never built: a bug of this file
        return "%s: harness error, TF raised TypeError(%r)" % (where, core.message[:300])
    if (core.error is None) != (ours.error is None):
        return "%s: TF %s, ours %s" % (
            where, "OK %s" % (core.shapes,) if core.error is None else
            "%s(%r)" % (core.error.__name__, core.message[:300]),
            "OK %s" % (ours.shapes,) if ours.error is None else
            "%s(%r)" % (ours.error.__name__, ours.message[:300]))
    if core.error is None:
        if core.shapes != ours.shapes:
            return "%s: shapes TF %s, ours %s" % (where, core.shapes, ours.shapes)
        return None
    if bare not in ALL_TABLES_OPS and core.error is not ours.error:
        return "%s: TF raised %s(%r), ours %s(%r)" % (
            where, core.error.__name__, core.message[:300], ours.error.__name__,
            ours.message[:300])
    if core.error is ValueError:  # an InvalidArgument from the shape function
        for phrase in KEY_PHRASES:
            expected = phrase.findall(core.message)
            if expected and phrase.findall(ours.message) != expected:
                return "%s: TF says %r, ours %r" % (where, core.message[:300],
                                                    ours.message[:300])
    return None


def assert_parity(results, label=""):
    problems = [m for m in (mismatch(*r) for r in results) if m]
    assert not problems, "%s: %d parity mismatch(es):\n  %s" % (
        label, len(problems), "\n  ".join(problems))


def test_comparator_detects_differences():
    ok = Outcome(None, "", [[2, 4]])
    bad_value = Outcome(ValueError, "Shape must be rank 2 but is rank 1 for 'x'", None)
    other_value = Outcome(ValueError, "Shape must be rank 2 but is rank 3 for 'x'", None)
    internal = Outcome(tf.errors.InternalError, "RET_CHECK failure", None)
    recv = "RecvTPUEmbeddingActivations"
    assert mismatch(recv, ok, ok, "") is None
    assert mismatch(recv, bad_value, bad_value, "") is None
    assert mismatch(recv, ok, Outcome(None, "", [[2, None]]), "")
    assert mismatch(recv, ok, bad_value, "") and mismatch(recv, bad_value, ok, "")
    assert mismatch(recv, bad_value, other_value, "")  # same phrase, other numbers
    assert mismatch(recv, internal, bad_value, "")  # exception types differ
    assert mismatch("LoadAllTPUEmbeddingParameters", internal, bad_value, "") is None  # (d)
    assert mismatch("LoadAllTPUEmbeddingParameters", bad_value, other_value, "")
    assert mismatch(recv, Outcome(TypeError, "No argument", None),
                    Outcome(TypeError, "No argument", None), "")  # harness error
    with pytest.raises(AssertionError, match="1 parity mismatch"):
        assert_parity([(recv, ok, bad_value, "case")])


# ========================================================== per-config sweep

def _count_outputs(parsed):
    if parsed is None:
        return 1
    return len(parsed.feature_descriptor) or len(parsed.table_descriptor)


VALID_SHARDINGS = ((2, 0), (2, 1), (3, 2), (4, 3), (4, 0), (3, 1))
INVALID_SHARDINGS = ((0, 0), (-1, 0), (2, 2), (3, -1), (1, 1))
SHARDINGS = ((1, 0),) + VALID_SHARDINGS + INVALID_SHARDINGS
LEARNING_RATES = ([], [()], [(), ()], [(3,)], [None], [(), (1,)], [(None,)], [(1, 1)])


def _fallback_groups(n_tables):
    """Plausible LoadAll inputs when TF could not tell us the right ones."""
    return [[(4, 4)] * n_tables, [(4, 4)] * n_tables] + [[(0, 0)] * n_tables] * 6


def _groups_kwargs(groups):
    return {name: [Ph(s) for s in shapes] for name, shapes in zip(GROUPS, groups)}


def _retrieved_groups(outcome, n_tables):
    """RetrieveAll's outputs regrouped: what LoadAll must accept."""
    return [[tuple(outcome.shapes[g * n_tables + t]) for t in range(n_tables)]
            for g in range(MAX_STATE_VARIABLES)]


def _all_tables_cases(gen, parsed, index, exhaustive=False):
    """(bare, core, ours, case) for LoadAll/RetrieveAll over shardings and inputs.

    TF's RET_CHECK errors are slow (~15 ms each), so unless `exhaustive` the
    shardings, the input variants and the NumTables mismatches are rotated over
    the configs: every one of them still runs for dozens of configs.
    """
    results = []
    n_tables = max(1, len(parsed.table_descriptor)) if parsed is not None else 1
    probe = build_pair("RetrieveAllTPUEmbeddingParameters", NumTables=n_tables,
                       config=gen.data, num_shards=1, shard_id=0)
    config_ok = probe[0].error is None
    if exhaustive:
        shardings = SHARDINGS
    elif config_ok:
        shardings = [(1, 0), VALID_SHARDINGS[index % len(VALID_SHARDINGS)],
                     VALID_SHARDINGS[(index + 2) % len(VALID_SHARDINGS)],
                     INVALID_SHARDINGS[index % len(INVALID_SHARDINGS)]]
    else:  # a config-level error: the sharding hardly matters
        shardings = [(1, 0), INVALID_SHARDINGS[index % len(INVALID_SHARDINGS)]]
    right = {}
    for num_shards, shard_id in shardings:
        attrs = dict(config=gen.data, num_shards=num_shards, shard_id=shard_id)
        case = "num_shards=%d shard_id=%d" % (num_shards, shard_id)
        if (num_shards, shard_id) == (1, 0):
            core, ours = probe
        else:
            core, ours = build_pair("RetrieveAllTPUEmbeddingParameters", NumTables=n_tables,
                                    **attrs)
        results.append(("RetrieveAllTPUEmbeddingParameters", core, ours, case))
        groups = (_retrieved_groups(core, n_tables) if core.error is None
                  else _fallback_groups(n_tables))
        if core.error is None:
            right[(num_shards, shard_id)] = groups
        core, ours = build_pair("LoadAllTPUEmbeddingParameters", **_groups_kwargs(groups), **attrs)
        results.append(("LoadAllTPUEmbeddingParameters", core, ours, case + " right shapes"))

    wrong_counts = [n_tables + 1, n_tables - 1]
    if not exhaustive:
        wrong_counts = [wrong_counts[index // 4 % 2]] if index % 4 == 0 else []
    for wrong in wrong_counts:
        if wrong >= 1:
            attrs = dict(config=gen.data, num_shards=1, shard_id=0)
            core, ours = build_pair("RetrieveAllTPUEmbeddingParameters", NumTables=wrong, **attrs)
            results.append(("RetrieveAllTPUEmbeddingParameters", core, ours,
                            "NumTables=%d" % wrong))
            groups = [(g * 2)[:wrong] for g in right.get((1, 0), _fallback_groups(n_tables))]
            core, ours = build_pair("LoadAllTPUEmbeddingParameters", **_groups_kwargs(groups),
                                    **attrs)
            results.append(("LoadAllTPUEmbeddingParameters", core, ours,
                            "NumTables=%d" % wrong))
    if not right and not exhaustive:
        return results

    # Input-shape variants at one valid sharding (rotated over configs).
    valid = sorted(right) or [(1, 0)]
    num_shards, shard_id = valid[index % len(valid)]
    base = right.get((num_shards, shard_id), _fallback_groups(n_tables))
    n_vars = sum(1 for g in base if g[0] != (0, 0))
    t = index % n_tables

    def grow(shape, axis):
        if shape is None or shape[axis] is None:
            return shape
        return tuple(d + 1 if i == axis else d for i, d in enumerate(shape))

    def set_all(groups, shape):
        for g in groups:
            g[:] = [shape] * len(g)

    variants = [
        ("all unknown rank", lambda g: set_all(g, None)),
        ("all [None, None]", lambda g: set_all(g, (None, None))),
        ("empty groups as [0]", lambda g: [
            g[i].__setitem__(t, (0,)) for i in range(max(1, n_vars), MAX_STATE_VARIABLES)]),
        ("empty groups as [2, 0, 5]", lambda g: [
            g[i].__setitem__(t, (2, 0, 5)) for i in range(max(1, n_vars), MAX_STATE_VARIABLES)]),
        ("parameters rows+1", lambda g: g[0].__setitem__(t, grow(g[0][t], 0))),
        ("all state rows+1", lambda g: [
            g[i].__setitem__(t, grow(g[i][t], 0)) for i in range(max(1, n_vars))]),
        ("all state dim+1", lambda g: [
            g[i].__setitem__(t, grow(g[i][t], 1)) for i in range(max(1, n_vars))]),
        ("aux1 dim+1", lambda g: g[1].__setitem__(t, grow(g[1][t], 1) if n_vars > 1
                                                  else (1, 1))),
        ("aux7 non-empty [2, 3]", lambda g: g[7].__setitem__(t, (2, 3))),
        ("parameters rank 1", lambda g: g[0].__setitem__(t, (4,))),
        ("parameters rank 3", lambda g: g[0].__setitem__(t, (4, 4, 1))),
        ("last state var rank 1", lambda g: g[max(1, n_vars) - 1].__setitem__(t, (4,))),
        ("parameters [None, dim]", lambda g: g[0].__setitem__(
            t, None if g[0][t] is None else (None,) + tuple(g[0][t][1:]))),
    ]
    if not exhaustive:
        variants = [variants[(index * 5 + k) % len(variants)] for k in range(5)]
    for description, mutate in variants:
        groups = [list(g) for g in base]
        mutate(groups)
        core, ours = build_pair("LoadAllTPUEmbeddingParameters", **_groups_kwargs(groups),
                                config=gen.data, num_shards=num_shards, shard_id=shard_id)
        results.append(("LoadAllTPUEmbeddingParameters", core, ours, "num_shards=%d shard_id=%d "
                        "%s (table %d)" % (num_shards, shard_id, description, t)))
    return results


def _selector(**selector):
    """table_id/table_name/config attrs, defaults filled in (_apply_op_helper
    wants every non-type attr, like the generated wrappers pass them)."""
    return dict(dict(table_id=-1, table_name="", config=b""), **selector)


def _config_results(gen, index):
    parsed = _parse(gen.data)
    results = []
    n = _count_outputs(parsed)
    recv_shapes = None
    for num_outputs in (n, n + 1, n - 1):
        core, ours = build_pair("RecvTPUEmbeddingActivations", num_outputs=num_outputs,
                                config=gen.data)
        results.append(("RecvTPUEmbeddingActivations", core, ours,
                        "num_outputs=%d" % num_outputs))
        if num_outputs == n and core.error is None:
            recv_shapes = core.shapes

    grads = [Ph(s) for s in (recv_shapes or [[2, 2]])]
    for k in (index, index + 3):
        rates = LEARNING_RATES[k % len(LEARNING_RATES)]
        core, ours = build_pair("SendTPUEmbeddingGradients", inputs=grads,
                                learning_rates=[Ph(s) for s in rates], config=gen.data)
        results.append(("SendTPUEmbeddingGradients", core, ours, "learning_rates=%s" % (rates,)))

    # Per-table ops must not read the config.
    core_table_opts = [o for o in OPTIMIZERS if o.core_has_table_ops]
    info = core_table_opts[index % len(core_table_opts)]
    tensors = ("parameters",) + info.slots
    load = "LoadTPUEmbedding%sParameters" % info.op_infix
    for selector, shapes in ((dict(table_id=0), [(10, 4)] * len(tensors)),
                             (dict(table_name="t0"), [(10, 4)] + [(10, 5)] * (len(tensors) - 1)),
                             (dict(), [(10, 4)] * len(tensors))):
        core, ours = build_pair(load, num_shards=2, shard_id=index % 3,
                                **_selector(config=gen.data, **selector),
                                **{k: Ph(s) for k, s in zip(tensors, shapes)})
        results.append((load, core, ours, "%s %s" % (selector, shapes)))
    retrieve = "RetrieveTPUEmbedding%sParameters" % info.op_infix
    core, ours = build_pair(retrieve, num_shards=1, shard_id=0,
                            **_selector(config=gen.data, table_id=index % 3))
    results.append((retrieve, core, ours, "table_id=%d" % (index % 3)))

    results += _all_tables_cases(gen, parsed, index)
    return results


def _config_params():
    params = []
    for index, gen in enumerate(CONFIGS):
        marks = ()
        if gen.name in KNOWN_PARITY_BUGS:
            marks = pytest.mark.xfail(reason=KNOWN_PARITY_BUGS[gen.name], strict=True)
        params.append(pytest.param(index, gen, marks=marks, id="%03d-%s" % (index, gen.name)))
    return params


@pytest.mark.parametrize("index,gen", _config_params())
def test_config_parity(index, gen):
    assert_parity(_config_results(gen, index), "config %s (bytes %r)" % (gen.name, gen.data[:200]))


EXHAUSTIVE_CONFIGS = ("spec_A_tables", "spec_D_features", "v2_style_shared_tables", "vocab_1",
                      "vocab_3", "vocab_-3", "opt_centered_rms_prop_enabled",
                      "opt_assign_disabled", "opt_none_unspecified", "empty_config",
                      "wire_reference_ok", "garbage_00")


@pytest.mark.parametrize("name", EXHAUSTIVE_CONFIGS)
def test_all_tables_ops_exhaustive(name):
    """Every sharding, every input variant and both NumTables mismatches."""
    index = [g.name for g in CONFIGS].index(name)
    gen = CONFIGS[index]
    results = _all_tables_cases(gen, _parse(gen.data), index, exhaustive=True)
    assert len(results) >= 2 * len(SHARDINGS)
    assert_parity(results, name)


def test_sweep_is_not_vacuous():
    """Over a sample of configs, each swept op both succeeds and fails (with
    InvalidArgument) for TF, so the parity checks compare real shapes and errors."""
    seen = collections.defaultdict(set)
    for index, gen in list(enumerate(CONFIGS))[::6]:
        for bare, core, _, _ in _config_results(gen, index):
            kind = "Load" if bare.startswith("LoadTPU") else (
                "Retrieve" if bare.startswith("RetrieveTPU") else bare)
            seen[kind].add(core.error.__name__ if core.error else "ok")
    for op in ("RecvTPUEmbeddingActivations", "SendTPUEmbeddingGradients", "Load",
               "LoadAllTPUEmbeddingParameters", "RetrieveAllTPUEmbeddingParameters"):
        assert {"ok", "ValueError"} <= seen[op], (op, seen[op])
    assert "InternalError" in seen["LoadAllTPUEmbeddingParameters"]
    assert "ok" in seen["Retrieve"] and "TypeError" not in set().union(*seen.values())


# ================================================ (a) out-of-range table_id

@pytest.mark.parametrize("gen", OOB_CONFIGS, ids=lambda g: g.name)
def test_feature_table_id_out_of_range_is_an_error(gen):
    parsed = _parse(gen.data)
    n = len(parsed.feature_descriptor)
    bad = [f for f in parsed.feature_descriptor
           if not 0 <= f.table_id < len(parsed.table_descriptor)][0]
    outcome = build_ours("RecvTPUEmbeddingActivations", num_outputs=n, config=gen.data)
    assert outcome.error is ValueError, outcome
    assert bad.name in outcome.message and str(bad.table_id) in outcome.message, outcome.message
    # The all-tables ops never look at features: full parity there.
    results = [r for r in _all_tables_cases(gen, parsed, 0)]
    assert_parity(results, gen.name)


# ============================================== config-independent sweeps

ACT_SHAPES = [(), (3,), (None, 4), (2, 3, 4), None, (0, 5), (None, None, None, None, None),
              (16, 8), (1, 0, 7)]
VAR_SHAPES = [(10, 4), None, (1,), (0,)]


@pytest.mark.parametrize("act_shape", ACT_SHAPES, ids=str)
def test_tpu_embedding_activations_parity(act_shape):
    results = []
    for var_shape in VAR_SHAPES:
        for table_id, lookup_id in ((0, 0), (3, 7), (-1, 0), (0, -1), (2 ** 31 - 1, 1)):
            core, ours = build_pair("TPUEmbeddingActivations", embedding_variable=Ph(var_shape),
                                    sliced_activations=Ph(act_shape), table_id=table_id,
                                    lookup_id=lookup_id)
            results.append(("TPUEmbeddingActivations", core, ours,
                            "var=%s ids=%s" % (var_shape, (table_id, lookup_id))))
            if table_id >= 0 and lookup_id >= 0:  # the output is the activations, exactly
                assert ours.error is None and ours.shapes == [
                    None if act_shape is None else list(act_shape)], ours
    assert_parity(results, "act_shape=%s" % (act_shape,))


@pytest.mark.parametrize("rates", LEARNING_RATES, ids=str)
def test_send_gradients_parity(rates):
    results = []
    for grads in ([(4, 2)], [(4, 2), None, (1, 2, 3)], [()]):
        for config in (b"", b"\xff\xff", CONFIGS[0].data):
            core, ours = build_pair("SendTPUEmbeddingGradients", inputs=[Ph(s) for s in grads],
                                    learning_rates=[Ph(s) for s in rates], config=config)
            results.append(("SendTPUEmbeddingGradients", core, ours,
                            "grads=%s config=%r" % (grads, config[:8])))
            expect_ok = all(shape is None or shape == () for shape in rates)
            assert (ours.error is None) == expect_ok, (grads, ours)
    assert_parity(results, "learning_rates=%s" % (rates,))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_enqueue_sparse_batch_parity(n):
    results = []
    for combiners in ([], ["sum"] * n, ["mean"] * (n + 1), ["sqrtn"], ["max"] * n,
                      ["sum", "mean"], ["sum"] * max(0, n - 1)):
        for t1, t2, t3 in ((tf.int32, tf.int32, tf.float32), (tf.int64, tf.int64, tf.float64)):
            core, ours = build_pair(
                "EnqueueTPUEmbeddingSparseBatch",
                sample_indices=[Ph((None,), t1)] * n, embedding_indices=[Ph((None,), t2)] * n,
                aggregation_weights=[Ph((None,), t3)] * n, mode_override="train",
                device_ordinal=0, combiners=combiners)
            results.append(("EnqueueTPUEmbeddingSparseBatch", core, ours,
                            "combiners=%s types=%s" % (combiners, (t1.name, t2.name, t3.name))))
            assert (ours.error is None) == (len(combiners) in (0, n)), (combiners, ours)
    assert_parity(results, "N=%d" % n)


TABLE_SELECTORS = (dict(table_id=0), dict(table_id=5), dict(table_name="t"),
                   dict(), dict(table_id=0, table_name="t"), dict(table_id=-7),
                   dict(table_id=-7, table_name="t"), dict(table_id=1, config=b"\xff garbage"))


def _table_load_shape_cases(n):
    """Input shape lists for a Load op with n tensors."""
    cases = [[(10, 4)] * n, [None] * n, [(None, None)] * n, [(10, None)] + [(None, 4)] * (n - 1),
             [(4,)] + [(10, 4)] * (n - 1), [(10, 4, 1)] * n, [(0, 4)] * n, [()] * n]
    if n > 1:
        cases += [[(10, 4)] * (n - 1) + [(10, 5)], [(10, 4)] * (n - 1) + [(9, 4)],
                  [(10, 4)] * (n - 1) + [(10,)], [(10, 4)] * (n - 1) + [None],
                  [(10, 4)] + [(3, None)] * (n - 1)]
    return cases


def _table_op_cases(bare_load, bare_retrieve, n, build):
    tensors_results = []
    for selector in TABLE_SELECTORS:
        for shapes in _table_load_shape_cases(n):
            tensors_results.append(((bare_load, selector, shapes), build(
                bare_load, num_shards=1, shard_id=0, **_selector(**selector),
                **{"_%d" % i: Ph(s) for i, s in enumerate(shapes)})))
        for num_shards, shard_id in ((1, 0), (2, 5), (0, 0), (-3, -1)):
            tensors_results.append(((bare_retrieve, selector, (num_shards, shard_id)), build(
                bare_retrieve, num_shards=num_shards, shard_id=shard_id,
                **_selector(**selector))))
    return tensors_results


@pytest.mark.parametrize("info", [o for o in OPTIMIZERS if o.core_has_table_ops],
                         ids=lambda o: o.op_infix)
def test_table_load_retrieve_parity(info):
    tensors = ("parameters",) + info.slots
    load = "LoadTPUEmbedding%sParameters" % info.op_infix
    retrieve = "RetrieveTPUEmbedding%sParameters" % info.op_infix

    def build(bare, **kwargs):
        named = {(tensors[int(k[1:])] if k.startswith("_") else k): v for k, v in kwargs.items()}
        return build_pair(bare, **named)

    results = [(key[0], core, ours, "%s %s" % key[1:])
               for key, (core, ours) in _table_op_cases(load, retrieve, len(tensors), build)]
    assert_parity(results, info.op_infix)
    messages = " | ".join(core.message for _, core, _, _ in results)
    assert any(core.error is None for _, core, _, _ in results)
    assert "exactly one of table_id or table_name" in messages
    assert "Shape must be rank 2" in messages
    if len(tensors) > 1:
        assert "in both shapes must be equal" in messages


@pytest.mark.parametrize("info", [o for o in OPTIMIZERS if not o.core_has_table_ops],
                         ids=lambda o: o.op_infix)
def test_extra_table_ops_behave_like_core_ones(info):
    """TF has no per-table ops for this optimizer; ours must behave like TF's
    per-table ops of an optimizer with the same number of tensors."""
    n = 1 + len(info.slots)
    twin = next(o for o in OPTIMIZERS if o.core_has_table_ops and len(o.slots) + 1 == n)
    twin_tensors = ("parameters",) + twin.slots
    tensors = ("parameters",) + info.slots

    def build_twin(bare, **kwargs):
        with tf.Graph().as_default():
            named = {(twin_tensors[int(k[1:])] if k.startswith("_") else k): v
                     for k, v in kwargs.items()}
            return _try_build(bare, named, {}, "core")

    def build_extra(bare, **kwargs):
        with tf.Graph().as_default():
            named = {(tensors[int(k[1:])] if k.startswith("_") else k): v
                     for k, v in kwargs.items()}
            return _try_build(PREFIX + bare, _with_engine(bare, named), {}, "ours")

    twin_results = _table_op_cases("LoadTPUEmbedding%sParameters" % twin.op_infix,
                                   "RetrieveTPUEmbedding%sParameters" % twin.op_infix, n,
                                   build_twin)
    our_results = _table_op_cases("LoadTPUEmbedding%sParameters" % info.op_infix,
                                  "RetrieveTPUEmbedding%sParameters" % info.op_infix, n,
                                  build_extra)
    results = [(ours_key[0], core, ours, "%s %s (TF twin %s)" % (ours_key[1], ours_key[2],
                                                                twin.op_infix))
               for (_, core), (ours_key, ours) in zip(twin_results, our_results)]
    assert_parity(results, info.op_infix)
