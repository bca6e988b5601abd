"""The lookup primitive (sparse_dense_matmul_csr) on CPU devices, through
jax-tpu-embedding's own preprocessing and `tpu_sparse_dense_matmul` under
jax.jit + jax.shard_map, exact against the numpy model."""
import pytest

pytest.importorskip("jax_tpu_embedding")

import numpy as np  # noqa: E402

import numpy_model  # noqa: E402
import sc_programs  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec  # noqa: E402

pytestmark = pytest.mark.jax


@pytest.mark.parametrize("devices,num_sc", [(1, 2), (1, 4), (2, 2), (2, 4), (4, 2), (4, 4), (8, 2)])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_lookup_matches_numpy(devices, num_sc, combiner):
  rng = np.random.default_rng(devices * 100 + num_sc)
  batch, vocab, dim = 8 * devices * num_sc, 128, 8
  prog = sc_programs.Program(devices, num_sc, vocab, dim,
                             embedding_spec.SGDOptimizerSpec(learning_rate=0.1),
                             batch, combiner=combiner)
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  ids, weights = sc_programs.ragged(rng, batch, vocab)
  inputs = prog.preprocess({"f0": ids}, {"f0": weights})
  act = prog.lookup(inputs, prog.variables(table))
  np.testing.assert_allclose(np.asarray(act["f0"]),
                             numpy_model.lookup(table, ids, weights, combiner),
                             rtol=1e-5, atol=1e-5)


def test_lookup_two_features_repeated_ids_padded_width():
  """Two features on one table (both in one stacked buffer), samples that
  repeat an id (merged by the preprocessing), a width of 5 padded to 8."""
  rng = np.random.default_rng(7)
  devices, num_sc, batch, vocab, dim = 2, 2, 32, 64, 5
  prog = sc_programs.Program(devices, num_sc, vocab, dim,
                             embedding_spec.SGDOptimizerSpec(learning_rate=0.1),
                             batch, features=2)
  assert prog.padded_dim == 8
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  ids0, w0 = sc_programs.ragged(rng, batch, vocab)
  ids1, w1 = sc_programs.ragged(rng, batch, 4)  # few distinct ids: repeats
  act = prog.lookup(prog.preprocess({"f0": ids0, "f1": ids1}, {"f0": w0, "f1": w1}),
                    prog.variables(table))
  for name, ids, w in (("f0", ids0, w0), ("f1", ids1, w1)):
    np.testing.assert_allclose(np.asarray(act[name]), numpy_model.lookup(table, ids, w, "sum"),
                               rtol=1e-5, atol=1e-5)
