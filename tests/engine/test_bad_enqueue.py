"""Bad input to the enqueue ops is refused with the right error type and a
message that names the op, the input / feature / table and the offending
index, and a failed enqueue leaves the engine exactly as it was: the queue
holds nothing from it (a Recv right after it finds the queue empty) and the
tables are unchanged (a valid enqueue + Recv afterwards matches the numpy
reference, and Retrieve returns what was loaded).  ArbitraryTensorBatch
(COO and row splits), the op-level attributes, Sparse/RaggedTensorBatch in
both config modes, SparseBatch and IntegerBatch."""
import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from bad_input_common import (ARB, B, COMBINERS, FEATURES, IA, TNAMES, _arbitrary,
                              _raises)
from engine_util import FeatureSpec, TableSpec

pytestmark = pytest.mark.usefixtures("lib")


# ================================================ ArbitraryTensorBatch input

def _who(i):
    name, t = FEATURES[i]
    return "%s: input %d (feature '%s', table '%s')" % (ARB, i, name, TNAMES[t])


def case_negative_id(a):
    a[1][1][2] = -1
    return [_who(1), "embedding id -1 at index 2", "[0, 16)"]


def case_id_too_large(a):
    a[0][1][0] = 10
    return [_who(0), "embedding id 10 at index 0", "[0, 10)"]


def case_sample_index_out_of_batch(a):
    a[2][0][1, 0] = B
    return [_who(2), "sample index 4 (row 1, column 0)", "outside [0, 4)"]


def case_negative_sample_index(a):
    a[0][0][0, 0] = -1
    return [_who(0), "sample index -1 (row 0, column 0)"]


def case_negative_bag_position(a):
    a[1][0][2, 1] = -1
    return [_who(1), "sample index -1 (row 2, column 1) is negative"]


def case_weights_length(a):
    n = len(a[1][1])
    a[1][2] = a[1][2][:-1]
    return [_who(1), "aggregation_weights has %d elements but embedding_indices has %d"
            % (n - 1, n)]


def case_indices_ids_length(a):
    n = len(a[2][1])
    a[2][0] = a[2][0][:-1]
    return [_who(2), "sample_indices has %d rows but there are %d embedding ids" % (n - 1, n)]


def case_wrong_column_count(a):
    a[0][0] = np.concatenate([a[0][0], a[0][0]], axis=1)
    return [_who(0), "sample_indices has 4 columns", "1 or 2 columns are expected"]


def case_rank3_indices(a):
    a[1][0] = a[1][0][:, :, None]
    return [_who(1), "must have rank 1 or 2, got rank 3"]


def case_scalar_indices(a):
    a[1][0] = np.int64(0)
    return [_who(1), "must have rank 1 or 2, got rank 0"]


def case_nan_weight(a):
    a[2][2][1] = np.nan
    return [_who(2), "aggregation weight at index 1 is not finite"]


def case_inf_weight(a):
    a[0][2][0] = np.inf
    return [_who(0), "aggregation weight at index 0 is not finite"]


def case_dense_wrong_count(a):
    a[1][0] = np.zeros([0], np.int64)
    a[1][1] = a[1][1][:3] if len(a[1][1]) != 3 else a[1][1][:2]
    a[1][2] = np.zeros([0], np.float32)
    return [_who(1), "one id per output position (4), got"]


ARBITRARY_CASES = [case_negative_id, case_id_too_large, case_sample_index_out_of_batch,
                   case_negative_sample_index, case_negative_bag_position,
                   case_weights_length, case_indices_ids_length,
                   case_wrong_column_count, case_rank3_indices, case_scalar_indices,
                   case_nan_weight, case_inf_weight, case_dense_wrong_count]


@pytest.mark.parametrize("case", ARBITRARY_CASES, ids=lambda c: c.__name__[5:])
def test_arbitrary_bad_input(fctx, case):
    args = fctx.args()
    fragments = case(args)
    _raises(IA, fragments, _arbitrary(args))
    fctx.assert_untouched()


def case_splits_decreasing(a):
    n = len(a[0][1])
    a[0][0] = np.array([0, 3, 1, 2, n], np.int64)
    return [_who(0), "row splits must be non-decreasing; split 2 is 1 after 3"]


def case_splits_bad_ends(a):
    n = len(a[1][1])
    a[1][0] = a[1][0].copy()
    a[1][0][-1] = n - 1
    return [_who(1), "row splits must start at 0 and end at the number of ids (%d)" % n]


def case_splits_bad_start(a):
    a[2][0] = a[2][0].copy()
    a[2][0][0] = 1
    return [_who(2), "must start at 0"]


def case_splits_wrong_rows(a):
    a[0][0] = np.array([0, 1, len(a[0][1])], np.int64)
    return [_who(0), "row_splits describe 2 rows but the feature has 4 output positions"]


def case_ragged_id_too_large(a):
    a[2][1][-1] = 10
    return [_who(2), "embedding id 10 at index %d" % (len(a[2][1]) - 1)]


@pytest.mark.parametrize("case", [case_splits_decreasing, case_splits_bad_ends,
                                  case_splits_bad_start, case_splits_wrong_rows,
                                  case_ragged_id_too_large], ids=lambda c: c.__name__[5:])
def test_arbitrary_bad_row_splits(fctx, case):
    args = fctx.ragged_args()
    fragments = case(args)
    _raises(IA, fragments, _arbitrary(args))
    fctx.assert_untouched()


# ============================================================ op-level args

def test_unknown_combiner(fctx):
    # checked when the kernel is constructed, before anything runs
    _raises(IA, [ARB, "Invalid combiner 'max'", '"sum", "mean", and "sqrtn"'],
            _arbitrary(fctx.args(), combiners=["sum", "max"]))
    fctx.assert_untouched()


@pytest.mark.parametrize("k", [1, 4])
def test_wrong_combiners_count(fctx, k):
    _raises(IA, [ARB, "%d combiners given; expected 0, one per input (3) or one per table (2)"
                 % k], _arbitrary(fctx.args(), combiners=["sum"] * k))
    fctx.assert_untouched()


@pytest.mark.parametrize("mode", ["training", "backward_pass_only", "", "TRAIN"])
def test_bad_mode_override(fctx, mode):
    _raises(IA, [ARB, "Unsupported value %s specified for mode_override" % mode],
            _arbitrary(fctx.args(), mode=mode))
    fctx.assert_untouched()


def test_mode_override_must_be_scalar(fctx):
    a = fctx.args()
    _raises(IA, [ARB, "mode_override must be a scalar string"],
            lambda: tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
                sample_indices_or_row_splits=[x[0] for x in a],
                embedding_indices=[x[1] for x in a], aggregation_weights=[x[2] for x in a],
                mode_override=["train", "train"], combiners=COMBINERS))
    fctx.assert_untouched()


def test_device_ordinal_out_of_range(fctx):
    _raises(IA, [ARB, "replica 1 is out of range", "1 tensor core(s)"],
            _arbitrary(fctx.args(), device_ordinal=1))
    a = fctx.args()
    _raises(IA, ["DynamicEnqueueTPUEmbeddingArbitraryTensorBatch", "replica 5 is out of range"],
            lambda: tf.raw_ops.DynamicEnqueueTPUEmbeddingArbitraryTensorBatch(
                sample_indices_or_row_splits=[x[0] for x in a],
                embedding_indices=[x[1] for x in a], aggregation_weights=[x[2] for x in a],
                mode_override="train", device_ordinal=tf.constant(5), combiners=COMBINERS))
    fctx.assert_untouched()


def test_wrong_number_of_inputs(fctx):
    _raises(IA, [ARB, "got 2 inputs but the config has 3 feature descriptors"],
            _arbitrary(fctx.args()[:2]))
    fctx.assert_untouched()


# ============================================ Sparse/RaggedTensorBatch ops

ST = "EnqueueTPUEmbeddingSparseTensorBatch"
RT = "EnqueueTPUEmbeddingRaggedTensorBatch"


def test_feature_mode_table_ids_must_match_features(fctx):
    _raises(IA, [ST, "input 1 (feature 'friends', table 'user')",
                 "table_ids[1] = 0 but the config's feature 1 looks up table 1"],
            lambda: eu.enqueue_sparse_tensor(fctx.args(), [0, 0, 0]))
    _raises(IA, [ST, "table_ids has 2 entries but there are 3 inputs"],
            lambda: eu.enqueue_sparse_tensor(fctx.args(), [0, 1]))
    _raises(IA, [RT, "table_ids[2] = 7 is not a table id in [0, 2)"],
            lambda: eu.enqueue_ragged_tensor(fctx.ragged_args(), [0, 1, 7]))
    fctx.assert_untouched()


def test_feature_mode_sparse_tensor_bad_id(fctx):
    a = fctx.args()
    a[2][1][0] = -3
    _raises(IA, [ST, "input 2 (feature 'favorited', table 'video')",
                 "embedding id -3 at index 0"],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0]))
    fctx.assert_untouched()


def _rank1(args):
    """SparseTensorBatch's documented rank-1 form: sample_indices = sp_ids.indices[:, 0]."""
    return [[a[0][:, 0].copy(), a[1], a[2]] for a in args]


def test_feature_mode_sparse_tensor_rank1_sample_out_of_range(fctx):
    """Rank-1 sample_indices name the sample of each id; B is one past the
    last sample (read as row splits before, such input was accepted)."""
    a = _rank1(fctx.args())
    a[1][0][-1] = B
    _raises(IA, [ST, "input 1 (feature 'friends', table 'user')",
                 "sample index %d at index %d is outside [0, %d)" % (B, len(a[1][0]) - 1, B)],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0]))
    a = _rank1(fctx.args())
    a[0][0][0] = -1
    _raises(IA, [ST, "input 0 (feature 'watched', table 'video')",
                 "sample index -1 at index 0 is outside [0, %d)" % B],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0]))
    fctx.assert_untouched()


def test_feature_mode_sparse_tensor_rank1_length_and_rank(fctx):
    a = _rank1(fctx.args())
    a[2][0] = a[2][0][:-1]
    _raises(IA, [ST, "input 2 (feature 'favorited', table 'video')",
                 "sample_indices has %d elements but there are %d embedding ids"
                 % (len(a[2][0]), len(a[2][1]))],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0]))
    a = fctx.args()
    a[0][0] = a[0][0].reshape(1, -1, 2)
    _raises(IA, [ST, "input 0", "sample_indices must have rank 1 or 2"],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0]))
    r = fctx.ragged_args()
    r[1][0] = np.stack([r[1][0], r[1][0]], axis=1)
    _raises(IA, [RT, "input 1 (feature 'friends', table 'user')",
                 "sample_splits must have rank 1 (row splits)"],
            lambda: eu.enqueue_ragged_tensor(r, [0, 1, 0]))
    fctx.assert_untouched()


def test_feature_mode_sparse_tensor_rank1_needs_rank1_input_shape():
    """A rank-1 index names only the sample: a feature of input_shape [B, 3]
    needs [n, 2] or [n, 3] indices."""
    config = eu.feature_mode_config([TableSpec("t", 10, 2)], [FeatureSpec("f", 0, [B, 3])])
    with eu.engine(config):
        _raises(IA, [ST, "input 0 (feature 'f', table 't')",
                     "rank-1 sample_indices (sp_ids.indices[:, 0]) give only the sample of each "
                     "id, but the feature's input_shape has rank 2; pass [n, 2] or [n, 3] "
                     "indices"],
                lambda: eu.enqueue_sparse_tensor(
                    [(np.array([0, 1], np.int32), np.array([1, 2], np.int64),
                      eu.empty(tf.float32))], [0]))
        eu.assert_nothing_enqueued(config)


def _tmode_who(op, i):
    return "%s: input %d (table '%s')" % (op, i, TNAMES[FEATURES[i][1]])


def test_table_mode_sample_row_out_of_range(tctx):
    a = tctx.args()
    a[1][0][0, 0] = B
    _raises(IA, [_tmode_who(ST, 1), "sample index 4 at index 0 is outside [0, 4)"],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0]))
    tctx.assert_untouched()


def test_table_mode_id_out_of_vocab(tctx):
    a = tctx.ragged_args()
    a[2][1][1] = 10
    _raises(IA, [_tmode_who(RT, 2), "embedding id 10 at index 1", "[0, 10)"],
            lambda: eu.enqueue_ragged_tensor(a, [0, 1, 0]))
    tctx.assert_untouched()


def test_table_mode_rows_must_fill_num_features(tctx):
    a = tctx.args()
    _raises(IA, [ST, "the inputs of table 'video' take 1 rows per sample but the table has "
                 "num_features 2"],
            lambda: eu.enqueue_sparse_tensor(a[:2], [0, 1]))
    _raises(IA, [ST, "the inputs of table 'video' take 3 rows per sample"],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0], num_features=[2, 1, 1]))
    tctx.assert_untouched()


def test_table_mode_attr_list_lengths(tctx):
    a = tctx.args()
    _raises(IA, [ST, "max_sequence_lengths and num_features must be empty or have one entry "
                 "per input (3), got 2"],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0], max_sequence_lengths=[0, 0]))
    _raises(IA, [ST, "input 1 has max_sequence_length 0 and num_features 0"],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0], num_features=[1, 0, 1]))
    tctx.assert_untouched()


def test_table_mode_ragged_bad_splits(tctx):
    a = tctx.ragged_args()
    a[0][0] = a[0][0][:-1]
    _raises(IA, [_tmode_who(RT, 0), "sample_splits must be a vector of 5 row splits, got "
                 "shape [4]"], lambda: eu.enqueue_ragged_tensor(a, [0, 1, 0]))
    a = tctx.ragged_args()
    n = len(a[1][1])
    a[1][0] = np.array([0, 2, 1, n, n], np.int64)
    _raises(IA, [_tmode_who(RT, 1), "non-decreasing; split 2 is 1 after 2"],
            lambda: eu.enqueue_ragged_tensor(a, [0, 1, 0]))
    tctx.assert_untouched()


def test_table_mode_sparse_tensor_bad_shapes(tctx):
    a = tctx.args()
    a[0][0] = a[0][0][:-1]
    _raises(IA, [_tmode_who(ST, 0), "sample_indices must be"],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0]))
    a = tctx.args()
    a[2][2] = a[2][2][:1]
    _raises(IA, [_tmode_who(ST, 2), "aggregation_weights has 1 elements"],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0]))
    a = tctx.args()
    _raises(IA, [ST, "4 combiners given"],
            lambda: eu.enqueue_sparse_tensor(a, [0, 1, 0], combiners=["sum"] * 4))
    tctx.assert_untouched()


def test_table_mode_sequence_errors():
    config = eu.table_mode_config([TableSpec("video", 10, 4, num_features=1),
                                   TableSpec("user", 16, 3, num_features=3)], B)
    with eu.engine(config):
        tables = eu.load_random_tables(config, 3)
        e = np.zeros([0], np.float32)
        plain = (np.arange(B, dtype=np.int64), np.arange(B, dtype=np.int64), e)
        seq_rank1 = (np.array([0, 1], np.int64), np.array([1, 2], np.int64), e)
        _raises(IA, [ST, "input 1 (table 'user')", "a sequence feature needs [n, 2] sample "
                     "indices (sample, position), got shape [2]"],
                lambda: eu.enqueue_sparse_tensor([plain, seq_rank1], [0, 1],
                                                 max_sequence_lengths=[0, 3]))
        seq_neg = (np.array([[0, 0], [1, -1]], np.int64), np.array([1, 2], np.int64), e)
        _raises(IA, [ST, "negative sequence position -1 at index 1"],
                lambda: eu.enqueue_sparse_tensor([plain, seq_neg], [0, 1],
                                                 max_sequence_lengths=[0, 3]))
        seq_row = (np.array([[0, 0], [B, 0]], np.int64), np.array([1, 2], np.int64), e)
        _raises(IA, [ST, "sample index 4 at index 1 is outside [0, 4)"],
                lambda: eu.enqueue_sparse_tensor([plain, seq_row], [0, 1],
                                                 max_sequence_lengths=[0, 3]))
        eu.assert_nothing_enqueued(config)
        seq_ok = (np.array([[0, 0], [1, 2], [1, 5]], np.int64), np.array([1, 2, 3], np.int64), e)
        eu.enqueue_sparse_tensor([plain, seq_ok], [0, 1], max_sequence_lengths=[0, 3])
        video, user = eu.recv(config)
    np.testing.assert_array_equal(video, tables["video"][0][:B])
    u = tables["user"][0]
    want = np.zeros((B, 3, 3), np.float32)
    want[0, 0], want[1, 2] = u[1], u[2]  # position 5 >= 3 is dropped
    np.testing.assert_array_equal(user, want.reshape(-1, 3))


# ================================================= SparseBatch, IntegerBatch

SB = "EnqueueTPUEmbeddingSparseBatch"


def _sparse_batch_args(ctx):
    """Valid SparseBatch args: table t's rows b*nf + f."""
    rows = {0: [], 1: []}
    for f, (_, t) in enumerate(FEATURES):
        rows[t].append(ctx.bags[f])
    out = []
    for t in (0, 1):
        bags = eu.interleave_bags(rows[t]) if len(rows[t]) > 1 else rows[t][0]
        sample = np.array([r for r, b in enumerate(bags) for _ in b], np.int32)
        ids = np.array([i for b in bags for i, _ in b], np.int64)
        ws = np.array([w for b in bags for _, w in b], np.float32)
        out.append([sample, ids, ws])
    return out


def _sparse_batch(args, combiners=COMBINERS):
    return lambda: tf.raw_ops.EnqueueTPUEmbeddingSparseBatch(
        sample_indices=[a[0] for a in args], embedding_indices=[a[1] for a in args],
        aggregation_weights=[a[2] for a in args], mode_override="unspecified",
        combiners=list(combiners))


def test_sparse_batch_valid_then_errors(tctx):
    _sparse_batch(_sparse_batch_args(tctx))()
    tctx.check_recv("SparseBatch")
    a = _sparse_batch_args(tctx)
    a[0][0][-1] = 2 * B
    _raises(IA, [SB, "input 0 (table 'video')", "sample index 8 at index %d is outside [0, 8)"
                 % (len(a[0][0]) - 1)], _sparse_batch(a))
    a = _sparse_batch_args(tctx)
    a[1][0] = a[1][0][1:]
    _raises(IA, [SB, "input 1 (table 'user')", "sample_indices has %d elements but there are "
                 "%d embedding ids" % (len(a[1][0]), len(a[1][1]))], _sparse_batch(a))
    a = _sparse_batch_args(tctx)
    a[1][1][0] = 16
    _raises(IA, [SB, "input 1 (table 'user')", "embedding id 16 at index 0"], _sparse_batch(a))
    _raises(IA, [SB, "3 combiners given"], _sparse_batch(_sparse_batch_args(tctx),
                                                         ["sum"] * 3))
    tctx.assert_untouched()


def test_integer_batch_errors(tctx):
    IB = "EnqueueTPUEmbeddingIntegerBatch"
    v = np.arange(2 * B, dtype=np.int32)
    u = np.arange(B, dtype=np.int32)
    _raises(IA, [IB, "input 1 (table 'user')", "expected one id per output row (4), got 3"],
            lambda: tf.raw_ops.EnqueueTPUEmbeddingIntegerBatch(batch=[v, u[:3]],
                                                               mode_override="unspecified"))
    bad = v.copy()
    bad[5] = 10
    _raises(IA, [IB, "input 0 (table 'video')", "embedding id 10 at index 5"],
            lambda: tf.raw_ops.EnqueueTPUEmbeddingIntegerBatch(batch=[bad, u],
                                                               mode_override="unspecified"))
    _raises(IA, [IB, "got 1 inputs but the config has 2 tables"],
            lambda: tf.raw_ops.EnqueueTPUEmbeddingIntegerBatch(batch=[v],
                                                               mode_override="unspecified"))
    _raises(IA, [IB, "Unsupported value infer specified for mode_override"],
            lambda: tf.raw_ops.EnqueueTPUEmbeddingIntegerBatch(batch=[v, u],
                                                               mode_override="infer"))
    _raises(IA, [IB, "replica 2 is out of range"],
            lambda: tf.raw_ops.EnqueueTPUEmbeddingIntegerBatch(
                batch=[v, u], mode_override="unspecified", device_ordinal=2))
    tctx.assert_untouched()
