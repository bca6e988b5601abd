"""The training harness of the optimizer tests (tests/engine/test_optimizer_
{formulas,pipeline,sends}.py and optimizer_multi_replica_script.py):
enqueue -> Recv -> SendTPUEmbeddingGradients -> Retrieve on random tables and
slots, with duplicate ids inside bags and across samples and features, two
tables, several weighted features on one table (sum, mean and sqrtn
combiners) and a sequence feature; the retrieved tables AND slots are
compared with

* the float64 numpy reference tests/common/optimizer_reference.py, written from the
  spec (§4.3 backward semantics, §5.0 pipeline, §5.1-5.18 formulas), and
* where TF has a CPU training kernel with the same math (spec §5.20), that
  kernel (tf.raw_ops.ResourceSparseApply* / dense ResourceApplyAdam with
  beta powers 0) applied to tf.Variables holding the same initial values and
  fed the de-duplicated, accumulated per-row gradient of the numpy driver.

A test module that imports the autouse fixture ``_print_errors`` prints the
maximum observed errors per case at its end (ERRORS lines; run with -s).
"""
from typing import Dict, Tuple

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
import optimizer_reference as ref
from optimizer_reference import TableParams
from tf_tpu_emb.optimizers import BY_PROTO_FIELD


# float32 engine vs float64 reference after 3 steps.
RTOL, ATOL = 1e-5, 1e-6
B, L, STEPS = 4, 3, 3
TABLES = [("t", 16, 3), ("u", 10, 2)]       # name, vocabulary, dimension
ID_RANGE = [12, 8]                           # ids drawn below this: the last rows stay untouched
# name, table, combiner, kind (bag = [B] weighted bags; seq = [B, L] sequence)
FEATURES = [
    ("fsum", 0, "sum", "bag"),
    ("fu", 1, "mean", "bag"),
    ("fmean", 0, "mean", "bag"),
    ("fseq", 0, "sum", "seq"),
    ("fsqrtn", 0, "sqrtn", "bag"),
]
COMBINERS = [c for _, _, c, _ in FEATURES]   # 5 inputs, 2 tables: one combiner per input
DISABLED, ENABLED = 2, 1                     # GradientAccumulationStatus.Status

# label -> (max |got - want|, max |d| / (atol + rtol |want|))
ERRORS: Dict[str, Tuple[float, float]] = {}


@pytest.fixture(scope="module", autouse=True)
def _print_errors():
    yield
    if ERRORS:
        print("\nERRORS (label: max abs error, max error / (atol + rtol*|want|))")
        for label, (a, r) in sorted(ERRORS.items()):
            print("ERRORS %-60s %.3g %.3g" % (label, a, r))
        ERRORS.clear()  # the next module prints its own


# ====================================================================== config

def fill_params(params, p: TableParams, explicit_enabled=False):
    """OptimizationParameters from a reference TableParams."""
    opt = getattr(params, p.optimizer)
    opt.SetInParent()
    for k, v in p.hp.items():
        setattr(opt, k, v)
    if p.step_counter_tag is not None:
        opt.step_counter.tag = p.step_counter_tag
    if p.lr_tag is None:
        params.learning_rate.constant = p.lr
    else:
        params.learning_rate.dynamic.tag = p.lr_tag
    for limits, (lo, hi) in ((params.gradient_clipping_limits, p.grad_clip),
                             (params.clipping_limits, p.weight_clip)):
        if lo is not None:
            limits.lower.value = lo
        if hi is not None:
            limits.upper.value = hi
    params.weight_decay_factor = p.weight_decay
    params.multiply_weight_decay_factor_by_learning_rate = p.decay_by_lr
    if not p.accumulate:
        params.gradient_accumulation_status = DISABLED
    elif explicit_enabled:
        params.gradient_accumulation_status = ENABLED


def make_config(table_params, *, batch=B, num_tensor_cores=1, explicit_enabled=False):
    c = eu.Config()
    c.mode = eu.TRAINING
    c.num_tensor_cores = num_tensor_cores
    for (name, vocab, dim), p in zip(TABLES, table_params):
        desc = c.table_descriptor.add()
        desc.name, desc.vocabulary_size, desc.dimension = name, vocab, dim
        fill_params(desc.optimization_parameters, p, explicit_enabled)
    for name, t, _, kind in FEATURES:
        fd = c.feature_descriptor.add()
        fd.name, fd.table_id = name, t
        fd.input_shape.extend([batch] if kind == "bag" else [batch, L])
    return c


# ============================================================ inputs and state

SLOT_INIT = {
    # positive where the formulas need it (square roots, divisions)
    "accumulators": lambda r, s: r.uniform(0.1, 1.0, s),
    "velocities": lambda r, s: r.uniform(0.05, 0.5, s),
    "updates": lambda r, s: r.uniform(0.05, 0.5, s),
    "ms": lambda r, s: r.uniform(0.5, 1.5, s),       # ms - mg² > 0.4
    "mg": lambda r, s: r.uniform(-0.3, 0.3, s),
    "vs": lambda r, s: r.uniform(0.1, 1.0, s),
    "v": lambda r, s: r.uniform(0.1, 1.0, s),
    "momenta": lambda r, s: 0.3 * r.standard_normal(s),
    "mom": lambda r, s: 0.1 * r.standard_normal(s),
    "m": lambda r, s: 0.3 * r.standard_normal(s),
    "linears": lambda r, s: 0.5 * r.standard_normal(s),
    "last_hit_step": lambda r, s: r.integers(0, 5, s),
    "counters": lambda r, s: r.integers(1, 6, s),
}


def initial_state(rng, optimizer, vocab, dim):
    """Random float32 [parameters, slots...] (slot order of TF's ops)."""
    shape = (vocab, dim)
    if optimizer == "frequency_estimator":  # parameters = estimated delta D > 0
        params = rng.uniform(1.0, 8.0, shape)
    else:
        params = rng.standard_normal(shape)
    slots = [SLOT_INIT[name](rng, shape) for name in BY_PROTO_FIELD[optimizer].slots]
    return [np.asarray(a, np.float32) for a in [params] + slots]


def _w(rng):
    return float(np.float32(rng.uniform(0.25, 2.0)))


def make_batch(rng, batch=B):
    """{feature: bags} (sequence features: one list of (id, 1.0) per sample,
    lengths 0..L+2 so that some are truncated)."""
    out = {}
    for name, t, _, kind in FEATURES:
        if kind == "seq":
            lengths = rng.integers(0, L + 3, batch)
            out[name] = [[(int(i), 1.0) for i in rng.integers(0, ID_RANGE[t], n)]
                         for n in lengths]
        else:
            out[name] = eu.random_bags(rng, batch, ID_RANGE[t], max_len=4, weighted=True)
    # duplicates inside bags, and the same ids across samples and features
    out["fsum"][0] = [(5, _w(rng)), (5, _w(rng)), (2, _w(rng))]
    out["fmean"][batch - 1] = [(5, _w(rng)), (7, _w(rng)), (7, _w(rng))]
    out["fsqrtn"][1] = [(2, _w(rng)), (2, _w(rng))]
    out["fu"][0] = [(3, _w(rng)), (3, _w(rng))]
    out["fseq"][batch - 1] = [(5, 1.0), (5, 1.0), (7, 1.0), (5, 1.0)]  # last one truncated
    return out


def make_grads(rng, batch=B):
    return [rng.standard_normal(([batch] if kind == "bag" else [batch, L]) +
                                [TABLES[t][2]]).astype(np.float32)
            for _, t, _, kind in FEATURES]


def enqueue(bags, *, device_ordinal=-1, mode="train"):
    args = []
    for name, _, _, kind in FEATURES:
        if kind == "seq":  # [b, p, 0] COO, as TF's v2 API sends sequences
            args.append(eu.sparse_to_enqueue(eu.bags_to_sparse(bags[name])[0], pad_sequence=True))
        else:
            args.append(eu.sparse_to_enqueue(*eu.bags_to_sparse(bags[name])))
    eu.enqueue_arbitrary(args, combiners=COMBINERS, mode=mode, device_ordinal=device_ordinal)


def send(config, grads, lrs=()):
    tf.raw_ops.SendTPUEmbeddingGradients(
        inputs=[tf.constant(g, tf.float32) for g in grads],
        learning_rates=[tf.constant(x, tf.float32) for x in lrs],
        config=eu.serialize(config))


def seq_bags(seqs):
    """A sequence feature as bags row-major over [B, L]: one id per position."""
    return [[s[p]] if p < len(s) else [] for s in seqs for p in range(L)]


def table_outputs(bags, grads, t):
    """(bags, combiner, grads) of every output of table t, in output order."""
    outs = []
    for (name, tt, comb, kind), g in zip(FEATURES, grads):
        if tt != t:
            continue
        b = seq_bags(bags[name]) if kind == "seq" else bags[name]
        outs.append((b, comb, np.asarray(g).reshape(len(b), -1)))
    return outs


def expected_activations(bags, states):
    out = []
    for name, t, comb, kind in FEATURES:
        W = states[t][0]
        if kind == "seq":
            out.append(eu.reference_sequence(W, bags[name], L))
        else:
            out.append(eu.reference_lookup(W, bags[name], comb))
    return out


# ============================================================= TF's CPU kernels

def tf_comparable(p: TableParams):
    """TF has a CPU training kernel with the same math (spec §5.20)."""
    plain = (p.grad_clip == (None, None) and p.weight_clip == (None, None)
             and p.weight_decay == 0 and p.accumulate and p.lr_tag is None)
    if not plain:
        return False
    if p.optimizer == "ftrl":
        return p.hp.get("beta", 0.0) == 0.0
    if p.optimizer == "adam":
        return not p.hp.get("use_sum_inside_sqrt", False)
    return p.optimizer in ("stochastic_gradient_descent", "adagrad", "momentum", "rms_prop",
                           "centered_rms_prop", "proximal_adagrad", "adadelta")


def tf_step(p: TableParams, state, ids, G, lr):
    """Applies TF's kernel to `state` (float32 [W, slots...], in place) with the
    accumulated per-row gradients G of the unique `ids`."""
    R = tf.raw_ops
    hp = p.hp

    def f(x):
        return tf.constant(x, tf.float32)

    if p.optimizer == "adam":
        # dense Adam with beta powers 0 (alpha = lr, no bias correction) on the
        # touched rows (lazy) or on the whole table with g = 0 elsewhere
        if hp.get("use_non_lazy_adam"):
            rows = np.arange(state[0].shape[0])
            g = np.zeros(state[0].shape, np.float32)
            g[ids] = G
        else:
            rows, g = ids, G
        var, m, v = (tf.Variable(s[rows]) for s in state)
        R.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle, beta1_power=f(0),
                            beta2_power=f(0), lr=f(lr), beta1=f(hp["beta1"]),
                            beta2=f(hp["beta2"]), epsilon=f(hp["epsilon"]), grad=f(g),
                            use_nesterov=False)
        for s, x in zip(state, (var, m, v)):
            s[rows] = x.numpy()
        return
    vs = [tf.Variable(s) for s in state]
    h = [x.handle for x in vs]
    idx = tf.constant(ids, tf.int64)
    g = f(G)
    o = p.optimizer
    if o == "stochastic_gradient_descent":
        dense = np.zeros(state[0].shape, np.float32)
        dense[ids] = G
        R.ResourceApplyGradientDescent(var=h[0], alpha=f(lr), delta=f(dense))
    elif o == "adagrad":
        R.ResourceSparseApplyAdagradV2(var=h[0], accum=h[1], lr=f(lr), epsilon=f(0), grad=g,
                                       indices=idx)
    elif o == "ftrl":
        R.ResourceSparseApplyFtrlV2(var=h[0], accum=h[1], linear=h[2], grad=g, indices=idx,
                                    lr=f(lr), l1=f(hp["l1"]), l2=f(hp["l2"]), l2_shrinkage=f(0),
                                    lr_power=f(hp["lr_power"]),
                                    multiply_linear_by_lr=hp.get("multiply_linear_by_lr", False))
    elif o == "momentum":
        R.ResourceSparseApplyMomentum(var=h[0], accum=h[1], lr=f(lr), grad=g, indices=idx,
                                      momentum=f(hp["momentum"]),
                                      use_nesterov=hp.get("use_nesterov", False))
    elif o == "rms_prop":
        R.ResourceSparseApplyRMSProp(var=h[0], ms=h[1], mom=h[2], lr=f(lr), rho=f(hp["rho"]),
                                     momentum=f(hp["momentum"]), epsilon=f(hp["epsilon"]),
                                     grad=g, indices=idx)
    elif o == "centered_rms_prop":  # our slot order: ms, mom, mg
        R.ResourceSparseApplyCenteredRMSProp(var=h[0], mg=h[3], ms=h[1], mom=h[2], lr=f(lr),
                                             rho=f(hp["rho"]), momentum=f(hp["momentum"]),
                                             epsilon=f(hp["epsilon"]), grad=g, indices=idx)
    elif o == "proximal_adagrad":
        R.ResourceSparseApplyProximalAdagrad(var=h[0], accum=h[1], lr=f(lr), l1=f(hp["l1"]),
                                             l2=f(hp["l2"]), grad=g, indices=idx)
    elif o == "adadelta":
        R.ResourceSparseApplyAdadelta(var=h[0], accum=h[1], accum_update=h[2], lr=f(lr),
                                      rho=f(hp["rho"]), epsilon=f(hp["epsilon"]), grad=g,
                                      indices=idx)
    else:
        raise ValueError(o)
    for s, x in zip(state, vs):
        s[...] = x.numpy()


# ================================================================ comparisons

def record(label, got, want, rtol=RTOL, atol=ATOL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    d = np.abs(got - want)
    finite = np.isfinite(d)
    a = float(d[finite].max()) if finite.any() else 0.0
    tol = atol + rtol * np.abs(want[finite])
    with np.errstate(divide="ignore", invalid="ignore"):
        r = float(np.nan_to_num(d[finite] / tol, nan=0.0).max()) if finite.any() else 0.0
    old = ERRORS.get(label, (0.0, 0.0))
    ERRORS[label] = (max(old[0], a), max(old[1], r))


def compare_tables(got, want, label, rtol=RTOL, atol=ATOL):
    """got/want: per table [parameters, slots...]."""
    for t, (g_t, w_t) in enumerate(zip(got, want)):
        assert len(g_t) == len(w_t), (label, t, len(g_t), len(w_t))
        for k, (g, w) in enumerate(zip(g_t, w_t)):
            what = "%s table %s state %d" % (label, TABLES[t][0], k)
            record(label, g, w, rtol, atol)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=what)


def retrieve_all(config):
    return [eu.retrieve_table(config.table_descriptor[t]) for t in range(len(TABLES))]


def snapshot_equal(before, after):
    for t, (b, a) in enumerate(zip(before, after)):
        for k, (x, y) in enumerate(zip(b, a)):
            assert np.array_equal(x, y), "table %d state %d changed" % (t, k)


# ==================================================================== driver

LAST_RUN: dict = {}


def replay(table_params, init, history, order=None):
    """The numpy reference of a recorded run under other parameters; `order`
    optionally permutes each step's contribution list (DISABLED accumulation)."""
    want = [ref.copy_state(st) for st in init]
    for bags, grads, dyn in history:
        for t, p in enumerate(table_params):
            contribs = ref.contributions(table_outputs(bags, grads, t))
            ref.step(p, want[t], order(contribs) if order else contribs, dyn)
    return want


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - y)))
               for ta, tb in zip(a, b) for x, y in zip(ta, tb))

def run_training(table_params, *, dynamic=lambda s: [], steps=STEPS, seed=0, use_tf=False,
                 explicit_enabled=False, label=""):
    """Loads random state, runs `steps` training steps, checks every step's
    activations against the reference, and returns (engine state, numpy
    reference state, TF-kernel state or None), each per table.  The initial
    state and the steps' (bags, grads, dynamic inputs) are kept in
    LAST_RUN for replay()."""
    config = make_config(table_params, explicit_enabled=explicit_enabled)
    rng = np.random.default_rng(seed)
    with eu.engine(config):
        init = [initial_state(rng, p.optimizer, vocab, dim)
                for (_, vocab, dim), p in zip(TABLES, table_params)]
        for t, st in enumerate(init):
            eu.load_table(config.table_descriptor[t], st)
        want = [ref.copy_state(st) for st in init]
        tfs = [[s.copy() for s in st] for st in init] if use_tf else None
        LAST_RUN.clear()
        LAST_RUN.update(init=init, history=[])
        for s in range(steps):
            bags = make_batch(rng)
            enqueue(bags)
            acts = eu.recv(config)
            for o, (a, e) in enumerate(zip(acts, expected_activations(bags, want))):
                record(label + " activations", a, e, 1e-5, 1e-5)
                np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5,
                                           err_msg="%s step %d output %d" % (label, s, o))
            grads = make_grads(rng)
            dyn = dynamic(s)
            send(config, grads, dyn)
            LAST_RUN["history"].append((bags, grads, dyn))
            for t, p in enumerate(table_params):
                contribs = ref.contributions(table_outputs(bags, grads, t))
                ref.step(p, want[t], contribs, dyn)
                if use_tf:
                    ids, G = ref.accumulate(contribs, TABLES[t][2])
                    tf_step(p, tfs[t], ids, G.astype(np.float32), p.learning_rate(dyn))
        got = retrieve_all(config)
    return got, want, tfs


zlib_seed = eu.stable_seed
