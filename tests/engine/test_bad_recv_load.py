"""Bad Recv and Load/Retrieve calls are refused with the right error type and
a message that names the op, the table and what is wrong, and leave the
engine exactly as it was (a refused Recv does not pop the batch; tables and
queue unchanged, a valid step afterwards matches the numpy reference)."""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from bad_input_common import (B, FEATURES, FP, IA, RECV, _raises, _tables,
                              feature_config)
from engine_util import FeatureSpec
from tf_tpu_emb import ops as tte_ops

pytestmark = pytest.mark.usefixtures("lib")


# ====================================================================== recv

def test_recv_with_nothing_enqueued(fctx):
    _raises(tf.errors.DeadlineExceededError,
            [RECV, "on replica 0 waited for its batch, but nothing was enqueued for replica 0",
             "timed out after 1 s; TF_TPU_EMB_STEP_TIMEOUT_SECONDS sets the limit"],
            lambda: eu.recv(fctx.config))
    fctx.assert_untouched()


def test_recv_wrong_num_outputs_does_not_pop(fctx):
    fctx.valid_step()
    _raises(IA, [RECV, "num_outputs is 2", "the configured engine has 3"],
            lambda: eu.recv(fctx.config, num_outputs=2))
    _raises(IA, [RECV, "num_outputs is 4"], lambda: eu.recv(fctx.config, num_outputs=4))
    fctx.check_recv("after bad Recv")  # the batch is still there
    fctx.assert_untouched()


def test_recv_config_disagrees_with_engine(fctx):
    fctx.valid_step()
    other = feature_config()
    other.table_descriptor[1].dimension = 5
    _raises(IA, [RECV, "output 1 has shape [4,5] in the op's config but [4,3] in the configured "
                 "engine's config"], lambda: eu.recv(other))
    other = eu.feature_mode_config(_tables(), [FeatureSpec(n, t, [B]) for n, t in FEATURES[:2]])
    _raises(IA, [RECV, "the op's config has 2 outputs, but the configured engine has 3"],
            lambda: eu.recv(other, num_outputs=3))
    other = eu.feature_mode_config(_tables(), [FeatureSpec(n, t, [2, 2]) for n, t in FEATURES])
    _raises(IA, [RECV, "output 0 has shape [2,2,4]"], lambda: eu.recv(other))
    _raises(IA, [RECV, "Malformed tpu_embedding_config"],
            lambda: tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=3, config=b"\xff\xff\xff"))
    fctx.check_recv("after bad Recvs")
    fctx.assert_untouched()


# ============================================================ load/retrieve

LOAD = "LoadTPUEmbeddingAdagradParameters"


def test_load_wrong_shape(fctx):
    desc = fctx.config.table_descriptor[0]
    _raises(IA, [LOAD, "table 'video'", "parameters [9,4] should be [10,4] (shard 0 of 1)"],
            lambda: eu.load_table(desc, [np.ones((9, 4)), np.ones((10, 4))]))
    _raises(IA, [LOAD, "table 'video'", "accumulators [10,3] should be [10,4]"],
            lambda: eu.load_table(desc, [np.ones((10, 4)), np.ones((10, 3))]))
    _raises(IA, [LOAD, "table 'user'", "parameters [16,3] should be [5,3] (shard 1 of 3)"],
            lambda: eu.load_table(fctx.config.table_descriptor[1], [np.ones((16, 3))] * 2,
                                  num_shards=3, shard_id=1))
    fctx.assert_untouched()


def test_load_wrong_optimizer(fctx):
    _raises(FP, ["LoadTPUEmbeddingADAMParameters", "table 'video' (id 0) is configured with the "
                 "adagrad optimizer, not adam"],
            lambda: tf.raw_ops.LoadTPUEmbeddingADAMParameters(
                parameters=np.ones((10, 4), np.float32), momenta=np.ones((10, 4), np.float32),
                velocities=np.ones((10, 4), np.float32), table_id=0, num_shards=1, shard_id=0))
    _raises(FP, ["RetrieveTPUEmbeddingStochasticGradientDescentParameters", "table 'user'",
                 "not stochastic_gradient_descent"],
            lambda: tf.raw_ops.RetrieveTPUEmbeddingStochasticGradientDescentParameters(
                table_name="user", num_shards=1, shard_id=0))
    fctx.assert_untouched()


def _adagrad_load(rows=10, dim=4, **kw):
    return lambda: tf.raw_ops.LoadTPUEmbeddingAdagradParameters(
        parameters=np.ones((rows, dim), np.float32), accumulators=np.ones((rows, dim), np.float32),
        **kw)


def test_load_unknown_table(fctx):
    _raises(IA, [LOAD, "no table named 'nope' is configured"],
            _adagrad_load(table_name="nope", num_shards=1, shard_id=0))
    _raises(IA, [LOAD, "table_id 2 is out of range; 2 tables are configured"],
            _adagrad_load(table_id=2, num_shards=1, shard_id=0))
    _raises(IA, ["RetrieveTPUEmbeddingAdagradParameters", "no table named 'Video'"],
            lambda: tf.raw_ops.RetrieveTPUEmbeddingAdagradParameters(
                table_name="Video", num_shards=1, shard_id=0))
    _raises(IA, [LOAD, "exactly one of table_id or table_name must be non-default"],
            _adagrad_load(table_id=0, table_name="video", num_shards=1, shard_id=0))
    _raises(IA, [LOAD, "exactly one of table_id or table_name must be non-default"],
            _adagrad_load(num_shards=1, shard_id=0))
    fctx.assert_untouched()


def test_load_bad_shard(fctx):
    _raises(IA, [LOAD, "table 'video'", "The value of shard_id must be >= 0 and < 3. Currently "
                 "set to: 3"], _adagrad_load(rows=3, table_id=0, num_shards=3, shard_id=3))
    _raises(IA, [LOAD, "shard_id must be >= 0 and < 3. Currently set to: -1"],
            _adagrad_load(rows=3, table_id=0, num_shards=3, shard_id=-1))
    _raises(IA, [LOAD, "The number of shards for the embedding layer must be > 0. Currently set "
                 "to: 0"], _adagrad_load(table_id=0, num_shards=0, shard_id=0))
    _raises(IA, ["RetrieveTPUEmbeddingAdagradParameters", "table 'video'",
                 "All embedding shards must be non-empty, shard ID: 11 is empty, vocabulary "
                 "size: 10, number of shards: 12"],
            lambda: tf.raw_ops.RetrieveTPUEmbeddingAdagradParameters(
                table_id=0, num_shards=12, shard_id=11))
    fctx.assert_untouched()


def test_load_all_errors(fctx):
    cfg = fctx.config.SerializeToString()
    groups = [[np.ones((10, 4), np.float32), np.ones((16, 3), np.float32)] for _ in range(3)]
    groups += [[np.zeros((0, 0), np.float32)] * 2 for _ in range(5)]

    def load_all(gs, num_tables=None):
        return lambda: tte_ops.load_all_tpu_embedding_parameters(
            *[g[:num_tables] for g in gs], config=cfg, num_shards=1, shard_id=0)

    _raises(IA, ["LoadAllTPUEmbeddingParameters", "NumTables is 1 but 2 tables are configured"],
            load_all(groups, 1))
    bad = [list(g) for g in groups]
    bad[1][1] = np.ones((15, 3), np.float32)
    _raises(IA, ["LoadAllTPUEmbeddingParameters", "table 'user' (id 1): auxiliary1 has shape "
                 "[15,3] but should be [16,3] (its accumulators)"], load_all(bad))
    bad = [list(g) for g in groups]
    bad[3][0] = np.ones((10, 4), np.float32)
    _raises(IA, ["table 'video' (id 0): auxiliary3 has shape [10,4] but should be empty"],
            load_all(bad))
    _raises(IA, ["RetrieveAllTPUEmbeddingParameters", "NumTables is 3"],
            lambda: tte_ops.retrieve_all_tpu_embedding_parameters(
                NumTables=3, config=cfg, num_shards=1, shard_id=0))
    fctx.assert_untouched()
