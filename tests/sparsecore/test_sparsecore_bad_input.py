"""Bad input to the SparseCore kernels: InvalidArgument (or TF's
FailedPrecondition) naming the op and the offending index, never a crash."""
import numpy as np
import pytest
import tensorflow as tf

import sparsecore_reference as ref
from tf_tpu_emb import ops as tte_ops

pytestmark = [pytest.mark.usefixtures("lib")]

COO = "ConvertToCooTensor"


def _raises(match, name, _functions=(), **kwargs):
    """The kernel's error: the inputs' shapes are hidden from the shape
    functions (which catch some of these at graph construction)."""
    with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError),
                       match=match):
        ref.run_op(name, _hide_shapes=True, _functions=_functions, **kwargs)


def _coo(split, values, weights, sample_count=2, combiner="sum", name=COO):
    return dict(name=name, indices_or_row_splits=np.asarray(split, np.int32),
                values=np.asarray(values, np.int32), weights=np.asarray(weights, np.float32),
                sample_count=sample_count, combiner=combiner)


@pytest.mark.parametrize("case,kwargs,match", [
    ("splits start", _coo([1, 1, 2], [4, 5], 1.0), r"ConvertToCooTensor: row_splits\[0\] = 1"),
    ("splits decrease", _coo([0, 2, 1], [4, 5], 1.0), r"row_splits\[2\] = 1 is smaller"),
    ("splits end", _coo([0, 1, 3], [4, 5], 1.0), r"row_splits\[2\] = 3 differs"),
    ("splits length", _coo([0, 2], [4, 5], 1.0), "sample_count \\+ 1 = 3"),
    ("row too big", _coo([[0, 0], [2, 0]], [4, 5], 1.0), r"indices_or_row_splits\[1, 0\] = 2"),
    ("rows unsorted", _coo([[1, 0], [0, 0]], [4, 5], 1.0), r"\[1, 0\] = 0 is smaller"),
    ("negative row", _coo([[-1, 0], [0, 0]], [4, 5], 1.0), r"\[0, 0\] = -1"),
    ("3 columns", _coo([[0, 0, 0], [1, 0, 0]], [4, 5], 1.0), "2 columns"),
    ("indices rows", _coo([[0, 0]], [4, 5], 1.0), "1 rows of indices for 2 values"),
    ("weights length", _coo([0, 1, 2], [4, 5], [1.0, 2.0, 3.0]), "one element per value"),
    ("weights rank", _coo([0, 1, 2], [4, 5], [[1.0, 2.0]]), "one element per value"),
    ("negative id", _coo([0, 1, 2], [4, -5], 1.0), r"values\[1\] = -5 is negative"),
    ("dense count", _coo(np.zeros([0], np.int32), [4, 5, 6], 1.0), "3 values for 2 samples"),
    ("values rank", _coo([0, 1, 2], [[4, 5]], 1.0), "values must be a vector"),
    ("combiner", _coo([0, 1, 2], [4, 5], 1.0, combiner="max"), "invalid combiner"),
])
def test_convert_to_coo_bad_input(case, kwargs, match):
    del case
    _raises(match, **kwargs)
    kwargs = dict(kwargs, name=tte_ops.PREFIX + COO)
    _raises(match, **kwargs)


def _list(split, values, **attrs):
    kwargs = dict(_coo(split, values, 1.0, sample_count=4,
                       name="ConvertToListOfSparseCoreCooTensors"),
                  num_sc_per_chip=2, row_offset=0, col_offset=0, col_shift=0, num_sc_shards=2,
                  stacked_table_sample_count=4)
    kwargs.update(attrs)
    return kwargs


@pytest.mark.parametrize("kwargs,match", [
    (_list([0, 1, 1, 2, 2], [1, 2], num_sc_per_chip=3), "not divisible by num_sc_per_chip 3"),
    (_list([0, 1, 1, 2, 2], [1, 2], num_sc_shards=3), "num_sc_shards 3 is not a power of two"),
    (_list([0, 1, 1, 2, 2], [1, 2**31 - 2], col_offset=5), "beyond int32"),
    (_list([0, 1, 1, 2, 3], [1, 2], ), r"row_splits\[4\] = 3 differs"),
])
def test_convert_to_list_bad_input(kwargs, match):
    _raises("ConvertToListOfSparseCoreCooTensors: .*" + match, **kwargs)


def _sort(rows, cols, gains, name="SortListOfSparseCoreCooTensors", **attrs):
    kwargs = dict(name=name, row_ids_list=[np.asarray(rows, np.int32)],
                  col_ids_list=[np.asarray(cols, np.int32)],
                  gains_list=[np.asarray(gains, np.float32)], sample_count_list=[4],
                  col_offset_list=[0], num_replica=1, table_vocab_size=8, feature_width=2,
                  num_sc_per_chip=2, table_name="t")
    if name.endswith("SortListOfSparseCoreCooTensors"):
        kwargs.update(max_ids_per_sparse_core=8, max_unique_ids_per_sparse_core=8)
    kwargs.update(attrs)
    return kwargs


@pytest.mark.parametrize("name", ["SortListOfSparseCoreCooTensors",
                                  "GetStatsFromListOfSparseCoreCooTensors"])
def test_sort_and_stats_bad_input(name):
    _raises(name + r": feature 0: row ids and col ids", **_sort([0], [1, 2], [1, 1], name=name))
    _raises(name + r": feature 0: gains and col ids", **_sort([0, 1], [1, 2], [1], name=name))
    _raises(name + r": col_ids_list\[0\]\[1\] = -2", **_sort([0, 1], [1, -2], [1, 1], name=name))
    _raises(name + r": row_ids_list\[0\]\[0\] = -1", **_sort([-1, 1], [1, 2], [1, 1], name=name))
    _raises(name + ": .*power of two", **_sort([0], [1], [1], name=name, num_sc_per_chip=3))
    _raises(name + ": the sum of sample_count_list", **_sort([0], [1], [1], name=name,
                                                           sample_count_list=[0]))


def _csr(counts, splits=0, rows=(0, 1, 2), **attrs):
    n = len(rows)
    kwargs = dict(name="ConvertToSparseCoreCsrWrappedCooTensor",
                  sorted_row_ids_list=[np.asarray(rows, np.int32)],
                  sorted_col_ids_list=[np.arange(n, dtype=np.int32)],
                  sorted_gains_list=[np.ones(n, np.float32)],
                  id_counts_list=[np.asarray(counts, np.int32)], splits=np.int64(splits),
                  sample_count_per_sc=1, num_replica=2, max_minibatches_per_sc=2,
                  max_ids_per_chip_per_sample=8, table_vocab_size=8, feature_width=2,
                  table_name="t", allow_id_dropping=False)
    kwargs.update(attrs)
    return kwargs


@pytest.mark.parametrize("kwargs,match", [
    (_csr([0, 2, 1]), r"id_counts_list\[0\]\[2\] = 1 must lie in \[2, 3\]"),
    (_csr([0, 2, 4]), r"id_counts_list\[0\]\[2\] = 4 must lie in \[2, 3\]"),
    (_csr([-1, 2, 3]), r"id_counts_list\[0\]\[0\] = -1"),
    (_csr([0, 3]), "id_counts_list\\[0\\] has 2 elements"),
    (_csr([0, 1, 3], splits=-1), r"splits\[0\] = -1 is negative"),
    (_csr([0, 1, 3], splits=1 | 2), "3 minibatches per sparse core, more than"),
    (_csr([0, 1, 3], max_ids_per_chip_per_sample=3), "not divisible by the xla_pad_size"),
    (dict(_csr([0, 1, 2], rows=(0, 1)), sorted_gains_list=[np.ones(3, np.float32)]),
     "must have the same length"),
])
def test_csr_wrapped_bad_input(kwargs, match):
    _raises("ConvertToSparseCoreCsrWrappedCooTensor: .*" + match, **kwargs)


def _csr_of(num_sc, **attrs):
    """_csr's op with `num_sc` SparseCores' (empty) lists."""
    empty = np.zeros(0, np.int32)
    kwargs = dict(_csr([0, 0, 0], rows=()), sorted_row_ids_list=[empty] * num_sc,
                  sorted_col_ids_list=[empty] * num_sc,
                  sorted_gains_list=[np.zeros(0, np.float32)] * num_sc, **attrs)
    return dict(kwargs, id_counts_list=[np.zeros(kwargs["num_replica"] * num_sc + 1, np.int32)
                                        if kwargs["num_replica"] < 8 else np.zeros(3, np.int32)]
                * num_sc)


INT32_MAX = 2**31 - 1


# Attrs whose buffer sizes overflow int64 (found by fuzz/targets/sparsecore_preprocess.cc):
# each product is refused, not wrapped around into a size that passes the int32 check (the
# second case's id counts are valid: the wrapped, negative size aborted the process).
@pytest.mark.parametrize("kwargs", [
    # max_minibatches_per_sc * num_sc_per_chip * RoundUp(num_replica * num_sc_per_chip, 8)
    # = (2^31 - 1) * 2^33 row pointers.
    _csr_of(2, num_replica=INT32_MAX, max_minibatches_per_sc=INT32_MAX),
    # max_ids_per_chip_per_sample * sample_count_per_sc * num_sc_per_chip = (2^31 - 1)^2 * 8.
    _csr_of(8, num_replica=1, max_ids_per_chip_per_sample=INT32_MAX,
            sample_count_per_sc=INT32_MAX),
])
def test_csr_wrapped_sizes_beyond_int64(kwargs):
    _raises("ConvertToSparseCoreCsrWrappedCooTensor: the buffers .* exceed int32", **kwargs)


# ------------------------------------------------------- lookup and gradients

def _lookup(rp=(2, 8, 8, 8, 8, 8, 8, 8), sid=(0, 1), tid=(0, 2), table_rows=4, name=None,
            **attrs):
    n = 8
    sid = list(sid) + [ref.PAD] * (n - len(sid))
    tid = list(tid) + [ref.PAD] * (n - len(tid))
    kwargs = dict(name=name or "XlaSparseDenseMatmulWithCsrInput",
                  row_pointers=np.asarray(rp, np.int32),
                  sorted_sample_ids=np.asarray(sid, np.int32),
                  sorted_token_ids=np.asarray(tid, np.int32), sorted_gains=np.ones(n, np.float32),
                  embedding_table=np.ones((table_rows, 2), np.float32),
                  num_minibatches_per_physical_sparse_core=np.int32(1), input_size=2,
                  quantization_config_low=0.0, quantization_config_high=0.0,
                  quantization_config_num_buckets=0, table_name="t",
                  num_sparsecores_per_device=1)
    kwargs.update(attrs)
    return kwargs


def test_lookup_runs_on_good_input():
    (act,) = ref.run_op(_hide_shapes=True, **_lookup())
    np.testing.assert_array_equal(act, np.ones((2, 2)))


@pytest.mark.parametrize("kwargs,match", [
    (_lookup(sid=(0, 2)), r"sorted_sample_ids\[1\] = 2 is outside \[0, 2\)"),
    (_lookup(tid=(0, 4)), r"sorted_token_ids\[1\] = 4 is outside \[0, 4\)"),
    (_lookup(tid=(-1, 0)), r"sorted_token_ids\[0\] = -1"),
    (_lookup(rp=(2, 1, 2, 2, 2, 2, 2, 2)), r"row_pointers\[1\] = 1 must lie in \[8, 8\]"),
    (_lookup(rp=(9, 9, 9, 9, 9, 9, 9, 9)), r"row_pointers\[0\] = 9 must lie in \[0, 8\]"),
    (_lookup(rp=(2, 3, 8, 8, 8, 8, 8, 8)), r"row_pointers\[1\] = 3 must lie in \[8, 8\]"),
    (_lookup(rp=(0, 2, 8, 8, 8, 8, 8, 8)), r"row_pointers\[1\]: segment 1 of its group holds ids"),
    (_lookup(rp=(2, 2, 2, 2)), "needs 8 row pointers"),
    (_lookup(num_minibatches_per_physical_sparse_core=np.int32(2)), "needs 16 row pointers"),
    (_lookup(num_sparsecores_per_device=-1), "must be a power of two, but got: -1"),
    (_lookup(rp=(2,) + (8,) * 15, num_sparsecores_per_device=2, table_rows=3),
     "3 rows do not split"),
    (_lookup(input_size=3, num_sparsecores_per_device=2), "input_size 3 is not divisible"),
    (_lookup(sorted_gains=np.ones(3, np.float32)), "must have the same length"),
    (_lookup(embedding_table=np.ones(4, np.float32)), "embedding_table must have rank 2"),
])
def test_lookup_bad_input(kwargs, match):
    for name in ("XlaSparseDenseMatmulWithCsrInput", tte_ops.PREFIX +
                 "XlaSparseDenseMatmulWithCsrInput"):
        _raises("XlaSparseDenseMatmulWithCsrInput: .*" + match, **dict(kwargs, name=name))


def test_lookup_unimplemented_features():
    with pytest.raises(tf.errors.UnimplementedError, match="quantization"):
        ref.run_op(**_lookup(quantization_config_num_buckets=4))
    with pytest.raises(tf.errors.UnimplementedError, match="float32"):
        ref.run_op(**_lookup(embedding_table=np.ones((4, 2), np.int32)))


def _grad(**attrs):
    kwargs = _lookup(name="XlaSparseDenseMatmulGradWithAdagradAndCsrInput")
    for k in ("input_size", "quantization_config_low", "quantization_config_high",
              "quantization_config_num_buckets"):
        kwargs.pop(k)
    kwargs.update(activation_gradients=np.ones((2, 2), np.float32),
                  learning_rate=np.float32(0.1), accumulator=np.ones((4, 2), np.float32),
                  clip_weight_min=-np.inf, clip_weight_max=np.inf)
    kwargs.update(attrs)
    return kwargs


@pytest.mark.parametrize("kwargs,match", [
    (_grad(sorted_token_ids=np.array([0, 7] + [0] * 6, np.int32)), r"sorted_token_ids\[1\] = 7"),
    (_grad(activation_gradients=np.ones((1, 2), np.float32)), r"sorted_sample_ids\[1\] = 1"),
    (_grad(activation_gradients=np.ones((2, 3), np.float32)), "have 3 columns"),
    (_grad(accumulator=np.ones((4, 3), np.float32)), "a slot variable has shape"),
    (_grad(learning_rate=np.ones(2, np.float32)), "learning_rate must be a scalar"),
    (_grad(clip_weight_min=1.0, clip_weight_max=0.0), "clip_weight_min must be smaller"),
])
def test_gradient_bad_input(kwargs, match):
    _raises("XlaSparseDenseMatmulGradWithAdagradAndCsrInput: .*" + match, **kwargs)


def test_adagrad_momentum_exponent_zero():
    kwargs = _grad(name="XlaSparseDenseMatmulGradWithAdagradMomentumAndCsrInput",
                   momenta=np.ones((4, 2), np.float32), use_nesterov=False, exponent=0.0,
                   beta1=0.9, beta2=1.0, epsilon=0.1)
    _raises("exponent must not be 0", **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(indices=np.array([0, 6], np.int32)), r"indices\[1\] = 6 is outside \[0, 6\)"),
    (dict(indices=np.array([-1, 0], np.int32)), r"indices\[0\] = -1"),
    (dict(gradient=np.ones((3, 2), np.float32)), "must be \\[2, feature_width = 2\\]"),
    (dict(feature_width=3), "feature_width = 3"),
    (dict(accumulator=np.ones((6, 3), np.float32)), "a slot variable has shape"),
    (dict(learning_rate=np.ones((1, 1), np.float32)), "learning_rate must be a scalar"),
])
def test_standalone_bad_input(kwargs, match):
    base = dict(indices=np.array([0, 1], np.int32), gradient=np.ones((2, 2), np.float32),
                learning_rate=np.float32(0.1), accumulator=np.ones((6, 2), np.float32),
                embedding_table=np.ones((6, 2), np.float32), feature_width=2)
    base.update(kwargs)
    for name in ("XlaSparseCoreAdagrad", tte_ops.PREFIX + "XlaSparseCoreAdagrad"):
        _raises("XlaSparseCoreAdagrad: .*" + match, name=name, **base)


@pytest.mark.parametrize("sizes,match", [
    ([np.int32(17)], r"unpadded_sizes\[0\] = 17 is outside \[0, 16\]"),
    ([np.int32(-1)], r"unpadded_sizes\[0\] = -1"),
    ([np.array([1, 2], np.int32)], r"unpadded_sizes\[0\] must be a scalar"),
])
def test_dynamic_shape_copy_bad_input(sizes, match):
    for name in ("TPUCopyWithDynamicShape", tte_ops.PREFIX + "TPUCopyWithDynamicShape"):
        _raises("TPUCopyWithDynamicShape: " + match, name=name,
                tensors=[np.zeros(16, np.int32)], unpadded_sizes=sizes)


def test_custom_computation_bad_input():
    from tensorflow.core.framework import attr_value_pb2

    @tf.function(autograph=False)
    def one_output(grad, w, lr):
        return (w - lr * grad,)

    @tf.function(autograph=False)
    def too_many(grad, w, lr):
        return w - lr * grad, w

    spec = tf.TensorSpec([1, 2], tf.float32)
    name = "XlaSparseDenseMatmulGradWithCsrInput"
    base = _grad(name=name)
    for k in ("learning_rate", "accumulator", "embedding_table", "clip_weight_min",
              "clip_weight_max"):
        base.pop(k)
    fn = one_output.get_concrete_function(spec, spec, spec)
    base.update(tables=[np.ones((4, 2), np.float32)], hyperparameters=[np.float32(0.1)],
                custom_computation=attr_value_pb2.NameAttrList(name=fn.name))
    (out,) = ref.run_op(_functions=[fn], _hide_shapes=True, **base)
    np.testing.assert_allclose(out[[0, 2]], 0.9)  # rows 0 and 2 (ids 0, 2), gain 1, grad 1
    _raises(name + r": tables\[1\] has shape \[3,2\]", _functions=[fn],
            **dict(base, tables=[np.ones((4, 2), np.float32), np.ones((3, 2), np.float32)]))
    _raises(name + ": a hyperparameter must be a scalar", _functions=[fn],
            **dict(base, hyperparameters=[np.ones(2, np.float32)]))
    bad = too_many.get_concrete_function(spec, spec, spec)
    _raises(name + ": custom_computation returned 2 tensors for 1 tables", _functions=[bad],
            **dict(base, custom_computation=attr_value_pb2.NameAttrList(name=bad.name)))


def _splits_op(rows, cols, gains=None, **attrs):
    n = len(cols)
    kwargs = dict(name="GetMinibatchSplitsWithPhysicalReplica", program_key=np.array(["k"]),
                  row_ids=np.asarray(rows, np.int32), col_ids=np.asarray(cols, np.int32),
                  gains=np.ones(n, np.float32) if gains is None else gains, sample_count=4,
                  num_replica=1, table_vocab_size=8, feature_width=2, num_sc_per_chip=2,
                  table_name="t", mini_batch_splits="")
    kwargs.update(attrs)
    return kwargs


@pytest.mark.parametrize("kwargs,match", [
    (_splits_op([1, 0], [1, 2]), r"row_ids\[1\] = 0 is smaller than the row before it"),
    (_splits_op([0, 4], [1, 2]), r"row_ids\[1\] = 4 is outside \[0, 4\)"),
    (_splits_op([0, 1], [1, 8]), r"col_ids\[1\] = 8 is outside \[0, 8\)"),
    (_splits_op([0, 1], [-1, 2]), r"col_ids\[0\] = -1"),
    (_splits_op([0, 1], [1, 2], gains=np.ones(3, np.float32)), "must have the same length"),
    (_splits_op([0, 1], [1, 2], sample_count=3), "sample_count 3 is not divisible"),
])
def test_minibatch_splits_bad_input(kwargs, match):
    _raises("GetMinibatchSplitsWithPhysicalReplica: .*" + match, **kwargs)


def test_minibatch_splits_id_counts_beyond_int64():
    # 64 * num_sc_per_chip * num_replica * num_sc_per_chip = 2^38 * (2^31 - 1) id counts.
    _raises("GetMinibatchSplitsWithPhysicalReplica: .* physical replicas are too many",
            **_splits_op([], [], sample_count=2**16, num_sc_per_chip=2**16, num_replica=INT32_MAX))


def _csr_op(counts, splits=0, **attrs):
    kwargs = dict(name="GetMinibatchesInCsrWithPhysicalReplica", program_key=np.array(["k"]),
                  row_ids=np.zeros(3, np.int32), col_ids=np.zeros(3, np.int32),
                  gains=np.ones(3, np.float32), splits=np.array([splits], np.int64),
                  id_counts=np.asarray(counts, np.int32), sample_count=2, num_replica=1,
                  max_minibatches_per_sc=1, max_ids_per_chip_per_sample=8, table_vocab_size=8,
                  feature_width=2, num_sc_per_chip=1, table_name="t", mini_batch_in_csr="")
    kwargs.update(attrs)
    return kwargs


GOOD_COUNTS = [0] + [3] * 64


@pytest.mark.parametrize("kwargs,match", [
    (_csr_op([0] * 64), "id_counts has 64 elements"),
    (_csr_op([0, 2, 1] + [3] * 62), r"id_counts\[2\] = 1 must lie in \[2, 3\]"),
    (_csr_op([0] + [4] * 64), r"id_counts\[1\] = 4 must lie in \[0, 3\]"),
    (_csr_op(GOOD_COUNTS, splits=1), "The number of minibatches per sparse core is 2"),
    (_csr_op(GOOD_COUNTS, splits=-3), r"splits\[0\] = -3 is negative"),
    (_csr_op(GOOD_COUNTS, max_ids_per_chip_per_sample=3), "not divisible by the xla_pad_size"),
])
def test_minibatches_in_csr_bad_input(kwargs, match):
    _raises("GetMinibatchesInCsrWithPhysicalReplica: .*" + match, **kwargs)


def test_minibatches_in_csr_sizes_beyond_int64():
    # 2 * 2^16 * RoundUp(2^16 * (2^31 - 1), 8) row pointers and 64 * 2^16 * 2^16 * (2^31 - 1)
    # id counts (our op: TF's shape function refuses these attrs at graph construction).
    _raises("GetMinibatchesInCsrWithPhysicalReplica: the buffers .* exceed int32",
            **_csr_op(GOOD_COUNTS, name=tte_ops.PREFIX + "GetMinibatchesInCsrWithPhysicalReplica",
                      sample_count=2**16, num_sc_per_chip=2**16, num_replica=INT32_MAX,
                      max_minibatches_per_sc=2))


def test_store_minibatch_statistics_bad_input():
    _raises(r"StoreMinibatchStatisticsInFdo: max_ids must be a scalar",
            name="StoreMinibatchStatisticsInFdo", program_key=np.array(["k"]),
            max_ids=np.ones(2, np.int32), max_uniques=np.int32(1), sample_count=2,
            num_replica=1, feature_width=2, num_sc_per_chip=1, table_name="t",
            mini_batch_splits="")


OPT_INFIX = ("Sgd", "Adagrad", "AdagradMomentum", "Adam", "Ftrl")


def _opt_attrs(infix, standalone):
    f = np.float32
    table = np.ones((4, 2), np.float32)
    slots = {"Sgd": {}, "Adagrad": {"accumulator": table},
             "AdagradMomentum": {"accumulator": table,
                                 ("momentum" if standalone else "momenta"): table},
             "Adam": {("momentum" if standalone else "momenta"): table, "velocity": table},
             "Ftrl": {"accumulator": table, "linear": table}}[infix]
    if standalone:
        hyper = {"Sgd": {}, "Adagrad": {},
                 "AdagradMomentum": dict(beta_1=f(0.9), epsilon=f(0.1), use_nesterov=False,
                                         beta_2=0.99, exponent=2.0),
                 "Adam": dict(beta_1=f(0.9), beta_2=f(0.99), epsilon=f(0.1),
                              use_sum_inside_sqrt=False),
                 "Ftrl": dict(beta=f(0.1), learning_rate_power=f(-0.5),
                              l2_regularization_strength=f(0.0),
                              multiply_linear_by_learning_rate=False,
                              l1_regularization_strength=0.0)}[infix]
    else:
        hyper = {"Sgd": {}, "Adagrad": {},
                 "AdagradMomentum": dict(use_nesterov=False, exponent=2.0, beta1=0.9,
                                         beta2=0.99, epsilon=0.1),
                 "Adam": dict(use_sum_inside_sqrt=False, beta1=0.9, beta2=0.99, epsilon=0.1),
                 "Ftrl": dict(multiply_linear_by_learning_rate=False, beta=0.1,
                              learning_rate_power=-0.5, l1_regularization_strength=0.0,
                              l2_regularization_strength=0.0)}[infix]
    return dict(slots, **hyper)


@pytest.mark.parametrize("infix", OPT_INFIX)
@pytest.mark.parametrize("form", ["CsrInput", "StaticBufferSize"])
def test_every_gradient_op_checks_token_ids(infix, form):
    name = "XlaSparseDenseMatmulGradWith%sAnd%s" % (infix, form)
    kwargs = _grad(name=name, sorted_token_ids=np.array([0, 4] + [0] * 6, np.int32))
    kwargs.pop("accumulator")
    kwargs.update(_opt_attrs(infix, standalone=False))
    if form == "StaticBufferSize":
        kwargs.update(max_ids_per_sparse_core=8, max_unique_ids_per_sparse_core=8)
    _raises(name + r": .*sorted_token_ids\[1\] = 4 is outside \[0, 4\)", **kwargs)
    kwargs.update(sorted_token_ids=np.array([0, 1] + [0] * 6, np.int32),
                  sorted_sample_ids=np.array([0, 2] + [0] * 6, np.int32))
    _raises(name + r": .*sorted_sample_ids\[1\] = 2 is outside \[0, 2\)", **kwargs)


@pytest.mark.parametrize("infix", OPT_INFIX)
def test_every_standalone_optimizer_checks_indices(infix):
    name = "XlaSparseCore" + infix
    kwargs = dict(indices=np.array([0, 4], np.int32), gradient=np.ones((2, 2), np.float32),
                  learning_rate=np.float32(0.1), embedding_table=np.ones((4, 2), np.float32),
                  feature_width=2, **_opt_attrs(infix, standalone=True))
    _raises(name + r": indices\[1\] = 4 is outside \[0, 4\)", name=name, **kwargs)
    kwargs.update(indices=np.array([0, 1], np.int32), gradient=np.ones((2, 3), np.float32))
    _raises(name + ": gradient .* must be", name=name, **kwargs)
