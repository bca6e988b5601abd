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
