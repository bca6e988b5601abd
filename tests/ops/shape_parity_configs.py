"""The configs of the shape-parity tests (test_shape_parity_by_config.py): a
deterministic generator of several hundred ``TPUEmbeddingConfiguration`` byte
strings -- valid and invalid, table mode and feature-descriptor mode, every
optimizer (but user_defined_program) with every gradient-accumulation status,
zero/negative/unknown sizes, hand-made wire encodings and malformed bytes --
and the configs with a feature_descriptor table_id outside [0, num_tables).

Not generated (intentional differences, see test_shape_parity_by_config.py):
(a) out-of-range table_ids, except in OOB_CONFIGS; (b) table mode with
num_features * batch_size_per_tensor_core overflowing int32;
(c) user_defined_program.
"""
import collections
import random

from tensorflow.core.framework import tensor_shape_pb2
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as opt_pb2
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as config_pb2

from tf_tpu_emb.optimizers import OPTIMIZERS, tf_has_optimizer


Config = config_pb2.TPUEmbeddingConfiguration
GA = opt_pb2.GradientAccumulationStatus
GA_STATUSES = (GA.UNSPECIFIED, GA.ENABLED, GA.DISABLED)
MODES = (Config.UNSPECIFIED, Config.INFERENCE, Config.TRAINING, Config.BACKWARD_PASS_ONLY)
# No user_defined_program (c); only the optimizers this TF's protos can express
# (FrequencyAwareAdagrad from TF 2.19, tests/common/tf_features.py).
OPT_FIELDS = tuple(o.proto_field for o in OPTIMIZERS if tf_has_optimizer(o))
SPMD_FIELDS = Config.SpmdSharding.DESCRIPTOR.fields_by_name


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
