"""Bad configure calls and ops before configure: every configuration the
engine refuses (spec §2.8 and the engine's own checks) gets the right error
type and message, installs no engine and leaves the process able to
configure a valid one; ops before configure (or after shutdown) fail with
FailedPrecondition; configuring twice keeps the first engine and its tables."""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from bad_input_common import (ARB, B, FP, IA, RECV, UNIMPL, _arbitrary, _make_ctx, _raises,
                              feature_config, table_config)
from tf_tpu_emb import ops as tte_ops

pytestmark = pytest.mark.usefixtures("lib")


# ===================================================== before configure

def test_ops_before_configure():
    eu.shutdown()
    assert not eu.is_initialized()
    config = feature_config()
    msg = "the default TPU embedding engine is not configured"
    args = [(np.zeros([0], np.int32), np.arange(B, dtype=np.int64), np.zeros([0], np.float32))] * 3
    _raises(FP, [ARB, msg], _arbitrary(args))
    _raises(FP, [RECV, msg], lambda: eu.recv(config))
    _raises(FP, ["LoadTPUEmbeddingAdagradParameters", msg],
            lambda: eu.load_table(config.table_descriptor[0], [np.zeros((10, 4))] * 2))
    _raises(FP, ["RetrieveTPUEmbeddingAdagradParameters", msg],
            lambda: eu.retrieve_table(config.table_descriptor[0]))
    _raises(FP, ["RetrieveAllTPUEmbeddingParameters", msg],
            lambda: tte_ops.retrieve_all_tpu_embedding_parameters(
                NumTables=2, config=config.SerializeToString(), num_shards=1, shard_id=0))
    _raises(FP, ["EnqueueTPUEmbeddingIntegerBatch", msg],
            lambda: tf.raw_ops.EnqueueTPUEmbeddingIntegerBatch(
                batch=[np.zeros(B, np.int32)] * 3, mode_override="unspecified"))
    assert not eu.is_initialized()
    # and after shutdown again
    with eu.engine(config):
        pass
    _raises(FP, [RECV, msg], lambda: eu.recv(config))


def test_double_configure(fctx):
    for config in (fctx.config, table_config()):
        _raises(FP, ["ConfigureTPUEmbedding", "already configured",
                     "run ShutdownTPUEmbedding before configuring it again"],
                lambda: tf.raw_ops.ConfigureTPUEmbedding(config=config.SerializeToString()))
    assert eu.is_initialized()
    fctx.assert_untouched()  # the first engine, with its tables, is still in place


# ================================================================ configure

def _no_features(c):
    del c.feature_descriptor[:]


def _set(path, value):
    def fn(c):
        obj = c
        parts = path.split(".")
        for p in parts[:-1]:
            obj = obj[int(p)] if p.isdigit() else getattr(obj, p)
        setattr(obj, parts[-1], value)
    return fn


def _chain(*fns):
    def fn(c):
        for f in fns:
            f(c)
    return fn


def _optimizer(t, field):
    def fn(c):
        getattr(c.table_descriptor[t].optimization_parameters, field).SetInParent()
    return fn


def _clear_optimizer(t):
    def fn(c):
        p = c.table_descriptor[t].optimization_parameters
        p.ClearField(p.WhichOneof("parameters"))
    return fn


def _tags(*tags):
    def fn(c):
        for t, tag in zip(range(len(c.table_descriptor)), tags):
            if tag is not None:
                c.table_descriptor[t].optimization_parameters.learning_rate.dynamic.tag = tag
    return fn


def _extra_table(name="video"):
    def fn(c):
        t = c.table_descriptor.add()
        t.CopyFrom(c.table_descriptor[0])
        t.name = name
        f = c.feature_descriptor.add()
        f.name = "extra"
        f.table_id = len(c.table_descriptor) - 1
        f.input_shape.append(B)
    return fn


def _quant(buckets, lo=-1.0, hi=1.0):
    def fn(c):
        q = c.table_descriptor[0].optimization_parameters.simulated_quantization
        q.enabled = True
        q.num_buckets = buckets
        q.clipping_limits.lower.value = lo
        q.clipping_limits.upper.value = hi
    return fn


CONFIG_CASES = {
    # spec §2.8, table mode
    "table_batch_0": (_chain(_no_features, _set("batch_size_per_tensor_core", 0),
                             _set("table_descriptor.0.num_features", 1),
                             _set("table_descriptor.1.num_features", 1)),
                      IA, ["Invalid batch_size_per_tensor_core: 0 found in the TPU embedding "
                           "configuration. Valid values are >0."]),
    "table_batch_negative": (_chain(_no_features, _set("batch_size_per_tensor_core", -4),
                                    _set("table_descriptor.0.num_features", 1),
                                    _set("table_descriptor.1.num_features", 1)),
                             IA, ["Invalid batch_size_per_tensor_core: -4"]),
    "table_num_features_0": (_chain(_no_features, _set("batch_size_per_tensor_core", 4),
                                    _set("table_descriptor.0.num_features", 1)),
                             IA, ["Invalid num_features: 0 found for table: user in the TPU "
                                  "embedding configuration. Valid values are >0."]),
    # spec §2.8, feature mode
    "feature_batch_set": (_set("batch_size_per_tensor_core", 4),
                          IA, ["The batch_size_per_tensor_core field must NOT be populated "
                               "when the feature_descriptor fields are filled in."]),
    "feature_num_features_set": (_set("table_descriptor.0.num_features", 2),
                                 IA, ["The TableDescriptor.num_features field must NOT be "
                                      "populated", "num_features is set to 2 for table video."]),
    "feature_table_id_high": (_set("feature_descriptor.1.table_id", 2),
                              IA, ["Invalid table_id: 2 found in feature_descriptor:",
                                   "friends", "all table_ids must be in the range[0, 2)"]),
    "feature_table_id_negative": (_set("feature_descriptor.0.table_id", -1),
                                  IA, ["Invalid table_id: -1 found in feature_descriptor"]),
    "feature_empty_shape": (lambda c: c.feature_descriptor[2].ClearField("input_shape"),
                            IA, ["The input_shape field cannot be empty in feature_descriptor:",
                                 "favorited"]),
    "feature_zero_dim": (lambda c: c.feature_descriptor[0].input_shape.append(0),
                         IA, ["The input_shape dimension sizes must all be >0",
                              "found dimension size set to 0"]),
    "feature_negative_dim": (lambda c: c.feature_descriptor[1].input_shape.__setitem__(0, -2),
                             IA, ["found dimension size set to -2"]),
    "unused_table": (_set("feature_descriptor.1.table_id", 0),
                     IA, ["No feature_descriptor fields found for table: user (ID: 1) in the "
                          "TPU embedding configuration."]),
    # engine checks
    "mode_unspecified": (_set("mode", eu.Config.UNSPECIFIED),
                         IA, ["TPUEmbeddingConfiguration.mode is INVALID.  Must be INFERENCE, "
                              "TRAINING, or BACKWARD_PASS_ONLY"]),
    "vocab_0": (_set("table_descriptor.0.vocabulary_size", 0),
                IA, ["table 'video' (id 0) has vocabulary_size 0; must be > 0"]),
    "vocab_negative": (_set("table_descriptor.1.vocabulary_size", -5),
                       IA, ["table 'user' (id 1) has vocabulary_size -5"]),
    "dimension_0": (_set("table_descriptor.1.dimension", 0),
                    IA, ["table 'user' (id 1) has dimension 0; must be > 0"]),
    "no_optimizer": (_clear_optimizer(1),
                     IA, ["table 'user' (id 1): No optimization algorithm specified"]),
    "mdl_adagrad_light": (_optimizer(0, "mdl_adagrad_light"),
                          UNIMPL, ["table 'video' (id 0)", "mdl_adagrad_light"]),
    "user_defined_program": (_optimizer(1, "user_defined_program"),
                             UNIMPL, ["table 'user' (id 1)", "user_defined_program"]),
    "tag_gap": (_chain(_extra_table("third"), _tags(0, None, 2)),
                IA, ["dynamic learning rate tags must be 0, 1, ..., n-1 without gaps; tag 1 is "
                     "not used"]),
    "tag_not_from_zero": (_tags(1, 1),
                          IA, ["tag 0 is not used"]),
    "tag_negative": (_tags(-1, None),
                     IA, ["table 'video' (id 0) has a negative dynamic learning rate tag -1"]),
    "duplicate_table_names": (_extra_table("video"),
                              IA, ["two tables are named 'video'"]),
    "quantization_one_bucket": (_quant(1), IA, ["table 'video' (id 0): simulated_quantization "
                                                "needs"]),
    "quantization_empty_range": (_quant(4, 1.0, 1.0), IA, ["simulated_quantization needs"]),
    "negative_tensor_cores": (_set("num_tensor_cores", -1),
                              IA, ["Invalid num_tensor_cores: -1"]),
}


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_configure_rejects(name):
    mutate, error, fragments = CONFIG_CASES[name]
    config = feature_config()
    mutate(config)
    eu.shutdown()
    _raises(error, fragments,
            lambda: tf.raw_ops.ConfigureTPUEmbedding(config=config.SerializeToString()))
    assert not eu.is_initialized(), "a failed configure must not install an engine"
    # the process can still configure a valid engine afterwards
    good = feature_config()
    with eu.engine(good):
        ctx = _make_ctx(good, 4)
        ctx.valid_step()
        ctx.check_recv()


@pytest.mark.parametrize("raw,fragment", [
    (b"\xff\xff\xff", "Malformed tpu_embedding_config."),
    (b"", "TPU embedding config is empty."),
])
def test_configure_rejects_bytes(raw, fragment):
    eu.shutdown()
    _raises(IA, [fragment], lambda: tf.raw_ops.ConfigureTPUEmbedding(config=raw))
    assert not eu.is_initialized()


def test_valid_dynamic_tags_accepted():
    config = feature_config()
    _chain(_extra_table("third"), _tags(1, 0, 1))(config)
    with eu.engine(config):
        assert eu.is_initialized()
