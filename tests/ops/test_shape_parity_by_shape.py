"""Shape-function parity of the config-independent ops: TPUEmbeddingActivations,
SendTPUEmbeddingGradients, EnqueueTPUEmbeddingSparseBatch and the per-table
Load/Retrieve ops (also ours that TF lacks, against TF's op of an optimizer
with as many tensors), built as TF's core op and as ours over sweeps of input
shapes and attrs and compared (shape_parity_harness.py).  The config-reading
ops are swept over generated configs in test_shape_parity_by_config.py.
"""
import pytest
import tensorflow as tf

from shape_parity_configs import CONFIGS
from shape_parity_harness import (LEARNING_RATES, PREFIX, Ph, _selector, _try_build,
                                  _with_engine, assert_parity, build_pair)
from tf_tpu_emb.optimizers import OPTIMIZERS

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


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
