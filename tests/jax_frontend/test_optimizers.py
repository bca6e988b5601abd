"""The gradient + update primitives of Adam, FTRL, AdagradMomentum, LaProp
and F2A on CPU devices, through jax-tpu-embedding's
`tpu_sparse_dense_matmul_grad` (with the step, as a training loop passes it)
under jax.jit + jax.shard_map: table and both slots after each of several
steps against the numpy model (tests/jax_frontend/numpy_model.py)."""

import zlib

import pytest

pytest.importorskip("jax_tpu_embedding")

import numpy as np  # noqa: E402

import numpy_model as nm  # noqa: E402
import sc_programs  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es  # noqa: E402

pytestmark = pytest.mark.jax

LR = 0.05


def _case(name):
  """(spec, slot class, slot field names, initial slot values, model(w, slots, g, step))."""
  if name == "adam":
    return (es.AdamOptimizerSpec(learning_rate=LR, beta_1=0.8, beta_2=0.95, epsilon=1e-3),
            es.AdamSlotVariables, (0.0, 0.0),
            lambda w, s, g, t: nm.adam(w, s, g, nm.adam_hyper(LR, 0.8, 0.95, 1e-3, t)))
  if name.startswith("ftrl"):
    mult = name == "ftrl_mult"
    spec = es.FTRLOptimizerSpec(learning_rate=LR, learning_rate_power=-0.5,
                                l1_regularization_strength=0.01,
                                l2_regularization_strength=0.02, beta=0.1,
                                initial_accumulator_value=0.1,
                                multiply_linear_by_learning_rate=mult)
    return (spec, es.FTRLSlotVariables, (0.1, 0.0),
            lambda w, s, g, t: nm.ftrl(w, s, g, (LR, -0.5, 0.01, 0.02, 0.1), mult))
  if name.startswith("adagrad_momentum"):
    nesterov = name.endswith("nesterov")
    spec = es.AdagradMomentumOptimizerSpec(learning_rate=LR, momentum=0.9, beta2=0.99,
                                           epsilon=1e-6, exponent=2.0, use_nesterov=nesterov,
                                           initial_accumulator_value=0.1)
    return (spec, es.AdagradMomentumSlotVariables, (0.1, 0.0),
            lambda w, s, g, t: nm.adagrad_momentum(w, s, g,
                                                   (LR, 0.9, 0.99, 1e-6, 2.0, nesterov)))
  if name == "laprop":
    spec = es.LaPropOptimizerSpec(learning_rate=LR, b1=0.9, b2=0.95, eps=1e-8)
    return (spec, es.LaPropSlotVariables, (0.0, 0.0),
            lambda w, s, g, t: nm.laprop(w, s, g, (LR, 0.9, nm.laprop_decay(0.95, t), 1e-8)))
  if name == "f2a":
    spec = es.F2AOptimizerSpec(learning_rate=LR, rho=0.5, initial_accumulator_value=0.1,
                               l1_regularization_strength=0.001,
                               l2_regularization_strength=0.002, max_lr_multiplier=3.0)
    return (spec, es.F2ASlotVariables, (0.1, 0.0),
            lambda w, s, g, t: nm.f2a(w, s, g, (LR, 0.5, 0.001, 0.002, 3.0, float(t))))
  raise ValueError(name)


OPTIMIZERS = ["adam", "ftrl", "ftrl_mult", "adagrad_momentum", "adagrad_momentum_nesterov",
              "laprop", "f2a"]


@pytest.mark.parametrize("devices,num_sc", [(1, 2), (2, 2), (4, 2)])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizer_steps_match_numpy(name, devices, num_sc):
  spec, slot_type, slot_init, model = _case(name)
  rng = np.random.default_rng(zlib.crc32(name.encode()) % 1000 + devices)
  vocab, dim, batch = 128, 8, 8 * devices * num_sc
  prog = sc_programs.Program(devices, num_sc, vocab, dim, spec, batch)
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  slots = [np.full((vocab, dim), v, np.float32) for v in slot_init]
  variables = prog.variables(table, *slots, slot_type=slot_type)
  want_w = table.astype(np.float64)
  want_s = [s.astype(np.float64) for s in slots]
  for step in range(3):
    ids, weights = sc_programs.ragged(rng, batch, vocab)
    grads = rng.normal(size=(batch, dim)).astype(np.float32)
    variables = prog.update({"f0": grads}, prog.preprocess({"f0": ids}, {"f0": weights}),
                            variables, step)
    grad, touched = nm.row_gradients((vocab, dim), ids, weights, "sum", grads)
    w_new, s_new = model(want_w[touched], [s[touched] for s in want_s], grad[touched], step)
    want_w[touched] = w_new
    for s, new in zip(want_s, s_new):
      s[touched] = new
    var = variables[prog.stack]
    np.testing.assert_allclose(prog.unshard(var.table), want_w, rtol=2e-5, atol=2e-6,
                               err_msg=f"{name}: table after step {step}")
    for field, want in zip(slot_type._fields, want_s):
      np.testing.assert_allclose(prog.unshard(getattr(var.slot, field)), want, rtol=2e-5,
                                 atol=2e-6, err_msg=f"{name}: {field} after step {step}")
