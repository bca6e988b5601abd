"""An independent numpy model of jax-tpu-embedding's SparseCore primitives,
on the logical table (no CSR, no sharding), written from the package's
documented formulas (docs/sparsecore_semantics.md, "The JAX
(jax-tpu-embedding) layout"): a sample's activation is the combiner-weighted
sum of its rows; a row's gradient is the sum, over every occurrence of the
row in the batch, of the occurrence's combiner weight times its sample's
activation gradient; each row that occurs is updated once."""
import numpy as np


def combiner_weights(weights: np.ndarray, combiner: str) -> np.ndarray:
  w = np.asarray(weights, np.float64)
  if combiner == "sum":
    return w
  if combiner == "mean":
    return w / w.sum()
  if combiner == "sqrtn":
    return w / np.sqrt((w * w).sum())
  raise ValueError(combiner)


def lookup(table, ids, weights, combiner):
  out = np.zeros((len(ids), table.shape[1]), np.float64)
  for i, (row_ids, w) in enumerate(zip(ids, weights)):
    for r, c in zip(row_ids, combiner_weights(w, combiner)):
      out[i] += c * table[r]
  return out


def row_gradients(shape, ids, weights, combiner, act_grad):
  """(gradient per row [vocab, dim], mask of the rows that occur)."""
  grad = np.zeros(shape, np.float64)
  touched = np.zeros(shape[0], bool)
  for i, (row_ids, w) in enumerate(zip(ids, weights)):
    for r, c in zip(row_ids, combiner_weights(w, combiner)):
      grad[r] += c * act_grad[i]
      touched[r] = True
  return grad, touched


def clip(w, limits):
  if limits is None:
    return w
  lo, hi = limits
  return np.clip(w, -np.inf if lo is None else lo, np.inf if hi is None else hi)


def sgd(table, grad, touched, lr, limits=None):
  out = np.array(table, np.float64)
  out[touched] = clip(out[touched] - lr * grad[touched], limits)
  return out


def adagrad(table, acc, grad, touched, lr, limits=None):
  """acc += g*g; w -= lr * g / sqrt(acc) (the package's Adagrad: no epsilon)."""
  out, acc = np.array(table, np.float64), np.array(acc, np.float64)
  acc[touched] += grad[touched] ** 2
  out[touched] = clip(out[touched] - lr * grad[touched] / np.sqrt(acc[touched]), limits)
  return out, acc


# The other optimizers: each maps (w, slots, g, hyper) of the touched rows
# to their new values, from jax-tpu-embedding's optimizer computations and
# the hyper-parameters its OptimizerSpecs pass (get_hyperparameters(step)).

def adam_hyper(lr, b1, b2, eps, step):
  """alpha_t = lr * sqrt(1 - b2^(t+1)) / (1 - b1^(t+1)); eps_hat = eps * sqrt(1 - b2^(t+1))."""
  c2 = np.sqrt(1.0 - b2 ** (step + 1))
  return lr * c2 / (1.0 - b1 ** (step + 1)), b1, b2, eps * c2


def adam(w, slots, g, hyper):
  alpha_t, b1, b2, eps_hat = hyper
  m, v = slots
  m = m + (1 - b1) * (g - m)
  v = v + (1 - b2) * (g * g - v)
  return w - alpha_t * m / (np.sqrt(v) + eps_hat), (m, v)


def ftrl(w, slots, g, hyper, multiply_linear_by_lr):
  lr, lr_power, l1, l2, beta = hyper
  acc, lin = slots
  acc_new = acc + g * g
  dp = acc_new ** -lr_power - acc ** -lr_power
  if multiply_linear_by_lr:
    lin_new = lin + lr * g - dp * w
    bound = l1 * lr
    denom = acc_new ** -lr_power + 2 * lr * l2 + beta
  else:
    lin_new = lin + g - dp / lr * w
    bound = l1
    denom = (acc_new ** -lr_power + beta) / lr + 2 * l2
  numer = -lin_new if l1 == 0 else np.clip(lin_new, -bound, bound) - lin_new
  return numer / denom, (acc_new, lin_new)


def adagrad_momentum(w, slots, g, hyper):
  lr, momentum, beta2, eps, exponent, nesterov = hyper
  acc, m = slots
  acc = acc + g * g if beta2 == 1 else beta2 * acc + (1 - beta2) * g * g
  scaled = (acc + eps) ** (-1.0 / exponent) * g
  m = momentum * m + scaled
  return w - lr * (momentum * m + scaled if nesterov else m), (acc, m)


def laprop_decay(b2, step):
  return b2 * (1 - b2 ** step) / (1 - b2 ** (step + 1.0))


def laprop(w, slots, g, hyper):
  lr, b1, decay, eps = hyper
  mu, nu = slots
  nu = decay * nu + (1 - decay) * (g * g + eps)
  mu = b1 * mu + np.sqrt(1 - b1 * b1) * g / np.sqrt(nu)
  return w - lr * mu, (mu, nu)


def f2a(w, slots, g, hyper):
  lr, rho, l1, l2, max_mult, global_step = hyper
  acc, local = slots
  local = local + 1
  mult = np.minimum((max(global_step, 1.0) / local) ** rho, max_mult)
  acc = acc + g * g
  return w - lr * (g * mult / np.sqrt(acc) + l1 * np.sign(w) + l2 * w), (acc, local)
