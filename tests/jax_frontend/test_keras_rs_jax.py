"""Keras-RS 0.4.0 on JAX, unchanged, under `python -m tf_tpu_emb.run --jax`.

examples/keras_rs_jax.py (a program written for a TPU with SparseCores:
DataParallel over jax.devices("tpu"), DistributedEmbedding with
placement="sparsecore" or "auto", preprocess outside the jitted
train_on_batch, or model.fit over a generator of preprocessed batches)
runs in a child process under the runner with R replicas
and dumps its inputs, its tables (read back with the layer's
get_embedding_tables) and its dense layer after every step.  An independent
numpy model of the global-batch step, started from the dumped initial
state and fed only the dumped inputs, must match every table within 1e-5
after every step.

The model (docs/sparsecore_semantics.md §11.2, tests/jax_frontend/numpy_model.py):
activations are the sum of each sample's rows; the loss is Keras's mean
squared error of one dense unit over the concatenated activations (features
in name order), so an activation's gradient is 2 (pred - y) / B times the
unit's kernel; a row's gradient is the sum over its occurrences in the
global batch (all features of the table); each occurring row is updated once
by the table's optimizer with jax-tpu-embedding's formulas (Adagrad: no
epsilon; Adam: bias-corrected alpha_t and eps_hat at step t = 0, 1, ...);
the dense unit trains with SGD(0.05).
"""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax_tpu_embedding")
pytest.importorskip("keras_rs")

import numpy_model as nm  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "keras_rs_jax.py")

# The example's model (examples/keras_rs_jax.py).
TABLES = {"user": (64, 8), "item": (96, 16)}
FEATURES = {"user_id": "user", "item_id": "item", "item_hist": "item"}
LR, DENSE_LR = 0.1, 0.05
INITIAL_ACCUMULATOR = 0.1
ADAM = (0.9, 0.999, 1e-7)
FTRL = dict(lr_power=-0.5, l1=0.01, l2=0.02, beta=0.1)
STEPS, BATCH = 3, 32


def run_example(tmp_path, replicas, *args, timeout=240):
  dump = tmp_path / "dump.npz"
  env = dict(os.environ)
  for name in ("XLA_FLAGS", "JAX_PLATFORMS", "KERAS_BACKEND"):  # the runner sets them
    env.pop(name, None)
  proc = subprocess.run(
      [sys.executable, "-m", "tf_tpu_emb.run", "--jax", "--replicas", str(replicas), EXAMPLE,
       "--steps", str(STEPS), "--batch", str(BATCH), "--dump", str(dump), *args],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  assert f"devices {replicas}," in proc.stdout, proc.stdout
  return proc.stdout, proc.stderr, dict(np.load(dump))


def initial_slots(w, optimizer):
  if optimizer == "adagrad":
    return [np.full_like(w, INITIAL_ACCUMULATOR)]
  if optimizer == "adam":
    return [np.zeros_like(w), np.zeros_like(w)]
  if optimizer == "ftrl":
    return [np.full_like(w, INITIAL_ACCUMULATOR), np.zeros_like(w)]
  return []


def model_steps(dump, optimizers):
  """The numpy model's tables and dense kernel after each step, from the
  dumped initial state; optimizers: table -> optimizer."""
  tables = {t: dump[f"tables_0/{t}"].astype(np.float64) for t in TABLES}
  kernel = dump["dense_0/kernel"].astype(np.float64)
  bias = dump["dense_0/bias"].astype(np.float64)
  slots = {t: initial_slots(w, optimizers[t]) for t, w in tables.items()}
  out = []
  for step in range(1, STEPS + 1):
    x = {f: dump[f"inputs_{step}/{f}"] for f in FEATURES}
    y = dump[f"labels_{step}"].astype(np.float64)
    ones = {f: np.ones(v.shape) for f, v in x.items()}
    acts = {f: nm.lookup(tables[FEATURES[f]], x[f], ones[f], "sum") for f in FEATURES}
    concat = np.concatenate([acts[f] for f in sorted(FEATURES)], axis=1)
    pred = concat @ kernel + bias
    d_pred = 2.0 * (pred - y) / len(y)
    d_concat = d_pred @ kernel.T
    d_acts, col = {}, 0
    for f in sorted(FEATURES):
      width = TABLES[FEATURES[f]][1]
      d_acts[f], col = d_concat[:, col:col + width], col + width
    new_tables = {}
    for t, w in tables.items():
      grad = np.zeros_like(w)
      touched = np.zeros(len(w), bool)
      for f in FEATURES:
        if FEATURES[f] == t:
          g, m = nm.row_gradients(w.shape, x[f], ones[f], "sum", d_acts[f])
          grad += g
          touched |= m
      new, optimizer = w.copy(), optimizers[t]
      if optimizer == "sgd":
        new = nm.sgd(w, grad, touched, LR)
      elif optimizer == "adagrad":
        new, acc = nm.adagrad(w, slots[t][0], grad, touched, LR)
        slots[t] = [acc]
      else:
        if optimizer == "adam":
          rows, s = nm.adam(w[touched], [s[touched] for s in slots[t]], grad[touched],
                            nm.adam_hyper(LR, *ADAM, step - 1))
        else:
          rows, s = nm.ftrl(w[touched], [s[touched] for s in slots[t]], grad[touched],
                            (LR, FTRL["lr_power"], FTRL["l1"], FTRL["l2"], FTRL["beta"]),
                            False)
        new[touched] = rows
        for slot, value in zip(slots[t], s):
          slot[touched] = value
      new_tables[t] = new
    tables = new_tables
    kernel = kernel - DENSE_LR * concat.T @ d_pred
    bias = bias - DENSE_LR * d_pred.sum(axis=0)
    out.append(({t: w.copy() for t, w in tables.items()}, kernel.copy()))
  return out


def check(dump, optimizer):
  names = optimizer.split(",") * (2 if "," not in optimizer else 1)
  optimizers = dict(zip(sorted(TABLES), names))
  for step, (tables, kernel) in enumerate(model_steps(dump, optimizers), 1):
    for t, want in tables.items():
      got = dump[f"tables_{step}/{t}"]
      assert got.shape == want.shape, (t, got.shape)
      np.testing.assert_allclose(got, want, rtol=0, atol=1e-5,
                                 err_msg=f"table {t} after step {step} ({optimizers[t]})")
    np.testing.assert_allclose(dump[f"dense_{step}/kernel"], kernel, rtol=0, atol=1e-5,
                               err_msg=f"dense kernel after step {step}")
  # The tables moved: a step that changed nothing would pass the comparison.
  for t in TABLES:
    assert np.abs(dump[f"tables_{STEPS}/{t}"] - dump[f"tables_0/{t}"]).max() > 1e-3


# (replicas, optimizers of the tables item and user, placement, stacking);
# each a child process (~30 s on a loaded 2-core machine), so each covers
# several things.  Adam tells the placements apart: Keras's own Adam (the
# default-device path that placement="auto" took before the stand-in) also
# moves rows that a step does not touch, whose moments are not 0.
# The last: how the program trains (`model.fit` over a generator of
# preprocessed batches, or `train_on_batch`).
CASES = [
    (1, "sgd,adagrad", "sparsecore", "none", "train_on_batch"),
    (2, "adagrad", "auto", "all", "train_on_batch"),
    (2, "adam,ftrl", "auto", "none", "fit"),
]
# More replica counts by hand (a few minutes each on 2 cores, so not in the
# lane): TF_TPU_EMB_JAX_REPLICAS=4,8 adds, for each, the same cases at that
# count: SGD + Adagrad, Adagrad stacked with the checkpoint, Adam + FTRL.
CASES += [(int(r), opt, placement, stacking, driver)
          for r in os.environ.get("TF_TPU_EMB_JAX_REPLICAS", "").split(",") if r.strip()
          for _, opt, placement, stacking, driver in CASES[:3]]


@pytest.mark.parametrize("replicas,optimizer,placement,stacking,driver", CASES)
def test_keras_rs_trains_exactly(tmp_path, replicas, optimizer, placement, stacking, driver):
  extra = ["--fit"] if driver == "fit" else []
  if stacking == "all":  # and a checkpoint round trip (the example checks it)
    extra += ["--checkpoint", str(tmp_path)]
  stdout, _, dump = run_example(tmp_path, replicas, "--optimizer", optimizer,
                                "--placement", placement, "--stacking", stacking, *extra)
  check(dump, optimizer)
  # The layer's variables (the example prints Keras's `layer.weights`): one
  # stacked table of both tables, or one each.
  stacks = {"all": ["item_user"], "none": ["item", "user"]}[stacking]
  assert sorted(re.findall(r"/var:(\w+):table \(", stdout)) == stacks, stdout
  if stacking == "all":
    assert "checkpoint round trip: 2 tables equal, and after one more step" in stdout, stdout
