"""The gradient + update primitives (sparse_dense_matmul_grad_with_sgd,
..._with_adagrad) on CPU devices, through jax-tpu-embedding's
`tpu_sparse_dense_matmul_grad` under jax.jit + jax.shard_map: table and slots
after each of several steps exact against the numpy model."""
import pytest

pytest.importorskip("jax_tpu_embedding")

import numpy as np  # noqa: E402

import numpy_model  # noqa: E402
import sc_programs  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec  # noqa: E402

pytestmark = pytest.mark.jax

LR = 0.05
CASES = [(1, 2), (1, 4), (2, 2), (4, 2), (2, 4), (8, 2)]


def _steps(prog, optimizer, rng, steps, combiner, init_acc=None):
  vocab, dim, batch = prog.vocab, prog.dim, prog.batch
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  acc = None if init_acc is None else np.full((vocab, dim), init_acc, np.float32)
  if optimizer == "sgd":
    variables = prog.variables(table)
  else:
    variables = prog.variables(table, acc, slot_type=embedding_spec.AdagradSlotVariables)
  want_table, want_acc = table.astype(np.float64), acc
  for step in range(steps):
    ids, weights = sc_programs.ragged(rng, batch, vocab)
    grads = rng.normal(size=(batch, dim)).astype(np.float32)
    inputs = prog.preprocess({"f0": ids}, {"f0": weights})
    variables = prog.update({"f0": grads}, inputs, variables)
    grad, touched = numpy_model.row_gradients((vocab, dim), ids, weights, combiner, grads)
    assert not touched.all(), "the batch must leave rows untouched (laziness is checked)"
    if optimizer == "sgd":
      want_table = numpy_model.sgd(want_table, grad, touched, LR, prog.limits)
    else:
      want_table, want_acc = numpy_model.adagrad(want_table, want_acc, grad, touched, LR,
                                                 prog.limits)
    var = variables[prog.stack]
    np.testing.assert_allclose(prog.unshard(var.table), want_table, rtol=1e-5, atol=1e-6,
                               err_msg=f"table after step {step}")
    if optimizer == "adagrad":
      np.testing.assert_allclose(prog.unshard(var.slot.accumulator), want_acc, rtol=1e-5,
                                 atol=1e-6, err_msg=f"accumulator after step {step}")


@pytest.mark.parametrize("devices,num_sc", CASES)
def test_sgd_steps_match_numpy(devices, num_sc):
  rng = np.random.default_rng(devices * 10 + num_sc)
  prog = sc_programs.Program(devices, num_sc, 256, 8,
                             embedding_spec.SGDOptimizerSpec(learning_rate=LR),
                             8 * devices * num_sc)
  _steps(prog, "sgd", rng, steps=3, combiner="sum")


@pytest.mark.parametrize("devices,num_sc", CASES)
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_adagrad_steps_match_numpy(devices, num_sc, combiner):
  rng = np.random.default_rng(devices * 10 + num_sc + 1)
  prog = sc_programs.Program(
      devices, num_sc, 256, 8,
      embedding_spec.AdagradOptimizerSpec(learning_rate=LR, initial_accumulator_value=0.1),
      8 * devices * num_sc, combiner=combiner)
  _steps(prog, "adagrad", rng, steps=3, combiner=combiner, init_acc=0.1)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_update_clips_to_embedding_var_limits(optimizer):
  """embedding_var_limits: the updated rows are clamped to [min, max]."""
  rng = np.random.default_rng(3)
  spec = (embedding_spec.SGDOptimizerSpec(learning_rate=LR) if optimizer == "sgd" else
          embedding_spec.AdagradOptimizerSpec(learning_rate=LR, initial_accumulator_value=0.1))
  prog = sc_programs.Program(2, 2, 256, 8, spec, 32, limits=(-0.5, 0.5))
  _steps(prog, optimizer, rng, steps=2, combiner="sum",
         init_acc=None if optimizer == "sgd" else 0.1)
