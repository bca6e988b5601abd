"""Features whose protos an older TensorFlow lacks (README "TensorFlow
versions"): FrequencyAwareAdagrad and manual SPMD partitioning need TF 2.19.

On an older TF the Python class refuses to be built, and a config serialized
by a newer TF (the feature arrives as an unknown field) is refused at
configure with Unimplemented naming the feature, the engine left
unconfigured.  On TF >= 2.19 the refusal tests are skipped and the field
numbers the C++ guard relies on are checked against TF's descriptors.
"""
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import optimization_parameters_pb2 as opt_pb2

import engine_util as eu
import tf_features
import tf_tpu_emb
from tf_tpu_emb.optimizer_specs import BY_PROTO_FIELD

pytestmark = pytest.mark.tf_version

FAA = BY_PROTO_FIELD["frequency_aware_adagrad"]
MANUAL_PARTITIONING_FIELD = 3  # SpmdSharding.use_manual_partitioning (core/config.h)

old_tf_only = pytest.mark.skipif(
    tf_features.TF_VERSION >= (2, 19),
    reason="TensorFlow %s's protos have the TF 2.19 fields" % tf.__version__)
new_tf_only = pytest.mark.skipif(
    tf_features.TF_VERSION < (2, 19),
    reason="TensorFlow %s's protos lack the TF 2.19 fields" % tf.__version__)


def _tag(number, wire_type):
    """The varint key of a field (numbers < 2048: at most two bytes)."""
    key = number << 3 | wire_type
    return bytes([key]) if key < 0x80 else bytes([key & 0x7F | 0x80, key >> 7])


def _faa_bytes():
    """OptimizationParameters{frequency_aware_adagrad{initial_accumulator_value:
    0.1}} as TF >= 2.19 serializes it (checked there by the last test)."""
    inner = _tag(6, 5) + b"\xcd\xcc\xcc\x3d"  # float32 0.1, field 6
    return _tag(FAA.proto_number, 2) + bytes([len(inner)]) + inner


def _config():
    return eu.table_mode_config([eu.TableSpec("video", 8, 2, optimizer="adagrad",
                                              num_features=1)], batch_size=2)


def _spmd_config():
    """_config() with automatic SPMD partitioning over one core per replica."""
    config = _config()
    config.spmd_sharding.enabled = True
    config.spmd_sharding.num_cores_per_replica = 1
    return config


def _configure_refused(config, match):
    eu.shutdown()
    with pytest.raises(tf.errors.UnimplementedError, match=match):
        tf.raw_ops.ConfigureTPUEmbedding(config=eu.serialize(config))
    assert not eu.is_initialized()


@old_tf_only
def test_frequency_aware_adagrad_class_is_refused():
    with pytest.raises(NotImplementedError,
                       match=r"FrequencyAwareAdagrad needs TensorFlow >= 2\.19: TensorFlow "
                             r"%s's OptimizationParameters has no field "
                             r"'frequency_aware_adagrad'" % tf.__version__.replace(".", r"\.")):
        tf_tpu_emb.FrequencyAwareAdagrad(0.1)
    assert "frequency_aware_adagrad" in tf_features.MISSING_OPTIMIZERS


@old_tf_only
@pytest.mark.usefixtures("engine_released")
def test_configure_refuses_frequency_aware_adagrad_of_a_newer_tf():
    config = _config()
    params = config.table_descriptor[0].optimization_parameters
    params.ClearField("adagrad")
    params.MergeFromString(_faa_bytes())
    assert params.WhichOneof("parameters") is None  # this TF cannot name it
    _configure_refused(
        config, r"table 'video': the FrequencyAwareAdagrad optimizer "
                r"\(OptimizationParameters\.frequency_aware_adagrad\) needs TensorFlow >= "
                r"2\.19; this build of tf_tpu_emb is for TensorFlow %d\.%d"
                % tf_features.TF_VERSION)


@old_tf_only
@pytest.mark.usefixtures("engine_released")
def test_configure_refuses_manual_partitioning_of_a_newer_tf():
    config = _spmd_config()
    config.spmd_sharding.MergeFromString(_tag(MANUAL_PARTITIONING_FIELD, 0) + b"\x01")
    _configure_refused(config, r"spmd_sharding\.use_manual_partitioning \(manual SPMD "
                               r"partitioning\) needs TensorFlow >= 2\.19")


@old_tf_only
@pytest.mark.usefixtures("engine_released")
def test_configure_accepts_the_same_config_without_the_newer_field():
    """The refusals above come from the unknown field alone."""
    with eu.engine(_spmd_config()):
        assert eu.is_initialized()


@new_tf_only
def test_guarded_field_numbers_match_tf_descriptors():
    fields = opt_pb2.OptimizationParameters.DESCRIPTOR.fields_by_name
    for info in BY_PROTO_FIELD.values():
        if info.min_tf is not None:
            assert info.proto_number == fields[info.proto_field].number, info.proto_field
            assert tf_features.TF_VERSION >= info.min_tf
    spmd = eu.Config.SpmdSharding.DESCRIPTOR.fields_by_name
    assert spmd["use_manual_partitioning"].number == MANUAL_PARTITIONING_FIELD
    p = opt_pb2.OptimizationParameters()
    p.frequency_aware_adagrad.initial_accumulator_value = 0.1
    assert p.SerializeToString() == _faa_bytes()
    s = eu.Config.SpmdSharding(use_manual_partitioning=True)
    assert s.SerializeToString() == _tag(MANUAL_PARTITIONING_FIELD, 0) + b"\x01"

