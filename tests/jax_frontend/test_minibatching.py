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


def test_minibatch_buffers_of_the_python_model():
  """The package's Python preprocessing model
  (input_preprocessing.preprocess_sparse_dense_matmul_input) sizes the row
  pointers for the step's M minibatches, not for 64: M * S * RoundUp(S, 8)
  entries a device, which fit several SparseCore counts (16 entries: S = 2,
  M = 1 or S = 1, M = 2).  With install(num_sc_per_device=2) the rules read
  them as 2 SparseCores; lookup and SGD update match the numpy model."""
  import jax
  from jax_tpu_embedding.sparsecore.lib.core import input_preprocessing
  from jax_tpu_embedding.sparsecore.lib.core.primitives import sparse_dense_matmul_csr as csr
  from jax_tpu_embedding.sparsecore.lib.core.primitives import (
      sparse_dense_matmul_grad_with_sgd as sgd)
  from jax_tpu_embedding.sparsecore.utils import utils

  import tf_tpu_emb.jax as tj
  num_sc, vocab, dim, batch = 2, 32, 8, 16
  tj.install(num_sc_per_device=num_sc)
  rng = np.random.default_rng(7)
  ids, weights = sc_programs.ragged(rng, batch, vocab, max_len=4)
  mb_ids, mb_weights = [[], []], [[], []]  # each sample's ids split over 2 minibatches
  for i, w in zip(ids, weights):
    cut = int(rng.integers(0, len(i) + 1))
    for m, part in enumerate((slice(0, cut), slice(cut, None))):
      mb_ids[m].append([int(x) for x in i[part]])
      mb_weights[m].append([float(x) for x in w[part]])
  for minibatches, feats, ws in ((1, [list(map(list, ids))], [list(map(list, weights))]),
                                 (2, mb_ids, mb_weights)):
    rp, eids, sids, gains = input_preprocessing.preprocess_sparse_dense_matmul_input(
        [np.array(f, dtype=object) for f in feats], [np.array(w, dtype=object) for w in ws],
        sc_programs.mesh(1), max_ids_per_partition=64, max_unique_ids_per_partition=64,
        num_sc_per_device=num_sc, enable_minibatching=True)
    assert np.asarray(rp).shape == (minibatches * num_sc * 8,)
    table = rng.normal(size=(vocab, dim)).astype(np.float32)
    shard = utils.shard_emb_table(table, num_devices=1, num_sc_per_device=num_sc)[0]
    common = dict(max_ids_per_partition=64, max_unique_ids_per_partition=64,
                  sharding_strategy=1, enable_minibatching=True)
    act = jax.jit(lambda *a: csr.tpu_sparse_dense_matmul_csr_primitive.bind(
        *a, device_batch_size=batch, **common))(rp, eids, sids, gains, np.int32(minibatches),
                                                shard)
    np.testing.assert_allclose(np.asarray(act), nm.lookup(table, ids, weights, "sum"),
                               rtol=1e-5, atol=1e-5)
    grads = rng.normal(size=(batch, dim)).astype(np.float32)
    new = jax.jit(lambda *a: sgd.tpu_sparse_dense_matmul_grad_with_sgd_primitive.bind(
        *a, **common))(rp, eids, sids, gains, np.int32(minibatches), shard, grads,
                       np.float32(LR))
    grad, touched = nm.row_gradients((vocab, dim), ids, weights, "sum", grads)
    np.testing.assert_allclose(utils.unshard_emb_table(np.asarray(new)[None], num_sc),
                               nm.sgd(table, grad, touched, LR), rtol=1e-5, atol=1e-6)


def test_minibatch_row_pointers_of_several_sparsecore_counts(monkeypatch):
  """With minibatching a row-pointer size may fit several SparseCore counts:
  the one of install(num_sc_per_device=...) is taken, else the one with
  room for 64 minibatches (the C++ preprocessing's), else the only one;
  otherwise the lowering refuses, naming the counts."""
  import tf_tpu_emb.jax as tj
  monkeypatch.setattr(tj, "_num_sc_for_stacking", None)
  assert tj._num_sc_per_device(64 * 2 * 8, 1, minibatching=True) == 2
  assert tj._num_sc_per_device(64 * 4 * 8, 2, minibatching=True) == 4
  with pytest.raises(ValueError, match=r"16 entries a device fit 2 SparseCore counts \(\[1, 2\]\)"):
    tj._num_sc_per_device(16, 1, minibatching=True)
  monkeypatch.setattr(tj, "_num_sc_for_stacking", 2)
  assert tj._num_sc_per_device(16, 1, minibatching=True) == 2
  assert tj._num_sc_per_device(3 * 2 * 8, 1, minibatching=True) == 2
  monkeypatch.setattr(tj, "_num_sc_for_stacking", 4)  # 48 entries: 4 SparseCores do not fit
  with pytest.raises(ValueError, match=r"48 entries a device fit 4 SparseCore counts"):
    tj._num_sc_per_device(48, 1, minibatching=True)
  assert tj._num_sc_per_device(48, 1, minibatching=False) == 6
