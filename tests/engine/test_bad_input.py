"""Bad input is refused with the right error type and a message that names the
op, the input / feature / table and the offending index, and a failed op
leaves the engine exactly as it was: the queue holds nothing from it (a Recv
right after it finds the queue empty) and the tables are unchanged (a valid
enqueue + Recv afterwards matches the numpy reference, and Retrieve returns
what was loaded)."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
from tf_tpu_emb import ops as tte_ops

pytestmark = pytest.mark.usefixtures("lib")

IA = tf.errors.InvalidArgumentError
FP = tf.errors.FailedPreconditionError
UNIMPL = tf.errors.UnimplementedError

B = 4
ARB = "EnqueueTPUEmbeddingArbitraryTensorBatch"
FEATURES = [("watched", 0), ("friends", 1), ("favorited", 0)]
TNAMES = ["video", "user"]
VOCAB = [10, 16]
COMBINERS = ["mean", "sqrtn"]  # per table


def _tables(nf=(0, 0)):
    return [TableSpec("video", 10, 4, num_features=nf[0]),
            TableSpec("user", 16, 3, num_features=nf[1])]


def feature_config():
    return eu.feature_mode_config(_tables(), [FeatureSpec(n, t, [B]) for n, t in FEATURES])


def table_config():
    return eu.table_mode_config(_tables(nf=(2, 1)), B)


@dataclasses.dataclass
class Ctx:
    config: object
    tables: dict
    bags: list

    def args(self):
        """Fresh (mutable numpy) valid enqueue arguments, one per feature:
        COO indices [n, 2] int64, ids int64, weights float32."""
        out = []
        for b in self.bags:
            sp, spw = eu.bags_to_sparse(b)
            out.append([sp.indices.numpy().copy(), sp.values.numpy().copy(),
                        spw.values.numpy().copy()])
        return out

    def ragged_args(self):
        out = []
        for b in self.bags:
            rg, rgw = eu.bags_to_ragged(b)
            out.append([rg.row_splits.numpy().copy(), rg.values.numpy().copy(),
                        rgw.values.numpy().copy()])
        return out

    def expected(self):
        ref = [eu.reference_lookup(self.tables[TNAMES[t]][0], b, COMBINERS[t])
               for b, (_, t) in zip(self.bags, FEATURES)]
        if self.config.feature_descriptor:
            return ref
        return [eu.interleave_table_rows([ref[0], ref[2]]), ref[1]]

    def valid_step(self):
        if self.config.feature_descriptor:
            eu.enqueue_arbitrary(self.args(), combiners=COMBINERS)
        else:
            eu.enqueue_sparse_tensor(self.args(), [t for _, t in FEATURES], combiners=COMBINERS)

    def check_recv(self, what="valid step"):
        got = eu.recv(self.config)
        for o, want in enumerate(self.expected()):
            eu.assert_close(got[o], want, what="%s output %d" % (what, o))

    def assert_untouched(self):
        """Nothing was queued, tables unchanged, the engine still works."""
        eu.assert_nothing_enqueued(self.config)
        for t, desc in enumerate(self.config.table_descriptor):
            for got, want in zip(eu.retrieve_table(desc), self.tables[desc.name]):
                np.testing.assert_array_equal(got, want)
        self.valid_step()
        self.check_recv()


def _make_ctx(config, seed):
    rng = np.random.default_rng(seed)
    bags = [eu.random_bags(rng, B, VOCAB[t], weighted=True, allow_empty=False, max_len=3)
            for _, t in FEATURES]
    tables = eu.load_random_tables(config, seed)
    return Ctx(config, tables, bags)


@pytest.fixture
def fctx():
    config = feature_config()
    with eu.engine(config):
        yield _make_ctx(config, 1)


@pytest.fixture
def tctx():
    config = table_config()
    with eu.engine(config):
        yield _make_ctx(config, 2)


def _raises(error, fragments, fn):
    with pytest.raises(error) as excinfo:
        fn()
    message = str(excinfo.value)
    for f in fragments:
        assert f in message, "%r not in %r" % (f, message)
    return message


def _arbitrary(args, **kw):
    kw.setdefault("combiners", COMBINERS)
    return lambda: eu.enqueue_arbitrary(args, **kw)


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


# ====================================================================== recv

RECV = "RecvTPUEmbeddingActivations"


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
