"""The SparseCore preprocessing kernels (kernels/sparsecore/coo_kernels.cc,
kernels/sparsecore/csr_kernels.cc)
against numpy models of docs/sparsecore_semantics.md §1-§4 (sparsecore_reference.py),
under our name and TF's, and their bad-input errors."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels as tf_kernels

import engine_util
import sparsecore_reference as ref
from tf_tpu_emb import ops as tte_ops

pytestmark = [pytest.mark.usefixtures("lib")]

PREFIX = tte_ops.PREFIX
BOTH = pytest.mark.parametrize("prefix", ["", PREFIX], ids=["core", "ours"])
PREPROCESS = ("ConvertToCooTensor", "ConvertToListOfSparseCoreCooTensors",
              "TPUCopyWithDynamicShape", "TPUAnnotateTensorsWithDynamicShape",
              "GetMinibatchSplitsWithPhysicalReplica", "GetMinibatchesInCsrWithPhysicalReplica",
              "StoreMinibatchStatisticsInFdo",
              "SortListOfSparseCoreCooTensors", "GetStatsFromListOfSparseCoreCooTensors",
              "ConvertToSparseCoreCsrWrappedCooTensor", "GlobalIterId")


@pytest.mark.parametrize("bare", PREPROCESS)
def test_kernels_registered_under_both_names(bare):
    assert bare in tte_ops.SPARSECORE_KERNEL_OP_NAMES
    for name in (bare, PREFIX + bare):
        kernels = tf_kernels.get_registered_kernels_for_op(name).kernel
        assert [k.device_type for k in kernels] == ["CPU"], name


def _feature(rng, form, sample_count, vocab, max_len=4, dup=True):
    """A random feature batch: (indices_or_row_splits, values, per-token rows)."""
    if form == "dense":
        ids = rng.integers(0, vocab, sample_count)
        return np.zeros([0], np.int32), ids.astype(np.int32)
    lens = rng.integers(0, max_len + 1, sample_count)
    ids = rng.integers(0, vocab, int(lens.sum()))
    if dup and len(ids) > 1:  # adjacent repeats inside a sample exercise the dedup
        ids[1::3] = ids[0:len(ids) - 1:3][:len(ids[1::3])]
    splits = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    if form == "ragged":
        return splits, ids.astype(np.int32)
    rows = np.repeat(np.arange(sample_count), lens)
    cols = np.concatenate([np.arange(n) for n in lens]) if len(lens) else np.zeros(0)
    return np.stack([rows, cols], 1).astype(np.int32).reshape(-1, 2), ids.astype(np.int32)


@BOTH
@pytest.mark.parametrize("form", ["dense", "sparse", "ragged"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("scalar_weight", [False, True])
def test_convert_to_coo(prefix, form, combiner, scalar_weight):
    seed = engine_util.stable_seed(form, combiner, scalar_weight)
    rng = np.random.default_rng(seed)
    sample_count = 8
    split, ids = _feature(rng, form, sample_count, vocab=5)
    weights = (np.float32(0.75) if scalar_weight
               else rng.uniform(0.1, 2.0, len(ids)).astype(np.float32))
    rows, cols, gains = ref.run_op(prefix + "ConvertToCooTensor", indices_or_row_splits=split,
                                   values=ids, weights=weights, sample_count=sample_count,
                                   combiner=combiner)
    want = ref.coo(ref.token_rows(form, split, len(ids)), ids, weights, sample_count, combiner)
    np.testing.assert_array_equal(rows, want[0], err_msg="seed %d" % seed)
    np.testing.assert_array_equal(cols, want[1], err_msg="seed %d" % seed)
    np.testing.assert_array_equal(gains, want[2],  # bit-exact: the same float32 operations
                                  err_msg="seed %d" % seed)


def test_coo_dedup_is_adjacent_only():
    rows, cols, gains = ref.run_op("ConvertToCooTensor", indices_or_row_splits=[0, 4],
                                   values=[3, 3, 5, 3], weights=[1.0, 2.0, 4.0, 8.0],
                                   sample_count=1, combiner="mean")
    np.testing.assert_array_equal(rows, [0, 0, 0])
    np.testing.assert_array_equal(cols, [3, 5, 3])
    np.testing.assert_allclose(gains, np.array([3, 4, 8]) / 15.0, rtol=1e-7)


@BOTH
@pytest.mark.parametrize("combiner", ["sum", "sqrtn"])
@pytest.mark.parametrize("num_sc,shards,shift", [(1, 1, 0), (2, 4, 1), (4, 8, 3)])
def test_convert_to_list_of_sparse_core_coo(prefix, combiner, num_sc, shards, shift):
    rng = np.random.default_rng(num_sc * 10 + shards + shift)
    sample_count, row_offset, col_offset, stacked = 8, 16, 100, 32
    split, ids = _feature(rng, "ragged", sample_count, vocab=40)
    weights = rng.uniform(0.1, 2.0, len(ids)).astype(np.float32)
    out = ref.run_op(prefix + "ConvertToListOfSparseCoreCooTensors", indices_or_row_splits=split,
                     values=ids, weights=weights, sample_count=sample_count,
                     num_sc_per_chip=num_sc, row_offset=row_offset, col_offset=col_offset,
                     col_shift=shift, num_sc_shards=shards, stacked_table_sample_count=stacked,
                     combiner=combiner)
    rows, cols, gains = ref.coo(ref.token_rows("ragged", split, len(ids)), ids, weights,
                                sample_count, combiner)
    want = ref.coo_list(rows, cols, gains, sample_count, num_sc, row_offset, col_offset, shift,
                        shards, stacked)
    for k in range(num_sc):
        np.testing.assert_array_equal(out[k], want[k][0])
        np.testing.assert_array_equal(out[num_sc + k], want[k][1])
        np.testing.assert_array_equal(out[2 * num_sc + k], want[k][2])


@pytest.mark.parametrize("form", ["dense", "sparse", "ragged"])
def test_large_batches_convert_in_parts_on_the_threads(form):
    """Batches of 16k+ tokens: the conversion runs in parts on the intra-op
    threads (kernels/sparsecore/coo_kernels.cc); the result is one pass's."""
    rng = np.random.default_rng(engine_util.stable_seed("large", form))
    sample_count, num_sc = 8192, 4
    split, ids = _feature(rng, form, sample_count, vocab=3000, max_len=5)
    weights = rng.uniform(0.1, 2.0, len(ids)).astype(np.float32)
    want = ref.coo(ref.token_rows(form, split, len(ids)), ids, weights, sample_count, "mean")
    got = ref.run_op("ConvertToCooTensor", indices_or_row_splits=split, values=ids,
                     weights=weights, sample_count=sample_count, combiner="mean")
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    out = ref.run_op("ConvertToListOfSparseCoreCooTensors", indices_or_row_splits=split,
                     values=ids, weights=weights, sample_count=sample_count,
                     num_sc_per_chip=num_sc, row_offset=0, col_offset=7, col_shift=1,
                     num_sc_shards=8, stacked_table_sample_count=sample_count, combiner="mean")
    lists = ref.coo_list(*want, sample_count, num_sc, 0, 7, 1, 8, sample_count)
    for k in range(num_sc):
        for j in range(3):
            np.testing.assert_array_equal(out[j * num_sc + k], lists[k][j])


def _sc_features(rng, n, batch, vocab):
    feats = []
    for _ in range(n):
        m = int(rng.integers(0, 12))
        rows = np.sort(rng.integers(0, batch, m)).astype(np.int32)
        cols = rng.integers(0, vocab, m).astype(np.int32)
        cols[1::2] = cols[0:m - 1:2][:len(cols[1::2])]  # repeats (row may differ)
        feats.append((rows, cols, rng.uniform(0.1, 1.0, m).astype(np.float32)))
    return feats


@BOTH
@pytest.mark.parametrize("num_replica,num_sc", [(1, 1), (1, 4), (2, 2)])
def test_sort_and_stats(prefix, num_replica, num_sc):
    rng = np.random.default_rng(num_replica * 7 + num_sc)
    col_offsets, sample_counts = [64, 0, 64], [4, 4, 4]
    feats = _sc_features(rng, 3, batch=12, vocab=64)
    p = num_replica * num_sc
    common = dict(row_ids_list=[f[0] for f in feats], col_ids_list=[f[1] for f in feats],
                  gains_list=[f[2] for f in feats], sample_count_list=sample_counts,
                  col_offset_list=col_offsets, num_replica=num_replica, table_vocab_size=128,
                  feature_width=4, num_sc_per_chip=num_sc, table_name="t")
    kept, counts, uniques = ref.sort_list(feats, col_offsets, p)
    max_ids, max_uniques = ref.run_op(prefix + "GetStatsFromListOfSparseCoreCooTensors",
                                      **common)
    assert (max_ids, max_uniques) == (counts.max(), uniques.max())
    out = ref.run_op(prefix + "SortListOfSparseCoreCooTensors", max_ids_per_sparse_core=64,
                     max_unique_ids_per_sparse_core=64, **common)
    want = ref.sorted_outputs(kept, p, sum(sample_counts))
    for got, exp in zip(out, want):
        np.testing.assert_array_equal(got, exp)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max ids per sparse core"):
        ref.run_op(prefix + "SortListOfSparseCoreCooTensors",
                   max_ids_per_sparse_core=max(1, int(counts.max()) - 1),
                   max_unique_ids_per_sparse_core=64, **common)


@pytest.mark.parametrize("vocab", [1 << 12, 1 << 20, 1 << 30])
def test_sort_of_wide_cols_and_many_tokens(vocab):
    """Thousands of tokens, two groups (sorted on the threads), cols of 12,
    20 and 30 bits: one, two and three radix passes, 32- and 64-bit keys
    (sc_kernels::SortAndMerge)."""
    rng = np.random.default_rng(vocab % 1000003)
    num_replica, num_sc, batch = 2, 4, 4096
    feats = []
    for _ in range(3):
        m = 3000
        rows = np.sort(rng.integers(0, batch, m)).astype(np.int32)
        cols = rng.integers(0, vocab, m).astype(np.int32)
        cols[1::3] = cols[0:m - 1:3][:len(cols[1::3])]
        cols[2::5] = cols[0]  # a hot col
        feats.append((rows, cols, rng.uniform(0.1, 1.0, m).astype(np.float32)))
    col_offsets, p = [0, 64, 0], num_replica * num_sc
    kept, counts, uniques = ref.sort_list(feats, col_offsets, p)
    out = ref.run_op("SortListOfSparseCoreCooTensors", row_ids_list=[f[0] for f in feats],
                     col_ids_list=[f[1] for f in feats], gains_list=[f[2] for f in feats],
                     sample_count_list=[batch // 3] * 3, col_offset_list=col_offsets,
                     num_replica=num_replica, table_vocab_size=vocab, feature_width=4,
                     num_sc_per_chip=num_sc, max_ids_per_sparse_core=9000,
                     max_unique_ids_per_sparse_core=9000, table_name="t")
    for got, exp in zip(out, ref.sorted_outputs(kept, p, (batch // 3) * 3)):
        np.testing.assert_array_equal(got, exp)


def _csr_inputs(rng, num_sc, p, minibatching, ids_per_sc=11):
    per_sc = []
    for _ in range(num_sc):
        n = int(rng.integers(0, ids_per_sc + 1))
        rows = rng.integers(0, 8, n).astype(np.int32)
        cols = rng.integers(0, 50, n).astype(np.int32)
        gains = rng.uniform(0.1, 1.0, n).astype(np.float32)
        size = p * 64 + 1 if minibatching else p + 1
        cuts = np.sort(rng.integers(0, n + 1, size - 2))
        counts = np.concatenate([[0], cuts, [n]]).astype(np.int32)
        per_sc.append((rows, cols, gains, counts))
    return per_sc


@BOTH
@pytest.mark.parametrize("num_replica,num_sc,minibatching,splits", [
    (1, 2, False, 0), (1, 4, True, 0), (2, 2, True, 1 | 2 | 8), (1, 1, True, 5)])
def test_csr_wrapped_coo(prefix, num_replica, num_sc, minibatching, splits):
    rng = np.random.default_rng(num_sc * 100 + splits)
    p = num_replica * num_sc
    per_sc = _csr_inputs(rng, num_sc, p, minibatching)
    out = ref.run_op(
        prefix + "ConvertToSparseCoreCsrWrappedCooTensor",
        sorted_row_ids_list=[s[0] for s in per_sc], sorted_col_ids_list=[s[1] for s in per_sc],
        sorted_gains_list=[s[2] for s in per_sc], id_counts_list=[s[3] for s in per_sc],
        splits=np.int64(splits), sample_count_per_sc=8, num_replica=num_replica,
        max_minibatches_per_sc=4, max_ids_per_chip_per_sample=16, table_vocab_size=50,
        feature_width=4, table_name="t", allow_id_dropping=False)
    want = ref.csr_wrapped(per_sc, splits, p, 4, 16 * 8 * num_sc, False)
    assert len(out) == len(want) == 7
    for i, (got, exp) in enumerate(zip(out, want)):
        np.testing.assert_array_equal(got, exp, err_msg="output %d" % i)


def test_csr_wrapped_id_dropping():
    rng = np.random.default_rng(3)
    per_sc = _csr_inputs(rng, 2, 2, False, ids_per_sc=30)
    per_sc[0] = per_sc[0][:3] + (np.array([0, 20, 30], np.int32),)  # 30 ids, max_ids 16
    per_sc[0] = (rng.integers(0, 8, 30).astype(np.int32), rng.integers(0, 50, 30).astype(np.int32),
                 rng.uniform(size=30).astype(np.float32), per_sc[0][3])
    kwargs = dict(
        sorted_row_ids_list=[s[0] for s in per_sc], sorted_col_ids_list=[s[1] for s in per_sc],
        sorted_gains_list=[s[2] for s in per_sc], id_counts_list=[s[3] for s in per_sc],
        splits=np.int64(0), sample_count_per_sc=1, num_replica=1, max_minibatches_per_sc=1,
        max_ids_per_chip_per_sample=8, table_vocab_size=50, feature_width=4,
        table_name="t")
    with pytest.raises(tf.errors.InvalidArgumentError, match="allow_id_dropping"):
        ref.run_op("ConvertToSparseCoreCsrWrappedCooTensor", allow_id_dropping=False, **kwargs)
    out = ref.run_op("ConvertToSparseCoreCsrWrappedCooTensor", allow_id_dropping=True, **kwargs)
    want = ref.csr_wrapped(per_sc, 0, 2, 1, 16, True)
    for got, exp in zip(out, want):
        np.testing.assert_array_equal(got, exp)


def test_global_iter_id():
    assert ref.run_op("GlobalIterId")[0] == 0
    assert ref.run_op(PREFIX + "GlobalIterId")[0] == 0

    @tf.function(autograph=False)
    def loop():
        def body(i, acc):
            return i + 1, acc.write(i, tf.raw_ops.GlobalIterId())
        _, acc = tf.while_loop(lambda i, a: i < 3, body,
                               [0, tf.TensorArray(tf.int64, size=3)])
        return acc.stack()

    np.testing.assert_array_equal(loop().numpy(), [0, 1, 2])


@BOTH
def test_dynamic_shape_copies_are_identities_on_cpu(prefix):
    rp = np.arange(16, dtype=np.int32)
    gains = np.linspace(0, 1, 8).astype(np.float32)
    out = ref.run_op(prefix + "TPUCopyWithDynamicShape", tensors=[rp, gains],
                     unpadded_sizes=[np.int32(5), np.int32(3)])
    np.testing.assert_array_equal(out[0], rp)
    np.testing.assert_array_equal(out[1], gains)
    out = ref.run_op(prefix + "TPUAnnotateTensorsWithDynamicShape", tensors=[rp, gains])
    np.testing.assert_array_equal(out[0], rp)
    np.testing.assert_array_equal(out[1], gains)


def _chip_coo(rng, sample_count, vocab, n=40):
    rows = np.sort(rng.integers(0, sample_count, n)).astype(np.int32)
    cols = rng.integers(0, vocab, n).astype(np.int32)
    cols[1::4] = cols[0:n - 1:4][:len(cols[1::4])]  # repeats: dedup within a sample
    return rows, cols, rng.uniform(0.1, 1.0, n).astype(np.float32)


@BOTH
@pytest.mark.parametrize("num_replica,num_sc,vocab,n", [(1, 1, 64, 40), (1, 4, 200, 40),
                                                        (2, 2, 1000, 40), (2, 4, 1 << 24, 2000)])
def test_minibatch_splits_and_csr(prefix, num_replica, num_sc, vocab, n):
    rng = np.random.default_rng(vocab + num_sc)
    sample_count = 8
    rows, cols, gains = _chip_coo(rng, sample_count, vocab, n)
    p = num_replica * num_sc
    common = dict(program_key=np.array(["k"]), sample_count=sample_count,
                  num_replica=num_replica, table_vocab_size=vocab, feature_width=4,
                  num_sc_per_chip=num_sc, table_name="t")
    out = ref.run_op(prefix + "GetMinibatchSplitsWithPhysicalReplica", row_ids=rows,
                     col_ids=cols, gains=gains, mini_batch_splits="", **common)
    want = ref.minibatch_splits(rows, cols, gains, sample_count, num_sc, p, vocab)
    assert len(out) == 7
    for i, (got, exp) in enumerate(zip(out, want)):
        np.testing.assert_array_equal(got, exp, err_msg="output %d" % i)
    srows, scols, sgains, _, id_counts, _, _ = out
    per_sample = 32 if n <= 40 else 512  # room for every id and the padding
    for splits in (0, 1 | 4):  # the CPU's splits, and a caller's (3 minibatches)
        csr = ref.run_op(prefix + "GetMinibatchesInCsrWithPhysicalReplica", row_ids=srows,
                         col_ids=scols, gains=sgains, splits=np.array([splits], np.int64),
                         id_counts=id_counts, max_minibatches_per_sc=4,
                         max_ids_per_chip_per_sample=per_sample, mini_batch_in_csr="",
                         **common)
        per_sc = [(srows, scols, sgains, id_counts[s * p * 64:(s + 1) * p * 64 + 1])
                  for s in range(num_sc)]
        exp = ref.csr_wrapped(per_sc, splits, p, 4, per_sample * sample_count, False)
        for i, (got, e) in enumerate(zip(csr, exp)):
            np.testing.assert_array_equal(got, e, err_msg="splits %d output %d" % (splits, i))
    assert ref.run_op(prefix + "StoreMinibatchStatisticsInFdo", program_key=np.array(["k"]),
                      max_ids=out[5], max_uniques=out[6], sample_count=sample_count,
                      num_replica=num_replica, feature_width=4, num_sc_per_chip=num_sc,
                      table_name="t", mini_batch_splits="") == []
