"""The gradient-stack and activation-unstack primitives
(use_gradient_stacking_primitive / use_activation_unstack_primitive): with
install(num_sc_per_device=2), three features on one table of width 5 (padded
to 8) give the activations and the update of the numpy model, at 1, 2 and 4
devices."""
import pytest

pytest.importorskip("jax_tpu_embedding")

import numpy as np  # noqa: E402

import numpy_model as nm  # noqa: E402
import sc_programs  # noqa: E402
import tf_tpu_emb.jax as tj  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es  # noqa: E402

pytestmark = pytest.mark.jax

NUM_SC, LR = 2, 0.05


@pytest.fixture(scope="module", autouse=True)
def _stacking_rules():
  tj.install(num_sc_per_device=NUM_SC)


@pytest.mark.parametrize("devices", [1, 2, 4])
def test_stacking_primitives_match_numpy(devices):
  rng = np.random.default_rng(devices)
  vocab, dim, batch = 128, 5, 8 * devices * NUM_SC
  prog = sc_programs.Program(devices, NUM_SC, vocab, dim, es.SGDOptimizerSpec(learning_rate=LR),
                             batch, features=3, stacking_primitives=True)
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  variables = prog.variables(table)
  ids, weights, grads = {}, {}, {}
  for f in prog.feature_specs:
    ids[f], weights[f] = sc_programs.ragged(rng, batch, vocab)
    grads[f] = rng.normal(size=(batch, dim)).astype(np.float32)
  inputs = prog.preprocess(ids, weights)
  act = prog.lookup(inputs, variables)
  for f in prog.feature_specs:
    np.testing.assert_allclose(np.asarray(act[f]), nm.lookup(table, ids[f], weights[f], "sum"),
                               rtol=1e-5, atol=1e-5, err_msg=f)
  new = prog.update(grads, inputs, variables)[prog.stack]
  grad = np.zeros((vocab, dim))
  touched = np.zeros(vocab, bool)
  for f in prog.feature_specs:
    g, t = nm.row_gradients((vocab, dim), ids[f], weights[f], "sum", grads[f])
    grad += g
    touched |= t
  np.testing.assert_allclose(prog.unshard(new.table), nm.sgd(table, grad, touched, LR),
                             rtol=1e-5, atol=1e-6)


def test_install_refuses_another_sparsecore_count():
  with pytest.raises(ValueError, match="already installed with 2"):
    tj.install(num_sc_per_device=4)
