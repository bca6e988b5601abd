"""Malformed CSR buffers, gains, shapes and attributes given to the FFI
handlers: each is an InvalidArgument naming the argument (and index), never
a crash, and the process goes on working afterwards."""
import pytest

pytest.importorskip("jax_tpu_embedding")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import sc_programs  # noqa: E402
import tf_tpu_emb.jax as tj  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec  # noqa: E402

pytestmark = pytest.mark.jax

# What an FFI error becomes in Python: XLA's status as JaxRuntimeError; a call
# run eagerly (apply_primitive) may raise it as the ValueError that
# INVALID_ARGUMENT maps to.  The tests match the status and the text.
ERRORS = (jax.errors.JaxRuntimeError, ValueError)
PAD = 2**31 - 1
NUM_SC, SHARD_ROWS, DIM, BATCH = 2, 4, 3, 4   # 1 device, 2 SparseCores
SLICE = 24                                    # ids per SparseCore slice


def valid_buffers():
  """One device, 2 SparseCores, 2 shards of 4 rows, 2 samples a SparseCore:
  SparseCore 0 has shard 0's rows 1, 3 (samples 0, 1) and shard 1's row 0
  (sample 1); SparseCore 1 has shard 0's row 2 (sample 0) and shard 1's
  row 3 (samples 0 and 1)."""
  rp = np.array([2, 9, 16, 16, 16, 16, 16, 16,
                 1, 10, 16, 16, 16, 16, 16, 16], np.int32)
  ids = np.full(2 * SLICE, PAD, np.int32)
  samples = np.full(2 * SLICE, PAD, np.int32)
  gains = np.full(2 * SLICE, np.nan, np.float32)
  for pos, i, s, g in [(0, 1, 0, 1.0), (1, 3, 1, 0.5), (8, 0, 1, 2.0),
                       (SLICE + 0, 2, 0, 1.5), (SLICE + 8, 3, 0, -1.0),
                       (SLICE + 9, 3, 1, 0.25)]:
    ids[pos], samples[pos], gains[pos] = i, s, g
  return dict(rp=rp, ids=ids, samples=samples, gains=gains)


def table():
  return np.arange(NUM_SC * SHARD_ROWS * DIM, dtype=np.float32).reshape(-1, DIM)


def expected_activations():
  t = table()
  act = np.zeros((BATCH, DIM), np.float32)
  act[0] += 1.0 * t[1]
  act[1] += 0.5 * t[3]
  act[1] += 2.0 * t[4 + 0]
  act[2] += 1.5 * t[2]
  act[2] += -1.0 * t[4 + 3]
  act[3] += 0.25 * t[4 + 3]
  return act


def run_lookup(b, tbl=None, batch=BATCH, num_sc=NUM_SC, minibatches=None):
  tbl = table() if tbl is None else tbl
  call = jax.ffi.ffi_call(tj.LOOKUP_TARGET,
                          jax.ShapeDtypeStruct((batch, tbl.shape[1]), np.float32))
  nmb = np.array([1 if minibatches is None else minibatches], np.int32)
  return np.asarray(call(b["rp"], b["ids"], b["samples"], b["gains"], nmb, tbl,
                         num_sc_per_device=np.int64(num_sc), num_devices=np.int64(1),
                         minibatching=minibatches is not None))


def run_grad(b, variables, hypers, agrad=None, optimizer="sgd", offset=0, sources=1):
  agrad = np.ones((BATCH, DIM), np.float32) if agrad is None else agrad
  call = jax.ffi.ffi_call(tj.GRAD_TARGET,
                          [jax.ShapeDtypeStruct(v.shape, np.float32) for v in variables])
  return call(b["rp"], b["ids"], b["samples"], b["gains"], np.ones(sources, np.int32), agrad,
              np.int32(offset),
              *variables, *hypers, optimizer=optimizer, num_sc_per_device=np.int64(NUM_SC),
              num_devices=np.int64(1), sources=np.int64(sources), clip_min=False,
              min_value=np.float32(0), clip_max=False, max_value=np.float32(0),
              multiply_linear_by_lr=False, minibatching=False)


def run_row_grads(b, tbl=None, agrad=None, offset=0, capacity=None):
  """The custom optimizer's handler: (touched rows, count, their gradients)."""
  tbl = table() if tbl is None else tbl
  agrad = np.ones((BATCH, DIM), np.float32) if agrad is None else agrad
  capacity = tbl.shape[0] if capacity is None else capacity
  call = jax.ffi.ffi_call(tj.ROW_GRADS_TARGET,
                          [jax.ShapeDtypeStruct((capacity,), np.int32),
                           jax.ShapeDtypeStruct((1,), np.int32),
                           jax.ShapeDtypeStruct((capacity, tbl.shape[1]), np.float32)])
  outs = call(b["rp"], b["ids"], b["samples"], b["gains"], np.ones(1, np.int32), agrad,
              np.int32(offset), tbl, num_sc_per_device=np.int64(NUM_SC),
              num_devices=np.int64(1), sources=np.int64(1), minibatching=False)
  return [np.asarray(o) for o in outs]


def test_valid_buffers_give_the_hand_computed_activations_and_update():
  np.testing.assert_allclose(run_lookup(valid_buffers()), expected_activations(), rtol=1e-6)
  # SGD with activation gradients of 1: row r -= lr * (sum of its gains).
  (new,) = run_grad(valid_buffers(), [table()], [np.float32(0.5)])
  want = table()
  for row, gain_sum in [(1, 1.0), (3, 0.5), (4, 2.0), (2, 1.5), (7, -0.75)]:
    want[row] -= 0.5 * gain_sum
  np.testing.assert_allclose(np.asarray(new), want, rtol=1e-6)
  # The custom optimizer's rows: the same rows and gradients, in first-id order.
  rows, count, grads = run_row_grads(valid_buffers())
  touched = [1, 3, 4, 2, 7]
  assert count.tolist() == [5]
  assert sorted(rows[:5].tolist()) == sorted(touched) and (rows[5:] == -1).all()
  sums = dict([(1, 1.0), (3, 0.5), (4, 2.0), (2, 1.5), (7, -0.75)])
  np.testing.assert_allclose(grads[:5], [[sums[r]] * DIM for r in rows[:5]], rtol=1e-6)
  assert not grads[5:].any()
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT.*5 touched rows do not fit"):
    run_row_grads(valid_buffers(), capacity=4)


def _mutated(**changes):
  b = valid_buffers()
  for key, (index, value) in changes.items():
    b[key] = b[key].copy()
    b[key][index] = value
  return b


LOOKUP_CASES = {
    "id outside the shard": (_mutated(ids=(1, SHARD_ROWS)), r"lhs_local_embedding_ids\[1\] = 4"),
    "negative id": (_mutated(ids=(8, -1)), r"lhs_local_embedding_ids\[8\] = -1"),
    "pad id inside a segment": (_mutated(rp=(0, 3)), r"lhs_local_embedding_ids\[2\]"),
    "row pointers go backwards": (_mutated(rp=(9, 0)), r"lhs_row_pointers\[9\] = 0 goes backwards"),
    "row pointer past the slice": (_mutated(rp=(15, SLICE + 1)), r"lhs_row_pointers\[15\].*past"),
    "segment ends inside the alignment": (_mutated(rp=(1, 5)),
                                          r"lhs_row_pointers\[1\] = 5 ends inside"),
    "padding entry holds ids": (_mutated(rp=(2, 18)), r"lhs_row_pointers\[2\]: padding entry"),
    "sample outside the SparseCore": (_mutated(samples=(0, 2)), r"lhs_local_sample_ids\[0\] = 2"),
    "NaN gain inside a segment": (_mutated(gains=(0, np.nan)), r"lhs_gains\[0\] is nan"),
    "infinite gain": (_mutated(gains=(SLICE + 9, np.inf)), r"lhs_gains\[33\] is inf"),
}


@pytest.mark.parametrize("case", sorted(LOOKUP_CASES))
def test_malformed_buffers_are_invalid_argument(case):
  b, match = LOOKUP_CASES[case]
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT.*" + match):
    run_lookup(b)
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT.*" + match):
    run_grad(b, [table()], [np.float32(0.1)])
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT.*" + match):
    run_row_grads(b)
  # Nothing lost: the same process still runs valid calls.
  np.testing.assert_allclose(run_lookup(valid_buffers()), expected_activations(), rtol=1e-6)


def test_sizes_disagreeing_with_the_attributes():
  b = valid_buffers()
  short = dict(b, gains=b["gains"][:-1])
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: lhs_local_sample_ids.*lhs_gains.*differ"):
    run_lookup(short)
  odd_rp = dict(b, rp=b["rp"][:-1])
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: lhs_row_pointers: 15 entries"):
    run_lookup(odd_rp)
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: lhs_row_pointers: 2 entries per SparseCore"):
    run_lookup(b, batch=8, num_sc=8)  # 16 pointers / 8 SparseCores < 8 shards
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: device_batch_size: 5"):
    run_lookup(b, batch=5)


def test_wrong_table_shapes():
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: embedding_table: 7 rows"):
    run_lookup(valid_buffers(), tbl=table()[:7])
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: embedding_table: 7 rows"):
    run_grad(valid_buffers(), [table()[:7]], [np.float32(0.1)],
             agrad=np.ones((BATCH, DIM), np.float32))
  with pytest.raises(
      ERRORS, match="INVALID_ARGUMENT: lhs_local_embedding_ids.*outside the shard's 2 rows"):
    run_lookup(valid_buffers(), tbl=table()[:4])  # 2 rows a shard: id 3 is outside
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: activations_grad: width 2"):
    run_grad(valid_buffers(), [table()], [np.float32(0.1)], agrad=np.ones((BATCH, 2), np.float32))
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: activations_grad: 5 rows"):
    run_grad(valid_buffers(), [table()], [np.float32(0.1)], agrad=np.ones((5, DIM), np.float32))
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: slot variable 0: its shape differs"):
    run_grad(valid_buffers(), [table(), table()[:4]], [np.float32(0.1)], optimizer="adagrad")


def test_bad_attributes_and_operands():
  b = valid_buffers()
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: optimizer: 'rmsprop' is unknown"):
    run_grad(b, [table()], [np.float32(0.1)], optimizer="rmsprop")
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: optimizer adagrad: 2 table/slot"):
    run_grad(b, [table()], [np.float32(0.1)], optimizer="adagrad")
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: shard_offset: 1 is outside"):
    run_grad(b, [table()], [np.float32(0.1)], offset=1)
  with pytest.raises(ERRORS, match="INVALID_ARGUMENT: hyper-parameter 0 .learning_rate."):
    run_grad(b, [table()], [np.ones(2, np.float32)])


def test_corrupt_preprocessed_input_through_the_package():
  """A program whose preprocessed buffers were damaged after the fact gets
  the handler's error through jax-tpu-embedding's jitted lookup and update."""
  rng = np.random.default_rng(0)
  prog = sc_programs.Program(2, 2, 64, 8, embedding_spec.SGDOptimizerSpec(learning_rate=0.1), 32)
  ids, weights = sc_programs.ragged(rng, 32, 64)
  inputs = prog.preprocess({"f0": ids}, {"f0": weights})
  embedding_ids = inputs.sparse_dense_matmul_input.lhs_embedding_ids[prog.stack]
  embedding_ids[0] = 10**6  # the first id of device 0's SparseCore 0
  variables = prog.variables(np.zeros((64, 8), np.float32))
  with pytest.raises(ERRORS,
                     match=r"INVALID_ARGUMENT.*lhs_local_embedding_ids\[0\] = 1000000"):
    np.asarray(prog.lookup(inputs, variables)["f0"])
  with pytest.raises(ERRORS,
                     match=r"INVALID_ARGUMENT.*lhs_local_embedding_ids\[0\] = 1000000"):
    updated = prog.update({"f0": np.ones((32, 8), np.float32)}, inputs, variables)
    np.asarray(updated[prog.stack].table)


def test_row_pointers_of_another_mesh_are_refused_at_lowering():
  with pytest.raises(ValueError, match="lhs_row_pointers: 12 entries a device"):
    tj._num_sc_per_device(12, 1)
  assert tj._num_sc_per_device(16, 1) == 2 and tj._num_sc_per_device(64, 4) == 4
  assert tj._num_sc_per_device(128, 8) == 4 and tj._num_sc_per_device(32, 8) == 2


def test_minibatch_count_outside_the_buffer():
  """With minibatching the groups run SparseCore-major, M a SparseCore; the
  16 row pointers of valid_buffers() hold M = 1 for 2 SparseCores (and read
  as one buffer they are valid: pointers run on from SparseCore 0's group)."""
  b = valid_buffers()
  b["rp"] = np.array([2, 9, 16, 16, 16, 16, 16, 16,
                      16 + 1, 16 + 10, 32, 32, 32, 32, 32, 32], np.int32)
  b2 = {k: v.copy() for k, v in b.items()}
  for key in ("ids", "samples", "gains"):  # SparseCore 1's ids from position 16
    b2[key][16:SLICE] = b[key][SLICE:SLICE + 8]
    b2[key][24:32] = b[key][SLICE + 8:SLICE + 16]
  np.testing.assert_allclose(run_lookup(b2, minibatches=1), expected_activations(), rtol=1e-6)
  for bad in (0, 2, -1):
    with pytest.raises(ERRORS, match=r"INVALID_ARGUMENT: num_minibatches_per_physical_sparse_core: "
                       + str(bad)):
      run_lookup(b2, minibatches=bad)
