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


def _reorder_segments(prog, inputs, how):
  """The CSR buffers with each segment's ids reordered (no minibatching):
  "reverse" (rows descending: a run an id, past the sorted-run walk's limit,
  so the handler takes its general path) or "swap" (each segment's first
  two ids swapped: a few more runs, still the sorted-run walk).  A row's
  ids stay in their segment, so the gradient is the same sum."""
  rp = np.asarray(inputs.lhs_row_pointers[prog.stack])
  arrays = [np.array(getattr(inputs, f)[prog.stack])
            for f in ("lhs_embedding_ids", "lhs_sample_ids", "lhs_gains")]
  parts = prog.devices * prog.num_sc
  group, slice_ = len(rp) // parts, len(arrays[0]) // parts
  for part in range(parts):
    prev = 0
    for j in range(group):
      end = int(rp[part * group + j])
      start = -(-prev // 8) * 8
      prev = end
      if end - start < 2:
        continue
      lo, hi = part * slice_ + start, part * slice_ + end
      order = np.arange(lo, hi)
      if how == "reverse":
        order = order[::-1]
      else:
        order[[0, 1]] = order[[1, 0]]
      for a in arrays:
        a[lo:hi] = a[order]
  csr = inputs.sparse_dense_matmul_input._replace(**{f: {prog.stack: a} for f, a in zip(
      ("lhs_embedding_ids", "lhs_sample_ids", "lhs_gains"), arrays)})
  return inputs.replace(sparse_dense_matmul_input=csr)


def _steps(prog, optimizer, rng, steps, combiner, init_acc=None, reorder=None):
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
    if reorder:
      inputs = _reorder_segments(prog, inputs, reorder)
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


@pytest.mark.parametrize("how", ["reverse", "swap"])
@pytest.mark.parametrize("devices,num_sc", [(1, 4), (2, 2)])
def test_unsorted_segments_take_either_path_exactly(devices, num_sc, how):
  """The handler sums and updates in one pass over sorted runs of ids
  (core/row_runs.h) and keeps a general path for buffers that are not so
  sorted: both give the numpy model's tables."""
  rng = np.random.default_rng(devices * 100 + num_sc + len(how))
  prog = sc_programs.Program(
      devices, num_sc, 256, 8,
      embedding_spec.AdagradOptimizerSpec(learning_rate=LR, initial_accumulator_value=0.1),
      64 * devices * num_sc)
  _steps(prog, "adagrad", rng, steps=2, combiner="sum", init_acc=0.1, reorder=how)
