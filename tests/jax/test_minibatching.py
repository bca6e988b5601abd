"""Minibatching (enable_minibatching=True: the preprocessing cuts a device's
ids into up to 64 minibatches when a partition holds more than
max_ids_per_partition): the lookup and the SGD/Adagrad updates through the
package's minibatching path, exact against the numpy model."""
import pytest

pytest.importorskip("jax_tpu_embedding")

import numpy as np  # noqa: E402

import numpy_model as nm  # noqa: E402
import sc_programs  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es  # noqa: E402

pytestmark = pytest.mark.jax

LR = 0.05


@pytest.mark.parametrize("devices,num_sc", [(1, 2), (2, 2), (2, 4), (4, 2)])
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_minibatched_lookup_and_update_match_numpy(devices, num_sc, optimizer):
  rng = np.random.default_rng(devices * 10 + num_sc)
  vocab, dim, batch = 256, 8, 16 * devices * num_sc
  spec = (es.SGDOptimizerSpec(learning_rate=LR) if optimizer == "sgd" else
          es.AdagradOptimizerSpec(learning_rate=LR, initial_accumulator_value=0.1))
  prog = sc_programs.Program(devices, num_sc, vocab, dim, spec, batch, minibatching=True,
                             max_ids_per_partition=8)
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  acc = np.full((vocab, dim), 0.1, np.float32)
  if optimizer == "sgd":
    variables = prog.variables(table)
  else:
    variables = prog.variables(table, acc, slot_type=es.AdagradSlotVariables)
  ids, weights = sc_programs.ragged(rng, batch, vocab, max_len=6)
  inputs = prog.preprocess({"f0": ids}, {"f0": weights})
  assert np.all(np.asarray(inputs.num_minibatches) > 1), inputs.num_minibatches
  act = prog.lookup(inputs, variables)
  np.testing.assert_allclose(np.asarray(act["f0"]), nm.lookup(table, ids, weights, "sum"),
                             rtol=1e-5, atol=1e-5)
  grads = rng.normal(size=(batch, dim)).astype(np.float32)
  new = prog.update({"f0": grads}, inputs, variables)[prog.stack]
  grad, touched = nm.row_gradients((vocab, dim), ids, weights, "sum", grads)
  if optimizer == "sgd":
    want = nm.sgd(table, grad, touched, LR)
  else:
    want, want_acc = nm.adagrad(table, acc, grad, touched, LR)
    np.testing.assert_allclose(prog.unshard(new.slot.accumulator), want_acc, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(prog.unshard(new.table), want, rtol=1e-5, atol=1e-6)
