"""The SparseCore lookup, gradient+optimizer and standalone optimizer kernels
(kernels/sparsecore/matmul_kernels.cc) against numpy models of
docs/sparsecore_semantics.md §5-§7 (sparsecore_reference.py), under our name
and TF's; the whole CPU pipeline (COO -> sort -> CSR -> lookup / gradient)
against a plain embedding bag; bad input."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels as tf_kernels

import sparsecore_reference as ref
from tf_tpu_emb import ops as tte_ops

pytestmark = [pytest.mark.usefixtures("lib")]

PREFIX = tte_ops.PREFIX
BOTH = pytest.mark.parametrize("prefix", ["", PREFIX], ids=["core", "ours"])
OPTS = {"sgd": ("Sgd", 0), "adagrad": ("Adagrad", 1), "adagrad_momentum": ("AdagradMomentum", 2),
        "adam": ("Adam", 2), "ftrl": ("Ftrl", 2)}
HYPER = {"adagrad_momentum": dict(use_nesterov=True, exponent=3.0, beta1=0.9, beta2=0.99,
                                  epsilon=1e-3),
         "adam": dict(use_sum_inside_sqrt=False, beta1=0.9, beta2=0.999, epsilon=1e-3),
         "ftrl": dict(multiply_linear_by_learning_rate=True, beta=0.5,
                      learning_rate_power=-0.5, l1=0.01, l2=0.02)}
MATMUL = ["XlaSparseDenseMatmulWithCsrInput", "XlaSparseDenseMatmulWithStaticBufferSize"] + [
    "XlaSparseDenseMatmulGradWith%sAnd%s" % (o, f) for o, _ in OPTS.values()
    for f in ("CsrInput", "StaticBufferSize")] + ["XlaSparseCore%s" % o for o, _ in OPTS.values()]


@pytest.mark.parametrize("bare", MATMUL)
def test_kernels_registered_under_both_names(bare):
    assert bare in tte_ops.SPARSECORE_KERNEL_OP_NAMES
    for name in (bare, PREFIX + bare):
        assert [k.device_type for k in
                tf_kernels.get_registered_kernels_for_op(name).kernel] == ["CPU"], name


def _random_csr(rng, num_sc, m, batch, shard_rows, max_minibatches=2, per_segment=4):
    groups = [[[(int(rng.integers(0, batch)), int(rng.integers(0, shard_rows)),
                 np.float32(rng.uniform(0.2, 1.5)))
                for _ in range(int(rng.integers(0, per_segment + 1)))]
               for _ in range(num_sc)] for _ in range(num_sc * m)]
    buffers = ref.pack_csr(groups, num_sc, m, max_minibatches, buffer_len=512)
    return buffers


LOOKUP_ATTRS = dict(quantization_config_low=0.0, quantization_config_high=0.0,
                    quantization_config_num_buckets=0, table_name="t")


@BOTH
@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("num_sc,m", [(1, 1), (2, 2), (4, 1)])
def test_csr_lookup(prefix, static, num_sc, m):
    rng = np.random.default_rng(num_sc * 10 + m + static)
    batch, shard_rows, width = 3, 5, 4
    rp, sid, tid, gn = _random_csr(rng, num_sc, m, batch, shard_rows)
    table = rng.normal(size=(num_sc * shard_rows, width)).astype(np.float32)
    extra = dict(max_ids_per_sparse_core=64, max_unique_ids_per_sparse_core=64) if static else {}
    name = "XlaSparseDenseMatmulWith" + ("StaticBufferSize" if static else "CsrInput")
    (act,) = ref.run_op(prefix + name, row_pointers=rp, sorted_sample_ids=sid,
                        sorted_token_ids=tid, sorted_gains=gn, embedding_table=table,
                        num_minibatches_per_physical_sparse_core=np.int32(m),
                        input_size=batch * num_sc, num_sparsecores_per_device=num_sc,
                        **LOOKUP_ATTRS, **extra)
    ids = ref.csr_ids(rp, sid, tid, gn, num_sc, m, shard_rows, batch)
    # float32 in buffer order; the kernel may fuse each multiply-add (its
    # AVX2/AVX-512 clones), the reference does not: a rounding apart.
    np.testing.assert_allclose(act, ref.csr_lookup(ids, table, batch * num_sc), rtol=1e-6,
                               atol=1e-6)


def _slots(rng, opt, shape):
    n = OPTS[opt][1]
    if opt == "adam":
        return [rng.normal(size=shape).astype(np.float32) * 0.1,
                rng.uniform(0.01, 0.5, shape).astype(np.float32)]
    if opt == "ftrl":
        return [rng.uniform(0.1, 1.0, shape).astype(np.float32),
                rng.normal(size=shape).astype(np.float32) * 0.1]
    return [rng.uniform(0.1, 1.0, shape).astype(np.float32) for _ in range(n)]


def _grad_attrs(opt):
    h = dict(HYPER.get(opt, {}))
    if opt == "ftrl":
        h["l1_regularization_strength"] = h.pop("l1")
        h["l2_regularization_strength"] = h.pop("l2")
    return h


SLOT_NAMES = {"sgd": [], "adagrad": ["accumulator"], "adagrad_momentum": ["accumulator", "momenta"],
              "adam": ["momenta", "velocity"], "ftrl": ["accumulator", "linear"]}


@BOTH
@pytest.mark.parametrize("opt", list(OPTS))
@pytest.mark.parametrize("static", [False, True])
def test_csr_gradient_and_optimizer(prefix, opt, static):
    rng = np.random.default_rng(len(opt) * 3 + static)
    num_sc, m, batch, shard_rows, width = 2, 2, 3, 4, 3
    rp, sid, tid, gn = _random_csr(rng, num_sc, m, batch, shard_rows, per_segment=5)
    table = rng.normal(size=(num_sc * shard_rows, width)).astype(np.float32)
    slots = _slots(rng, opt, table.shape)
    act_grads = rng.normal(size=(num_sc * batch, width)).astype(np.float32)
    lr, clip = 0.1, (-0.6, 0.7)
    infix = OPTS[opt][0]
    name = "XlaSparseDenseMatmulGradWith%sAnd%s" % (infix, "StaticBufferSize" if static else
                                                     "CsrInput")
    extra = dict(max_ids_per_sparse_core=64, max_unique_ids_per_sparse_core=64) if static else {}
    out = ref.run_op(prefix + name, row_pointers=rp, sorted_sample_ids=sid, sorted_token_ids=tid,
                     sorted_gains=gn, activation_gradients=act_grads,
                     learning_rate=np.float32(lr), embedding_table=table,
                     **dict(zip(SLOT_NAMES[opt], slots)),
                     num_minibatches_per_physical_sparse_core=np.int32(m),
                     clip_weight_min=clip[0], clip_weight_max=clip[1], table_name="t",
                     num_sparsecores_per_device=num_sc, **_grad_attrs(opt), **extra)
    ids = ref.csr_ids(rp, sid, tid, gn, num_sc, m, shard_rows, batch)
    want_w, want_s = table.copy(), [s.copy() for s in slots]
    for row, g in ref.csr_row_grads(ids, act_grads, len(table)).items():
        w, s = ref.sc_update(opt, table[row], [x[row] for x in slots], g, lr, HYPER.get(opt))
        want_w[row] = np.clip(w, *clip)
        for k, v in enumerate(s):
            want_s[k][row] = v
    assert len(out) == 1 + len(slots)
    np.testing.assert_allclose(out[0], want_w, rtol=2e-6, atol=1e-6)
    for got, want in zip(out[1:], want_s):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    untouched = sorted(set(range(len(table))) - {r for _, r, _ in ids})
    np.testing.assert_array_equal(out[0][untouched], table[untouched])  # lazy


def _standalone_inputs(opt, table, slots, indices, grads, lr):
    h = HYPER.get(opt, {})
    f = np.float32
    common = dict(indices=indices, gradient=grads, learning_rate=f(lr), embedding_table=table,
                  feature_width=table.shape[1])
    if opt == "sgd":
        return common
    if opt == "adagrad":
        return dict(common, accumulator=slots[0])
    if opt == "adagrad_momentum":
        return dict(common, accumulator=slots[0], momentum=slots[1], beta_1=f(h["beta1"]),
                    epsilon=f(h["epsilon"]), use_nesterov=h["use_nesterov"], beta_2=h["beta2"],
                    exponent=h["exponent"])
    if opt == "adam":
        return dict(common, momentum=slots[0], velocity=slots[1], beta_1=f(h["beta1"]),
                    beta_2=f(h["beta2"]), epsilon=f(h["epsilon"]),
                    use_sum_inside_sqrt=h["use_sum_inside_sqrt"])
    return dict(common, accumulator=slots[0], linear=slots[1], beta=f(h["beta"]),
                learning_rate_power=f(h["learning_rate_power"]),
                l2_regularization_strength=f(h["l2"]),
                multiply_linear_by_learning_rate=h["multiply_linear_by_learning_rate"],
                l1_regularization_strength=h["l1"])


@BOTH
@pytest.mark.parametrize("opt", list(OPTS))
def test_standalone_optimizer(prefix, opt):
    rng = np.random.default_rng(len(opt))
    table = rng.normal(size=(6, 3)).astype(np.float32)
    slots = _slots(rng, opt, table.shape)
    indices = np.array([4, 1, 4, 0], np.int32)  # row 4 twice: updated twice, in order
    grads = rng.normal(size=(4, 3)).astype(np.float32)
    out = ref.run_op(prefix + "XlaSparseCore" + OPTS[opt][0],
                     **_standalone_inputs(opt, table, slots, indices, grads, 0.05))
    want_w, want_s = table.copy(), [s.copy() for s in slots]
    for i, row in enumerate(indices):
        w, s = ref.sc_update(opt, want_w[row], [x[row] for x in want_s], grads[i], 0.05,
                             HYPER.get(opt))
        want_w[row] = w
        for k, v in enumerate(s):
            want_s[k][row] = v
    if opt == "adam":  # outputs: table, velocity, momentum
        want_s = want_s[::-1]
    np.testing.assert_allclose(out[0], want_w, rtol=2e-6, atol=1e-6)
    for got, want in zip(out[1:], want_s):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


# ------------------------------------------------------- the whole CPU pipeline

def _pipeline_csr(prefix, split, ids, weights, sample_count, num_sc, combiner):
    per_sc = sample_count // num_sc
    lists = ref.run_op(prefix + "ConvertToListOfSparseCoreCooTensors",
                       indices_or_row_splits=split, values=ids, weights=weights,
                       sample_count=sample_count, num_sc_per_chip=num_sc, row_offset=0,
                       col_offset=0, col_shift=0, num_sc_shards=num_sc,
                       stacked_table_sample_count=sample_count, combiner=combiner)
    sorted_ = []
    for k in range(num_sc):
        sorted_.append(ref.run_op(
            prefix + "SortListOfSparseCoreCooTensors", row_ids_list=[lists[k]],
            col_ids_list=[lists[num_sc + k]], gains_list=[lists[2 * num_sc + k]],
            sample_count_list=[per_sc], col_offset_list=[0], num_replica=1,
            table_vocab_size=64, feature_width=2, num_sc_per_chip=num_sc,
            max_ids_per_sparse_core=1024, max_unique_ids_per_sparse_core=1024, table_name="t"))
    return ref.run_op(
        prefix + "ConvertToSparseCoreCsrWrappedCooTensor",
        sorted_row_ids_list=[s[0] for s in sorted_], sorted_col_ids_list=[s[1] for s in sorted_],
        sorted_gains_list=[s[2] for s in sorted_], id_counts_list=[s[3] for s in sorted_],
        splits=np.int64(0), sample_count_per_sc=per_sc, num_replica=1, max_minibatches_per_sc=1,
        max_ids_per_chip_per_sample=32, table_vocab_size=64, feature_width=2, table_name="t",
        allow_id_dropping=False)


@BOTH
@pytest.mark.parametrize("num_sc", [1, 2, 4])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_pipeline_is_an_embedding_bag(prefix, num_sc, combiner):
    rng = np.random.default_rng(num_sc + len(combiner))
    sample_count, vocab, width = 8, 16, 3
    lens = rng.integers(0, 4, sample_count)
    ids = rng.integers(0, vocab, int(lens.sum())).astype(np.int32)
    split = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    weights = rng.uniform(0.2, 2.0, len(ids)).astype(np.float32)
    rp, sid, tid, gn, _, _, m = _pipeline_csr(prefix, split, ids, weights, sample_count, num_sc,
                                              combiner)
    table = rng.normal(size=(vocab, width)).astype(np.float32)
    (act,) = ref.run_op(prefix + "XlaSparseDenseMatmulWithCsrInput", row_pointers=rp,
                        sorted_sample_ids=sid, sorted_token_ids=tid, sorted_gains=gn,
                        embedding_table=ref.sc_layout(table, num_sc),
                        num_minibatches_per_physical_sparse_core=m, input_size=sample_count,
                        num_sparsecores_per_device=num_sc, **LOOKUP_ATTRS)
    # The plain embedding bag on the logical table.
    want = np.zeros((sample_count, width))
    for s in range(sample_count):
        w = weights[split[s]:split[s + 1]].astype(np.float64)
        rows = table[ids[split[s]:split[s + 1]]].astype(np.float64)
        scale = {"sum": 1.0, "mean": 1 / w.sum() if w.sum() else 0,
                 "sqrtn": 1 / np.sqrt((w * w).sum()) if len(w) else 0}[combiner]
        want[s] = (w[:, None] * rows).sum(0) * scale
    np.testing.assert_allclose(act, want, rtol=1e-5, atol=1e-6)

    # The gradient with SGD: each row moves by -lr * sum of its gains' activation gradients.
    act_grads = rng.normal(size=(sample_count, width)).astype(np.float32)
    (updated,) = ref.run_op(prefix + "XlaSparseDenseMatmulGradWithSgdAndCsrInput",
                            row_pointers=rp, sorted_sample_ids=sid, sorted_token_ids=tid,
                            sorted_gains=gn, activation_gradients=act_grads,
                            learning_rate=np.float32(0.5),
                            embedding_table=ref.sc_layout(table, num_sc),
                            num_minibatches_per_physical_sparse_core=m, table_name="t",
                            clip_weight_min=-np.inf, clip_weight_max=np.inf,
                            num_sparsecores_per_device=num_sc)
    grad = np.zeros((vocab, width))
    for s in range(sample_count):
        w = weights[split[s]:split[s + 1]].astype(np.float64)
        scale = {"sum": 1.0, "mean": 1 / w.sum() if w.sum() else 0,
                 "sqrtn": 1 / np.sqrt((w * w).sum()) if len(w) else 0}[combiner]
        for i in range(split[s], split[s + 1]):
            grad[ids[i]] += weights[i] * scale * act_grads[s]
    np.testing.assert_allclose(ref.from_sc_layout(updated, num_sc), table - 0.5 * grad,
                               rtol=1e-5, atol=1e-6)


@BOTH
def test_csr_gradient_with_custom_computation(prefix):
    """XlaSparseDenseMatmulGradWithCsrInput: the user's per-row optimizer
    (here TF's documented Adagrad example, a vector slot beside it) is called
    on each touched row: gradient, table rows, hyper-parameters as [1, width]."""
    from tensorflow.core.framework import attr_value_pb2

    rng = np.random.default_rng(11)
    num_sc, m, batch, shard_rows, width = 2, 1, 3, 4, 3
    rp, sid, tid, gn = _random_csr(rng, num_sc, m, batch, shard_rows, per_segment=5)
    table = rng.normal(size=(num_sc * shard_rows, width)).astype(np.float32)
    acc = rng.uniform(0.1, 1.0, table.shape).astype(np.float32)
    count = np.zeros(len(table), np.float32)  # a [rows] slot: touches per row
    act_grads = rng.normal(size=(num_sc * batch, width)).astype(np.float32)

    @tf.function(autograph=False)
    def adagrad(grad, w, a, n, lr, bonus):
        new_a = a + grad * grad
        return w - lr * grad / tf.sqrt(new_a), new_a, n + bonus[:, 0]

    spec = tf.TensorSpec([1, width], tf.float32)
    fn = adagrad.get_concrete_function(spec, spec, spec, tf.TensorSpec([1], tf.float32), spec,
                                       spec)
    out = ref.run_op(prefix + "XlaSparseDenseMatmulGradWithCsrInput", _functions=[fn],
                     row_pointers=rp, sorted_sample_ids=sid, sorted_token_ids=tid,
                     sorted_gains=gn, activation_gradients=act_grads,
                     tables=[table, acc, count],
                     hyperparameters=[np.float32(0.1), np.float32(1.0)],
                     num_minibatches_per_physical_sparse_core=np.int32(m),
                     custom_computation=attr_value_pb2.NameAttrList(name=fn.name),
                     table_name="t", num_sparsecores_per_device=num_sc)
    ids = ref.csr_ids(rp, sid, tid, gn, num_sc, m, shard_rows, batch)
    want_w, want_a, want_n = table.copy(), acc.copy(), count.copy()
    for row, g in ref.csr_row_grads(ids, act_grads, len(table)).items():
        want_w[row], (want_a[row],) = ref.sc_update("adagrad", table[row], [acc[row]], g, 0.1, None)
        want_n[row] += 1
    np.testing.assert_allclose(out[0], want_w, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(out[1], want_a, rtol=2e-6, atol=1e-6)
    np.testing.assert_array_equal(out[2], want_n)


@BOTH
@pytest.mark.parametrize("num_sc", [1, 4])
def test_minibatching_pipeline_is_an_embedding_bag(prefix, num_sc):
    """ConvertToCooTensor -> GetMinibatchSplits -> GetMinibatchesInCsr -> lookup,
    the path of TPUEmbeddingV2's minibatching, against a plain embedding bag."""
    rng = np.random.default_rng(40 + num_sc)
    sample_count, vocab, width = 8, 24, 2
    lens = rng.integers(0, 5, sample_count)
    ids = rng.integers(0, vocab, int(lens.sum())).astype(np.int32)
    split = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    rows, cols, gains = ref.run_op(prefix + "ConvertToCooTensor", indices_or_row_splits=split,
                                   values=ids, weights=np.float32(1.0),
                                   sample_count=sample_count, combiner="mean")
    common = dict(program_key=np.array([""]), sample_count=sample_count, num_replica=1,
                  table_vocab_size=vocab, feature_width=width, num_sc_per_chip=num_sc,
                  table_name="t")
    srows, scols, sgains, splits, id_counts, _, _ = ref.run_op(
        prefix + "GetMinibatchSplitsWithPhysicalReplica", row_ids=rows, col_ids=cols,
        gains=gains, mini_batch_splits="", **common)
    rp, sid, tid, gn, _, _, m = ref.run_op(
        prefix + "GetMinibatchesInCsrWithPhysicalReplica", row_ids=srows, col_ids=scols,
        gains=sgains, splits=np.reshape(splits, [1]), id_counts=id_counts,
        max_minibatches_per_sc=2, max_ids_per_chip_per_sample=16, mini_batch_in_csr="",
        **common)
    table = rng.normal(size=(vocab, width)).astype(np.float32)
    (act,) = ref.run_op(prefix + "XlaSparseDenseMatmulWithCsrInput", row_pointers=rp,
                        sorted_sample_ids=sid, sorted_token_ids=tid, sorted_gains=gn,
                        embedding_table=ref.sc_layout(table, num_sc),
                        num_minibatches_per_physical_sparse_core=m, input_size=sample_count,
                        num_sparsecores_per_device=num_sc, **LOOKUP_ATTRS)
    want = np.stack([table[ids[split[s]:split[s + 1]]].mean(0) if lens[s] else np.zeros(width)
                     for s in range(sample_count)])
    np.testing.assert_allclose(act, want, rtol=1e-5, atol=1e-6)
