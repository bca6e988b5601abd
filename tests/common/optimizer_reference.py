"""numpy reference of the TPU embedding training step, written from the spec
(docs/tpu_embedding_semantics.md §4.3 backward semantics, §5.0
per-step pipeline, §5.1-5.18 optimizer formulas) and independent of the C++
engine.  Everything is computed in float64.

Two layers:

* one function per optimizer, ``update(w, slots, g, lr, hp, dynamic)``:
  element-wise over numpy arrays (one row or many rows at once); returns the
  new ``(w, slots)`` without touching its inputs.  ``hp`` is a dict keyed by
  the proto's field names (missing fields take the proto default, 0/False);
* the step driver: per-row gradients from the bags of every output (each id
  k of bag b contributes ``(w_k / N_b) * G_b``, N_b = 1 / Σw / sqrt(Σw²) for
  sum / mean / sqrtn, §4.3), then per touched row: gradient clipping ->
  optimizer -> decoupled weight decay from the pre-update weight ->
  weight clipping (§5.0).  Variants: gradient accumulation DISABLED (the
  pipeline per contribution, in contribution order) and non-lazy optimizers
  (every untouched row is updated with g = 0).

Where the spec gives no exact formula (BoundedAdagrad 5.4, OnlineYogi 5.13,
ProximalYogi 5.14, FrequencyAwareAdagrad 5.18) the reference implements the
reconstruction the spec names (5.4, 5.14 verbatim; 5.13 "FTRL with Yogi's
second moment"; 5.18 the proto's structure with the frequency estimate
counter/step, see ``frequency_aware_adagrad``) -- those are assumptions, not
TPU facts.
"""
import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

F64 = np.float64


def _sign(x):
    return np.sign(x)


def _h(hp, name, default=0.0):
    v = hp.get(name, default)
    return float(v)


# ===================================================================== optimizers
# Each: (w, slots: tuple of arrays, g, lr, hp, dynamic) -> (w, slots)

def sgd(w, s, g, lr, hp, dynamic=0.0):
    """§5.1: w -= lr * g."""
    return w - lr * g, ()


def adagrad(w, s, g, lr, hp, dynamic=0.0):
    """§5.2: a += g²; w -= lr * g / sqrt(a) (updated accumulator)."""
    (a,) = s
    a = a + g * g
    return w - lr * g / np.sqrt(a), (a,)


def adagrad_momentum(w, s, g, lr, hp, dynamic=0.0):
    """§5.3 (SparseCore / v2-test form, momenta store s·g)."""
    a, m = s
    momentum, beta2, eps = _h(hp, "momentum"), _h(hp, "beta2"), _h(hp, "epsilon")
    exponent = _h(hp, "exponent") or 2.0
    if beta2 == 1.0:
        a = a + g * g
    else:
        a = beta2 * a + (1 - beta2) * g * g
    scale = (a + eps) ** (-1.0 / exponent)
    m = momentum * m + scale * g
    update = momentum * m + scale * g if hp.get("use_nesterov") else m
    return w - lr * update, (a, m)


def bounded_adagrad(w, s, g, lr, hp, dynamic=0.0):
    """§5.4 reconstruction: a_new = min(a + g², max_accumulator if > 0);
    Δ = lr·g/sqrt(a_new if update_accumulator_first else a), clipped to
    ±max_var_update if > 0; w -= Δ."""
    (a,) = s
    a_new = a + g * g
    max_acc = _h(hp, "max_accumulator")
    if max_acc > 0:
        a_new = np.minimum(a_new, max_acc)
    eff = a_new if hp.get("update_accumulator_first") else a
    delta = lr * g / np.sqrt(eff)
    mvu = _h(hp, "max_var_update")
    if mvu > 0:
        delta = np.clip(delta, -mvu, mvu)
    return w - delta, (a_new,)


def adam(w, s, g, lr, hp, dynamic=0.0):
    """§5.5, no bias correction; sqrt(v)+eps or sqrt(v+eps²)."""
    m, v = s
    b1, b2, eps = _h(hp, "beta1"), _h(hp, "beta2"), _h(hp, "epsilon")
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v + eps * eps) if hp.get("use_sum_inside_sqrt") else np.sqrt(v) + eps
    return w - lr * m / denom, (m, v)


def ftrl(w, s, g, lr, hp, dynamic=0.0):
    """§5.6, both multiply_linear_by_lr forms, with beta."""
    n, z = s
    l1, l2, beta = _h(hp, "l1"), _h(hp, "l2"), _h(hp, "beta")
    lr_power = _h(hp, "lr_power")
    n_new = n + g * g
    p_new, p_old = n_new ** (-lr_power), n ** (-lr_power)
    sigma = p_new - p_old
    if hp.get("multiply_linear_by_lr"):
        z = z + lr * g - sigma * w
        w = (np.clip(z, -lr * l1, lr * l1) - z) / (p_new + beta + 2 * lr * l2)
    else:
        z = z + g - (sigma / lr) * w
        w = (np.clip(z, -l1, l1) - z) / ((p_new + beta) / lr + 2 * l2)
    return w, (n_new, z)


def momentum(w, s, g, lr, hp, dynamic=0.0):
    """§5.7: m = momentum·m + g; w -= lr·(nesterov ? g + momentum·m : m)."""
    (m,) = s
    mu = _h(hp, "momentum")
    m = mu * m + g
    return w - lr * (g + mu * m if hp.get("use_nesterov") else m), (m,)


def rms_prop(w, s, g, lr, hp, dynamic=0.0):
    """§5.8."""
    ms, mom = s
    rho, mu, eps = _h(hp, "rho"), _h(hp, "momentum"), _h(hp, "epsilon")
    ms = rho * ms + (1 - rho) * g * g
    mom = mu * mom + lr * g / np.sqrt(ms + eps)
    return w - mom, (ms, mom)


def centered_rms_prop(w, s, g, lr, hp, dynamic=0.0):
    """§5.9 (slots in TF's order ms, mom, mg)."""
    ms, mom, mg = s
    rho, mu, eps = _h(hp, "rho"), _h(hp, "momentum"), _h(hp, "epsilon")
    ms = rho * ms + (1 - rho) * g * g
    mg = rho * mg + (1 - rho) * g
    mom = mu * mom + lr * g / np.sqrt(ms - mg * mg + eps)
    return w - mom, (ms, mom, mg)


def proximal_adagrad(w, s, g, lr, hp, dynamic=0.0):
    """§5.10 (FOBOS)."""
    (a,) = s
    l1, l2 = _h(hp, "l1"), _h(hp, "l2")
    a = a + g * g
    eta = lr / np.sqrt(a)
    v = w - eta * g
    if l1 > 0:
        w = _sign(v) * np.maximum(np.abs(v) - eta * l1, 0.0) / (1 + eta * l2)
    else:
        w = v / (1 + eta * l2)
    return w, (a,)


def adadelta(w, s, g, lr, hp, dynamic=0.0):
    """§5.11."""
    a, u = s
    rho, eps = _h(hp, "rho"), _h(hp, "epsilon")
    a = rho * a + (1 - rho) * g * g
    delta = np.sqrt(u + eps) / np.sqrt(a + eps) * g
    w = w - lr * delta
    u = rho * u + (1 - rho) * delta * delta
    return w, (a, u)


def online_yogi(w, s, g, lr, hp, dynamic=0.0):
    """§5.13 reconstruction: FTRL (lr_power -0.5, multiply_linear_by_lr false)
    whose accumulator is Yogi's second moment v <- v - (1-beta2)·sign(v-g²)·g²."""
    v, z = s
    l1, l2, b2 = _h(hp, "l1"), _h(hp, "l2"), _h(hp, "beta2")
    g2 = g * g
    v_new = v - (1 - b2) * _sign(v - g2) * g2
    sigma = (np.sqrt(v_new) - np.sqrt(v)) / lr
    z = z + g - sigma * w
    w = (np.clip(z, -l1, l1) - z) / (np.sqrt(v_new) / lr + 2 * l2)
    return w, (v_new, z)


def proximal_yogi(w, s, g, lr, hp, dynamic=0.0):
    """§5.14 reconstruction (slots v, m)."""
    v, m = s
    l1, l2 = _h(hp, "l1"), _h(hp, "l2")
    b1, b2, eps = _h(hp, "beta1"), _h(hp, "beta2"), _h(hp, "epsilon")
    m = b1 * m + (1 - b1) * g
    v = v - (1 - b2) * _sign(v - g * g) * g * g
    eta = lr / (np.sqrt(v) + eps)
    u = w - eta * m
    w = _sign(u) * np.maximum(np.abs(u) - eta * l1, 0.0) / (1 + eta * l2)
    return w, (v, m)


def frequency_estimator(w, s, g, lr, hp, dynamic=0.0):
    """§5.15 (exact proto sequence): the learning rate is the global step, the
    parameters hold the estimated delta D, the gradient is ignored."""
    (last,) = s
    tau, max_delta, thr = _h(hp, "tau"), _h(hp, "max_delta"), _h(hp, "outlier_threshold")
    delta = lr - last
    clipped = np.minimum(delta, max_delta)
    outlier = delta >= thr * w
    w = np.where(outlier, clipped, w * (1 - tau) + clipped * tau)
    return w, (np.full_like(last, lr),)


def frequency_aware_adagrad(w, s, g, lr, hp, dynamic=0.0):
    """§5.18, the proto's structure with its inconsistency resolved as the
    frequency estimate counter/step (the only reading in which "frequency
    aware" boosts rare ids): counter += 1;
    a = max(decay·a + g², initial_accumulator_value);
    scale = min((step / counter)^probability_exponent, max_lr_multiplier if > 0);
    update = g·scale/sqrt(a) + l1·sign(w) + l2·w; w -= lr·update.
    ``dynamic`` = step_counter (the table's OptimizerDynamicInput)."""
    a, counter = s
    l1 = _h(hp, "l1_regularization_strength")
    l2 = _h(hp, "l2_regularization_strength")
    counter = counter + 1
    a = np.maximum(_h(hp, "accumulator_decay") * a + g * g, _h(hp, "initial_accumulator_value"))
    scale = (dynamic / counter) ** _h(hp, "probability_exponent")
    mult = _h(hp, "max_lr_multiplier")
    if mult > 0:
        scale = np.minimum(scale, mult)
    update = g * scale / np.sqrt(a)
    if l1 > 0:
        update = update + l1 * _sign(w)
    if l2 > 0:
        update = update + l2 * w
    return w - lr * update, (a, counter)


def lion(w, s, g, lr, hp, dynamic=0.0):
    """§5.17: c = b1·m + (1-b1)·g; w -= lr·sign(c); m = b2·m + (1-b2)·g."""
    (m,) = s
    b1, b2 = _h(hp, "beta1"), _h(hp, "beta2")
    c = b1 * m + (1 - b1) * g
    return w - lr * _sign(c), (b2 * m + (1 - b2) * g,)


def assign(w, s, g, lr, hp, dynamic=0.0):
    """§5.16: w = g."""
    return np.array(g, copy=True), ()


UPDATES: Dict[str, Callable] = {
    "stochastic_gradient_descent": sgd,
    "adagrad": adagrad,
    "adagrad_momentum": adagrad_momentum,
    "bounded_adagrad": bounded_adagrad,
    "adam": adam,
    "ftrl": ftrl,
    "momentum": momentum,
    "rms_prop": rms_prop,
    "centered_rms_prop": centered_rms_prop,
    "proximal_adagrad": proximal_adagrad,
    "adadelta": adadelta,
    "online_yogi": online_yogi,
    "proximal_yogi": proximal_yogi,
    "frequency_estimator": frequency_estimator,
    "frequency_aware_adagrad": frequency_aware_adagrad,
    "lion": lion,
    "assign": assign,
}


def is_non_lazy(optimizer, hp):
    """§4.3/§5.5/§5.17: only non-lazy Adam and Lion touch every row."""
    if optimizer == "adam":
        return bool(hp.get("use_non_lazy_adam"))
    if optimizer == "lion":
        return bool(hp.get("use_non_lazy_lion"))
    return False


# ===================================================================== pipeline

@dataclasses.dataclass
class TableParams:
    """What the step of one table needs (mirrors OptimizationParameters)."""
    optimizer: str
    hp: dict = dataclasses.field(default_factory=dict)
    lr: float = 0.1                 # constant lr; overridden per step when dynamic
    lr_tag: Optional[int] = None    # dynamic learning rate tag
    step_counter_tag: Optional[int] = None   # FrequencyAwareAdagrad's dynamic input
    grad_clip: Tuple[Optional[float], Optional[float]] = (None, None)
    weight_clip: Tuple[Optional[float], Optional[float]] = (None, None)
    weight_decay: float = 0.0
    decay_by_lr: bool = False
    accumulate: bool = True         # gradient_accumulation_status != DISABLED

    def learning_rate(self, dynamic_inputs):
        return self.lr if self.lr_tag is None else float(np.float32(dynamic_inputs[self.lr_tag]))

    def dynamic(self, dynamic_inputs):
        if self.step_counter_tag is None:
            return 0.0
        return float(np.float32(dynamic_inputs[self.step_counter_tag]))


def _clip(x, limits):
    lo, hi = limits
    if lo is not None:
        x = np.maximum(x, lo)
    if hi is not None:
        x = np.minimum(x, hi)
    return x


def apply_rows(p: TableParams, state, rows, g, lr, dynamic):
    """The §5.0 pipeline on `rows` (unique ids) of `state` = [W, slots...]
    (modified in place) with per-row gradients g [len(rows), dim]."""
    upd = UPDATES[p.optimizer]
    g = _clip(np.asarray(g, F64), p.grad_clip)
    w_old = state[0][rows]
    w, slots = upd(w_old, tuple(s[rows] for s in state[1:]), g, lr, p.hp, dynamic)
    decay = p.weight_decay * (lr if p.decay_by_lr else 1.0)
    w = w - decay * w_old
    state[0][rows] = _clip(w, p.weight_clip)
    for s, new in zip(state[1:], slots):
        s[rows] = new


# Contribution: (id, coefficient, gradient row) -- the id's row receives
# coefficient * gradient row.
Contribution = Tuple[int, float, np.ndarray]


def bag_coefficients(bag, combiner):
    """§4.3: (w_k / N_b) for each (id, w) of a bag."""
    ws = np.array([float(np.float32(w)) for _, w in bag], F64)
    if combiner == "sum":
        norm = 1.0
    elif combiner == "mean":
        norm = ws.sum()
    elif combiner == "sqrtn":
        norm = np.sqrt((ws * ws).sum())
    else:
        raise ValueError(combiner)
    if norm == 0:
        return np.zeros_like(ws)
    return ws / norm


def contributions(outputs) -> List[Contribution]:
    """Every contribution of a table in the engine's order: outputs in order,
    then (replicas, i.e. the caller's concatenation of) bags, ids in bag order.

    outputs: list of (bags, combiners, grads) of the outputs mapped to the
    table: bags row-major over the output positions, each a list of (id, w);
    combiners a string or one per bag; grads [positions, dim]."""
    out = []
    for bags, combiners, grads in outputs:
        grads = np.asarray(grads, F64).reshape(len(bags), -1)
        for b, bag in enumerate(bags):
            if not bag:
                continue
            comb = combiners if isinstance(combiners, str) else combiners[b]
            for (i, _), c in zip(bag, bag_coefficients(bag, comb)):
                out.append((int(i), float(c), grads[b]))
    return out


def accumulate(contribs: Sequence[Contribution], dim):
    """De-duplicated per-row gradients: (sorted unique ids, G [n, dim])."""
    acc = {}
    for i, c, g in contribs:
        if i not in acc:
            acc[i] = np.zeros(dim, F64)
        acc[i] += c * g
    ids = np.array(sorted(acc), np.int64)
    return ids, (np.stack([acc[i] for i in ids]) if len(ids) else np.zeros((0, dim)))


def step(p: TableParams, state, contribs: Sequence[Contribution], dynamic_inputs=()):
    """One training step of one table (state = [W, slots...] float64, in place)."""
    lr = p.learning_rate(dynamic_inputs)
    dyn = p.dynamic(dynamic_inputs)
    vocab, dim = state[0].shape
    if p.accumulate:
        ids, G = accumulate(contribs, dim)
        if len(ids):
            apply_rows(p, state, ids, G, lr, dyn)
        touched = set(ids.tolist())
    else:
        touched = set()
        for i, c, g in contribs:
            apply_rows(p, state, np.array([i]), (c * g)[None, :], lr, dyn)
            touched.add(i)
    if is_non_lazy(p.optimizer, p.hp):
        rest = np.array([r for r in range(vocab) if r not in touched], np.int64)
        if len(rest):
            apply_rows(p, state, rest, np.zeros((len(rest), dim)), lr, dyn)
    return state


def copy_state(state):
    return [np.array(s, F64, copy=True) for s in state]
