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
            with pytest.raises(tf.errors.InvalidArgumentError, match="device_ordinal must be a scalar"):
                getattr(tf.raw_ops, op)(**{first: [np.zeros([0], np.int32)]},
                                        embedding_indices=[np.array([1, 2], np.int64)],
                                        aggregation_weights=[np.zeros([0], np.float32)],
                                        device_ordinal=ordinal, mode_override="unspecified",
                                        **extra)
        eu.assert_nothing_enqueued(config)
