"""The custom-combiner kernels (kernels/sparsecore/custom_combiner_kernels.cc)
and the COO lookup (kernels/sparsecore/coo_matmul_kernel.cc) against numpy
models of docs/sparsecore_semantics.md §5 and §8 (sparsecore_reference.py),
under our name and TF's.  The combiner is a weighted sum with learned
position weights; its VJPs are the user's functions (written with a
GradientTape), the expected gradients numpy's own, and one test checks the
kernels' table and weight gradients against finite differences of the
forward kernel."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

import sparsecore_reference as ref
from tf_tpu_emb import ops as tte_ops

pytestmark = [pytest.mark.usefixtures("lib")]

PREFIX = tte_ops.PREFIX
BOTH = pytest.mark.parametrize("prefix", ["", PREFIX], ids=["core", "ours"])
BASE = "XlaSparseDenseMatmulCustomCombinerOnTc"
NUM_SC, BATCH, SHARD_ROWS, V, W = 2, 3, 4, 3, 4
SIZE = NUM_SC * BATCH
HYPER = {"adagrad_momentum": dict(use_nesterov=True, exponent=3.0, beta1=0.9, beta2=0.99,
                                  epsilon=1e-3),
         "adam": dict(use_sum_inside_sqrt=False, beta1=0.9, beta2=0.999, epsilon=1e-3),
         "ftrl": dict(multiply_linear_by_learning_rate=True, beta=0.5,
                      learning_rate_power=-0.5, l1=0.01, l2=0.02)}
OPTS = {"sgd": ("Sgd", []), "adagrad": ("Adagrad", ["accumulator"]),
        "adagrad_momentum": ("AdagradMomentum", ["accumulator", "momenta"]),
        "adam": ("Adam", ["momenta", "velocity"]), "ftrl": ("Ftrl", ["accumulator", "linear"])}


# ------------------------------------------------ the user's functions

def _weighted_sum(valencies, vectors, weights):
    mask = tf.cast(tf.range(V)[None, :] < valencies[:, None], tf.float32)
    return tf.einsum("bv,v,bvw->bw", mask, weights, vectors)


def _functions(combiner=_weighted_sum, num_weights=V):
    val = tf.TensorSpec([SIZE], tf.int32)
    vec = tf.TensorSpec([SIZE, V, W], tf.float32)
    wts = [tf.TensorSpec([num_weights], tf.float32)] if num_weights else []
    act = tf.TensorSpec([SIZE, W], tf.float32)

    def vjp(wrt):
        def f(valencies, vectors, *rest):
            weights, grads = (rest[0], rest[1]) if num_weights else (tf.ones([V]), rest[0])
            with tf.GradientTape() as tape:
                tape.watch([vectors, weights])
                y = combiner(valencies, vectors, weights)
            return tape.gradient(y, vectors if wrt == "vectors" else weights,
                                 output_gradients=grads)
        return tf.function(f, autograph=False).get_concrete_function(val, vec, *wts, act)

    comb = tf.function(
        (lambda v, x, w: combiner(v, x, w)) if num_weights else
        (lambda v, x: combiner(v, x, tf.ones([V]))), autograph=False)
    return comb.get_concrete_function(val, vec, *wts), vjp("vectors"), vjp("weights")


def _attr(fn):
    return attr_value_pb2.NameAttrList(name=fn.name)


# ------------------------------------------------ numpy models (§8)

def _np_combine(val, vec, w):
    mask = (np.arange(V)[None, :] < val[:, None]).astype(np.float32)
    return np.einsum("bv,v,bvw->bw", mask, w, vec)


def _np_vjps(val, vec, w, dact):
    mask = (np.arange(V)[None, :] < val[:, None]).astype(np.float32)
    d_vec = mask[:, :, None] * w[None, :, None] * dact[:, None, :]
    d_w = np.einsum("bv,bvw,bw->v", mask, vec, dact)
    return d_vec, d_w


def _row_grads(ids, d_vec):
    out = {}
    for a, p, r, g in ids:
        out[r] = out.get(r, np.zeros(W, np.float32)) + g * d_vec[a, p]
    return out


def _random_groups(rng, full=False):
    """Per sample SparseCore, per shard, (sample, token, pos, gain): each
    sample gets 0..V ids at positions 0..valency-1 in shuffled order."""
    groups = [[[] for _ in range(NUM_SC)] for _ in range(NUM_SC)]
    for k in range(NUM_SC):
        for s in range(BATCH):
            n = V if full else int(rng.integers(0, V + 1))
            for p in rng.permutation(n):
                row = int(rng.integers(0, NUM_SC * SHARD_ROWS))
                groups[k][row // SHARD_ROWS].append(
                    (s, row % SHARD_ROWS, int(p), float(np.float32(rng.uniform(0.5, 1.5)))))
    return groups


def _buffers(groups):
    rp, sid, tid, pid, gn = ref.pack_pos_csr(groups, NUM_SC, buffer_len=128)
    return dict(row_pointers=rp, sorted_sample_ids=sid, sorted_token_ids=tid,
                sorted_pos_ids=pid, sorted_gains=gn)


def _lookup(prefix, bufs, table, weights, fns, num_weights=V, **kw):
    comb = fns[0]
    return ref.run_op(prefix + BASE + "WithCsrInput", _functions=[comb], **bufs,
                      embedding_table=table, weights=weights, input_size=SIZE, max_valency=V,
                      num_weights=num_weights, combiner_computation=_attr(comb),
                      quantization_config_low=0.0, quantization_config_high=0.0,
                      quantization_config_num_buckets=0, table_name="t",
                      num_sparsecores_per_device=NUM_SC, **kw)


def _grad(prefix, opt, bufs, fns, val, vec, weights, dact, table, slots, lr=0.1, lrw=0.05,
          clip=(-np.inf, np.inf), num_weights=V, **kw):
    infix, names = OPTS[opt]
    h = dict(HYPER.get(opt, {}))
    if opt == "ftrl":
        h["l1_regularization_strength"] = h.pop("l1")
        h["l2_regularization_strength"] = h.pop("l2")
    args = dict(bufs, weights=weights, preserved_valencies=val, preserved_vectors=vec,
                preserved_weights=weights, activation_gradients=dact,
                learning_rate=np.float32(lr), combiner_weights_learning_rate=np.float32(lrw),
                embedding_table=table, max_valency=V, num_weights=num_weights,
                combiner_table_vjp_computation=_attr(fns[1]),
                combiner_weights_vjp_computation=_attr(fns[2]), table_name="t",
                clip_weight_min=clip[0], clip_weight_max=clip[1],
                num_sparsecores_per_device=NUM_SC, **dict(zip(names, slots)), **h)
    args.update(kw)
    return ref.run_op(prefix + BASE + "GradWith%sAndCsrInput" % infix, _functions=fns[1:],
                      **args)


def _setup(seed, full=False):
    rng = np.random.default_rng(seed)
    groups = _random_groups(rng, full)
    table = rng.normal(size=(NUM_SC * SHARD_ROWS, W)).astype(np.float32)
    weights = rng.uniform(0.5, 2.0, V).astype(np.float32)
    dact = rng.normal(size=(SIZE, W)).astype(np.float32)
    return rng, groups, table, weights, dact


# ------------------------------------------------ tests

@BOTH
def test_lookup_is_the_users_combiner_over_preserved_vectors(prefix):
    _, groups, table, weights, _ = _setup(1)
    act, val, vec = _lookup(prefix, _buffers(groups), table, weights, _functions())
    want_val, want_vec, _ = ref.preserved(groups, NUM_SC, BATCH, SHARD_ROWS, table, V)
    np.testing.assert_array_equal(val, want_val)
    np.testing.assert_array_equal(vec, want_vec)
    np.testing.assert_allclose(act, _np_combine(want_val, want_vec, weights), rtol=1e-6,
                               atol=1e-6)
    assert want_val.max() > 0  # the data has ids


@BOTH
def test_lookup_without_weights_gets_two_arguments(prefix):
    """num_weights = 0: the combiner has no weights argument (TF's CustomCombiner)."""
    _, groups, table, _, _ = _setup(2)
    fns = _functions(num_weights=0)
    act, val, vec = _lookup(prefix, _buffers(groups), table, np.zeros([0], np.float32), fns,
                            num_weights=0)
    want_val, want_vec, _ = ref.preserved(groups, NUM_SC, BATCH, SHARD_ROWS, table, V)
    np.testing.assert_allclose(act, _np_combine(want_val, want_vec, np.ones(V, np.float32)),
                               rtol=1e-6, atol=1e-6)


@BOTH
@pytest.mark.parametrize("opt", list(OPTS))
def test_gradient_and_optimizer(prefix, opt):
    rng, groups, table, weights, dact = _setup(10 + len(opt))
    fns = _functions()
    bufs = _buffers(groups)
    val, vec, ids = ref.preserved(groups, NUM_SC, BATCH, SHARD_ROWS, table, V)
    slots = [rng.uniform(0.1, 1.0, table.shape).astype(np.float32) for _ in OPTS[opt][1]]
    clip = (-0.8, 0.9)
    out = _grad(prefix, opt, bufs, fns, val, vec, weights, dact, table, slots, clip=clip)
    d_vec, d_w = _np_vjps(val, vec, weights, dact)
    want_w, want_s = table.copy(), [s.copy() for s in slots]
    for row, g in _row_grads(ids, d_vec).items():
        w, s = ref.sc_update(opt, table[row], [x[row] for x in slots], g, 0.1, HYPER.get(opt))
        want_w[row] = np.clip(w, *clip)
        for k, v in enumerate(s):
            want_s[k][row] = v
    assert len(out) == 2 + len(slots)
    np.testing.assert_allclose(out[0], want_w, rtol=2e-5, atol=2e-6)
    for got, want in zip(out[1:-1], want_s):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(out[-1], weights - np.float32(0.05) * d_w, rtol=1e-5, atol=1e-6)
    untouched = sorted(set(range(len(table))) - {r for _, _, r, _ in ids})
    np.testing.assert_array_equal(out[0][untouched], table[untouched])


@BOTH
def test_gradients_match_finite_differences_of_the_lookup(prefix):
    """SGD with lr 1: table - updated is dL/dtable and weights - updated_weights
    is dL/dweights for L = sum(dact * lookup(table, weights)); both against
    central differences of the forward kernel (L is linear in each: exact
    up to float32 rounding)."""
    _, groups, table, weights, dact = _setup(3, full=True)
    fns = _functions()
    bufs = _buffers(groups)
    _, val, vec = _lookup(prefix, bufs, table, weights, fns)
    upd_t, upd_w = _grad(prefix, "sgd", bufs, fns, val, vec, weights, dact, table, [], lr=1.0,
                         lrw=1.0)

    def loss(t, w):
        return float(np.sum(dact.astype(np.float64) * _lookup(prefix, bufs, t, w, fns)[0]))

    _, _, ids = ref.preserved(groups, NUM_SC, BATCH, SHARD_ROWS, table, V)
    touched = sorted({r for _, _, r, _ in ids})
    assert len(touched) >= 4
    eps = np.float32(0.25)
    for r, d in zip(touched[:4], [1, 0, 3, 2]):
        plus, minus = table.copy(), table.copy()
        plus[r, d] += eps
        minus[r, d] -= eps
        fd = (loss(plus, weights) - loss(minus, weights)) / (2 * eps)
        assert abs((table - upd_t)[r, d] - fd) < 1e-4 * max(1, abs(fd)), (r, d)
    for k in range(V):
        plus, minus = weights.copy(), weights.copy()
        plus[k] += eps
        minus[k] -= eps
        fd = (loss(table, plus) - loss(table, minus)) / (2 * eps)
        assert abs((weights - upd_w)[k] - fd) < 1e-4 * max(1, abs(fd)), k


@BOTH
def test_gradient_with_custom_optimizer(prefix):
    rng, groups, table, weights, dact = _setup(21)
    fns = _functions()
    val, vec, ids = ref.preserved(groups, NUM_SC, BATCH, SHARD_ROWS, table, V)
    acc = rng.uniform(0.1, 1.0, table.shape).astype(np.float32)
    count = np.zeros(len(table), np.float32)

    @tf.function(autograph=False)
    def adagrad(grad, w, a, n, lr, bonus):
        new_a = a + grad * grad
        return w - lr * grad / tf.sqrt(new_a), new_a, n + bonus[:, 0]

    spec = tf.TensorSpec([1, W], tf.float32)
    opt_fn = adagrad.get_concrete_function(spec, spec, spec, tf.TensorSpec([1], tf.float32),
                                           spec, spec)
    out = ref.run_op(prefix + BASE + "GradWithCsrInput", _functions=[fns[1], fns[2], opt_fn],
                     **_buffers(groups), weights=weights, preserved_valencies=val,
                     preserved_vectors=vec, preserved_weights=weights,
                     activation_gradients=dact, tables=[table, acc, count],
                     hyperparameters=[np.float32(0.1), np.float32(1.0)],
                     combiner_weights_learning_rate=np.float32(0.05), max_valency=V,
                     num_weights=V, combiner_table_vjp_computation=_attr(fns[1]),
                     combiner_weights_vjp_computation=_attr(fns[2]),
                     optimizer_custom_computation=_attr(opt_fn), table_name="t",
                     num_sparsecores_per_device=NUM_SC)
    d_vec, d_w = _np_vjps(val, vec, weights, dact)
    want_w, want_a, want_n = table.copy(), acc.copy(), count.copy()
    for row, g in _row_grads(ids, d_vec).items():
        want_w[row], (want_a[row],) = ref.sc_update("adagrad", table[row], [acc[row]], g, 0.1,
                                                    None)
        want_n[row] += 1
    np.testing.assert_allclose(out[0], want_w, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(out[1], want_a, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(out[2], want_n)
    np.testing.assert_allclose(out[3], weights - np.float32(0.05) * d_w, rtol=1e-5, atol=1e-6)


# ------------------------------------------------ XlaSparseDenseMatmul (COO)

def _coo(prefix, rows, cols, vals, table, input_size, max_ids=64, max_uniques=64, offsets=0):
    return ref.run_op(prefix + "XlaSparseDenseMatmul", row_ids=rows, col_ids=cols,
                      values=vals, offsets=np.uint32(offsets), embedding_table=table,
                      max_ids_per_partition=max_ids, max_unique_ids_per_partition=max_uniques,
                      input_size=input_size)


@BOTH
def test_coo_lookup_and_its_csr_form(prefix):
    rng = np.random.default_rng(5)
    n, input_size, rows_, width = 13, 5, 7, 3
    rows = np.sort(rng.integers(0, input_size, n)).astype(np.int32)
    cols = rng.integers(0, rows_, n).astype(np.uint32)
    rows[1], cols[1] = rows[0], cols[0]  # a duplicate (row, col): merged
    vals = rng.uniform(0.5, 1.5, n).astype(np.float32)
    table = rng.normal(size=(rows_, width)).astype(np.float32)
    act, rp, emb, sid, gn = _coo(prefix, rows, cols, vals, table, input_size)
    want = np.zeros((input_size, width), np.float64)
    for r, c, v in zip(rows, cols, vals):
        want[r] += v * table[c].astype(np.float64)
    np.testing.assert_allclose(act, want, rtol=1e-5, atol=1e-6)
    # §2's sort and merge (model) in §3's one-group layout.
    kept = []
    for i in sorted(range(n), key=lambda i: (int(cols[i]), i)):
        if kept and kept[-1][0] == rows[i] and kept[-1][1] == cols[i]:
            kept[-1][2] += vals[i]
        else:
            kept.append([rows[i], int(cols[i]), np.float32(vals[i])])
    k, padded = len(kept), -(-len(kept) // 8) * 8
    assert k < n
    np.testing.assert_array_equal(rp, [k] + [padded] * 7)
    np.testing.assert_array_equal(emb, [e[1] for e in kept] + [ref.PAD] * (padded - k))
    np.testing.assert_array_equal(sid, [e[0] for e in kept] + [ref.PAD] * (padded - k))
    np.testing.assert_allclose(gn[:k], [e[2] for e in kept], rtol=1e-6)
    # The CSR form is what the CSR lookup reads (one sparse core, one minibatch).
    (again,) = ref.run_op(prefix + "XlaSparseDenseMatmulWithCsrInput", row_pointers=rp,
                          sorted_sample_ids=sid, sorted_token_ids=emb, sorted_gains=gn,
                          embedding_table=table,
                          num_minibatches_per_physical_sparse_core=np.int32(1),
                          input_size=input_size, num_sparsecores_per_device=1,
                          quantization_config_low=0.0, quantization_config_high=0.0,
                          quantization_config_num_buckets=0, table_name="t")
    np.testing.assert_allclose(again, act, rtol=1e-6, atol=1e-6)


# ------------------------------------------------ bad input

def _raises(match, name, _functions=(), error=tf.errors.InvalidArgumentError, **kwargs):
    """The kernel's error (the inputs' shapes hidden from the shape function)."""
    with pytest.raises(error, match=match):
        ref.run_op(name, _hide_shapes=True, _functions=_functions, **kwargs)


def _fn(body, *specs):
    return tf.function(body, autograph=False).get_concrete_function(*specs)


VAL = tf.TensorSpec([SIZE], tf.int32)
VEC = tf.TensorSpec([SIZE, V, W], tf.float32)
WTS = tf.TensorSpec([V], tf.float32)
ACT = tf.TensorSpec([SIZE, W], tf.float32)


def _bad_lookup(edit=None, comb=None, **kw):
    _, groups, table, weights, _ = _setup(7, full=True)
    bufs = _buffers(groups)
    if edit:
        edit(bufs)
    comb = comb or _functions()[0]
    args = dict(bufs, embedding_table=table, weights=weights, input_size=SIZE, max_valency=V,
                num_weights=V, combiner_computation=_attr(comb), quantization_config_low=0.0,
                quantization_config_high=0.0, quantization_config_num_buckets=0,
                table_name="t", num_sparsecores_per_device=NUM_SC)
    args.update(kw)
    return dict(name=PREFIX + BASE + "WithCsrInput", _functions=[comb], **args)


def _set(key, index, value):
    def edit(bufs):
        bufs[key] = bufs[key].copy()
        bufs[key][index] = value
    return edit


def _first_pos(value):
    return _set("sorted_pos_ids", 0, value)


def _more_groups(bufs):
    """A third group (beyond the 2 sparse cores' one minibatch) holding an id."""
    rp = bufs["row_pointers"].copy()
    rp[2 * 8:] = rp[2 * 8 - 1] + 1  # every later segment ends one id further
    bufs["row_pointers"] = rp


LOOKUP_CASES = [
    (_bad_lookup(_first_pos(V)), r"sorted_pos_ids\[0\] = 3 is outside \[0, max_valency = 3\)"),
    (_bad_lookup(_first_pos(-1)), r"sorted_pos_ids\[0\] = -1 is outside"),
    (_bad_lookup(_set("sorted_sample_ids", 0, BATCH)), r"sorted_sample_ids\[0\] = 3 is outside"),
    (_bad_lookup(_set("sorted_token_ids", 1, SHARD_ROWS)), r"sorted_token_ids\[1\] = 4"),
    (_bad_lookup(_set("row_pointers", 0, 10**6)), r"row_pointers\[0\] = 1000000 must lie"),
    (_bad_lookup(_more_groups), r"row_pointers\[16\]: segment 0 of group 2 holds ids"),
    (_bad_lookup(lambda b: b.update(sorted_pos_ids=b["sorted_pos_ids"][:-1])),
     "sorted_pos_ids has 127 elements, sorted_sample_ids 128"),
    (_bad_lookup(lambda b: b.update(row_pointers=b["row_pointers"][:15])),
     "row_pointers has 15 entries; 2 sparse cores need 16"),
    (_bad_lookup(lambda b: b.update(sorted_gains=b["sorted_gains"][None])),
     "sorted_gains must have rank 1"),
    (_bad_lookup(weights=np.ones([V + 1], np.float32)), r"weights has shape \[4\], \[3\] expected"),
    (_bad_lookup(embedding_table=np.ones([7, W], np.float32)), "7 rows do not split into 2"),
    (_bad_lookup(comb=_fn(lambda v, x, w: tf.zeros([SIZE, W + 1]), VAL, VEC, WTS)),
     r"combiner_computation's output 0 is float \[6,5\]; float \[6,4\] expected"),
    (_bad_lookup(comb=_fn(lambda v, x, w: (x[:, 0], x[:, 1]), VAL, VEC, WTS)),
     "combiner_computation returned 2 tensors, 1 expected"),
    (_bad_lookup(comb=_fn(lambda v, x, w: tf.zeros([SIZE, W], tf.int32), VAL, VEC, WTS)),
     r"combiner_computation's output 0 is int32"),
]


@pytest.mark.parametrize("kwargs,match", LOOKUP_CASES)
def test_lookup_bad_input(kwargs, match):
    _raises(BASE + "WithCsrInput: .*" + match, **kwargs)


def test_lookup_duplicate_position():
    def edit(bufs):  # the second id of the first segment takes the first's sample and position
        for key in ("sorted_sample_ids", "sorted_pos_ids"):
            bufs[key] = bufs[key].copy()
            bufs[key][1] = bufs[key][0]
    _, groups, _, _, _ = _setup(7, full=True)
    assert len(groups[0][0]) >= 2
    _raises(r"sorted_pos_ids\[1\] = \d+: sample \d+ already has an id at position",
            **_bad_lookup(edit))


def test_lookup_refuses_quantization_and_bad_sparse_core_count():
    _raises("not implemented on CPU", error=tf.errors.UnimplementedError,
            **_bad_lookup(quantization_config_num_buckets=4))
    _raises("num_sparsecores_per_device must be a power of two",
            **_bad_lookup(num_sparsecores_per_device=3))


def _bad_grad(edit=None, fns=None, **kw):
    _, groups, table, weights, dact = _setup(8, full=True)
    bufs = _buffers(groups)
    if edit:
        edit(bufs)
    val, vec, _ = ref.preserved(groups, NUM_SC, BATCH, SHARD_ROWS, table, V)
    fns = fns or _functions()
    args = dict(bufs, weights=weights, preserved_valencies=val, preserved_vectors=vec,
                preserved_weights=weights, activation_gradients=dact,
                learning_rate=np.float32(0.1), combiner_weights_learning_rate=np.float32(0.1),
                embedding_table=table, accumulator=np.ones_like(table), max_valency=V,
                num_weights=V, combiner_table_vjp_computation=_attr(fns[1]),
                combiner_weights_vjp_computation=_attr(fns[2]), table_name="t",
                clip_weight_min=-np.inf, clip_weight_max=np.inf,
                num_sparsecores_per_device=NUM_SC)
    args.update(kw)
    return dict(name=PREFIX + BASE + "GradWithAdagradAndCsrInput", _functions=fns[1:], **args)


GRAD_CASES = [
    (_bad_grad(preserved_vectors=np.zeros([SIZE, V + 1, W], np.float32)),
     r"preserved_vectors has shape \[6,4,4\], \[6,3,4\] expected"),
    (_bad_grad(preserved_valencies=np.zeros([SIZE + 1], np.int32)),
     r"preserved_valencies has shape \[7\]"),
    (_bad_grad(preserved_valencies=np.ones([SIZE], np.int32)),
     r"lies beyond preserved_valencies\[\d\] = 1"),
    (_bad_grad(preserved_weights=np.ones([2], np.float32)), r"preserved_weights has shape \[2\]"),
    (_bad_grad(activation_gradients=np.zeros([SIZE, W + 1], np.float32)),
     r"activation_gradients \[6,5\] must be \[a multiple of 2, 4\]"),
    (_bad_grad(accumulator=np.ones([3, W], np.float32)), r"slot variable \(input 13\)"),
    (_bad_grad(learning_rate=np.ones([2], np.float32)), "learning_rate must be a scalar"),
    (_bad_grad(combiner_weights_learning_rate=np.ones([2], np.float32)),
     "combiner_weights_learning_rate must be a scalar"),
    (_bad_grad(_first_pos(V)), r"sorted_pos_ids\[0\] = 3 is outside"),
    (_bad_grad(_set("sorted_token_ids", 0, -1)), r"sorted_token_ids\[0\] = -1"),
    (_bad_grad(fns=(None, _fn(lambda v, x, w, g: x[:, :2], VAL, VEC, WTS, ACT),
                    _functions()[2])),
     r"combiner_table_vjp_computation's output 0 is float \[6,2,4\]; float \[6,3,4\]"),
    (_bad_grad(fns=(None, _functions()[1],
                    _fn(lambda v, x, w, g: (w, w), VAL, VEC, WTS, ACT))),
     "combiner_weights_vjp_computation returned 2 tensors, 1 expected"),
    (_bad_grad(clip_weight_min=1.0, clip_weight_max=0.0), "clip_weight_min must be smaller"),
]


@pytest.mark.parametrize("kwargs,match", GRAD_CASES)
def test_gradient_bad_input(kwargs, match):
    _raises(BASE + "GradWithAdagradAndCsrInput: .*" + match, **kwargs)


def test_custom_optimizer_bad_output():
    _, groups, table, weights, dact = _setup(9, full=True)
    val, vec, _ = ref.preserved(groups, NUM_SC, BATCH, SHARD_ROWS, table, V)
    fns = _functions()
    spec = tf.TensorSpec([1, W], tf.float32)
    for body, match in [(lambda g, w, lr: (w, w), "returned 2 tensors, 1 expected"),
                        (lambda g, w, lr: w[0], r"output 0 is float \[4\]; float \[1,4\]")]:
        opt_fn = _fn(body, spec, spec, spec)
        _raises(BASE + "GradWithCsrInput: optimizer_custom_computation.*" + match,
                name=PREFIX + BASE + "GradWithCsrInput", _functions=[fns[1], fns[2], opt_fn],
                **_buffers(groups), weights=weights, preserved_valencies=val,
                preserved_vectors=vec, preserved_weights=weights, activation_gradients=dact,
                tables=[table], hyperparameters=[np.float32(0.1)],
                combiner_weights_learning_rate=np.float32(0.05), max_valency=V, num_weights=V,
                combiner_table_vjp_computation=_attr(fns[1]),
                combiner_weights_vjp_computation=_attr(fns[2]),
                optimizer_custom_computation=_attr(opt_fn), table_name="t",
                num_sparsecores_per_device=NUM_SC)


def _bad_coo(**kw):
    args = dict(name=PREFIX + "XlaSparseDenseMatmul", row_ids=np.array([0, 1, 1], np.int32),
                col_ids=np.array([2, 0, 2], np.uint32),
                values=np.array([1.0, 2.0, 0.5], np.float32), offsets=np.uint32(0),
                embedding_table=np.ones([3, 2], np.float32), max_ids_per_partition=8,
                max_unique_ids_per_partition=8, input_size=2)
    args.update(kw)
    return args


@pytest.mark.parametrize("kwargs,match", [
    (_bad_coo(row_ids=np.array([0, 2, 1], np.int32)), r"row_ids\[1\] = 2 is outside \[0, 2\)"),
    (_bad_coo(row_ids=np.array([0, -1, 1], np.int32)), r"row_ids\[1\] = -1"),
    (_bad_coo(col_ids=np.array([2, 3, 2], np.uint32)), r"col_ids\[1\] = 3 is outside \[0, 3\)"),
    (_bad_coo(col_ids=np.array([2, 2**32 - 1, 2], np.uint32)), r"col_ids\[1\] = 4294967295"),
    (_bad_coo(values=np.ones([2], np.float32)), r"values \(2\) must have the same length"),
    (_bad_coo(offsets=np.array([0, 0], np.uint32)), "offsets must have rank 0"),
    (_bad_coo(embedding_table=np.ones([3], np.float32)), "embedding_table must have rank 2"),
    (_bad_coo(max_ids_per_partition=2), "the 3 ids exceed max_ids_per_partition = 2"),
    (_bad_coo(max_unique_ids_per_partition=1),
     "the 2 unique ids exceed max_unique_ids_per_partition = 1"),
])
def test_coo_lookup_bad_input(kwargs, match):
    _raises("XlaSparseDenseMatmul: .*" + match, **kwargs)


def test_coo_lookup_refuses_offsets():
    _raises("offsets = 3 is not implemented", error=tf.errors.UnimplementedError,
            **_bad_coo(offsets=np.uint32(3)))
