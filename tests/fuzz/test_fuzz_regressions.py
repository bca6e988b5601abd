"""Regression tests for defects the fuzz suite found outside the configure /
limits / shutdown classes (each with the case that found it)."""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec

pytestmark = pytest.mark.usefixtures("lib")


@pytest.mark.parametrize("ordinal", [np.zeros([2, 2], np.int32), np.zeros([0], np.int32),
                                     np.zeros([1, 1, 2], np.int32)])
def test_dynamic_enqueue_device_ordinal_must_be_a_scalar(ordinal):
    # make fuzz, family enqueue, seed 1, case 66: a [2, 2] device_ordinal was
    # accepted (its first element used as the replica).
    config = eu.feature_mode_config([TableSpec("t0", 8, 2)], [FeatureSpec("f0", 0, [2])])
    with eu.engine(config):
        for op, first in (("DynamicEnqueueTPUEmbeddingArbitraryTensorBatch",
                           "sample_indices_or_row_splits"),
                          ("DynamicEnqueueTPUEmbeddingRaggedTensorBatch", "sample_splits")):
            extra = {"table_ids": [0]} if "Ragged" in op else {}
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="device_ordinal must be a scalar"):
                getattr(tf.raw_ops, op)(**{first: [np.zeros([0], np.int32)]},
                                        embedding_indices=[np.array([1, 2], np.int64)],
                                        aggregation_weights=[np.zeros([0], np.float32)],
                                        device_ordinal=ordinal, mode_override="unspecified",
                                        **extra)
        eu.assert_nothing_enqueued(config)


def test_recv_config_agrees_on_output_shapes_not_table_ids():
    # make fuzz, family recv_send, seed 36, case 6887 (an oracle defect, the
    # kernel was right): a Recv whose config names other tables but gives the
    # same output shapes (TF's op uses its config for shapes alone) returns
    # the engine's activations; one whose shapes differ fails and loses no
    # batch.
    engine_config = eu.table_mode_config([TableSpec("t0", 26, 1, num_features=1),
                                          TableSpec("t1", 9, 1, num_features=2)], 1)
    other = eu.feature_mode_config([TableSpec("u0", 12, 1)],
                                   [FeatureSpec("f0", 0, [1]), FeatureSpec("f1", 0, [2])])
    wider = eu.feature_mode_config([TableSpec("u0", 12, 2)],
                                   [FeatureSpec("f0", 0, [1]), FeatureSpec("f1", 0, [2])])
    assert eu.output_shapes(other) == eu.output_shapes(engine_config)
    with eu.engine(engine_config):
        tables = eu.load_random_tables(engine_config, seed=6887)
        splits = np.zeros([0], np.int32)
        eu.enqueue_arbitrary([(splits, np.array([11], np.int32), np.zeros([0], np.float32)),
                              (splits, np.array([2, 5], np.int32), np.zeros([0], np.float32))],
                             combiners=["sum", "sum"], mode="inference")
        with pytest.raises(tf.errors.InvalidArgumentError, match="output 0 has shape"):
            eu.recv(wider)
        got = eu.recv(other)
        np.testing.assert_array_equal(got[0], tables["t0"][0][[11]])
        np.testing.assert_array_equal(got[1], tables["t1"][0][[2, 5]])
        eu.assert_nothing_enqueued(engine_config)
