"""One table, two front ends: a table trained by a jax-tpu-embedding program
loads into TF's TPUEmbeddingV2 on the stand-in and comes back, the same
logical table.

The JAX program (2 devices x 2 SparseCores, Adagrad) trains two steps and
writes its table and accumulator in the per-table form
(tf_tpu_emb.jax.tables.logical_tables -> tf_tpu_emb.table_exchange); a TPU
program with TF's TPUEmbeddingV2 (tf_v2_round_trip.py, run by the TensorFlow
venv's Python under `python -m tf_tpu_emb.run --embedding v2 --replicas 2`:
another sharding, 2 chips of the stand-in's SparseCores, TF's own stacking
and padding) loads them (sparsecore_checkpoint.load_into), reads them back
(tables_of) and trains one step; the JAX program loads what TF wrote
(tables.stacked_variables) and takes the same step.  Checked: every value
bit for bit after each crossing, both ways; the step's activations and the
tables after it equal across the front ends (float32 sums, 1e-6).

Needs both venvs: `make test-jax` sets TF_TPU_EMB_TF_PYTHON to .venv's
Python (built with the op library); elsewhere the test skips."""
import json
import os
import subprocess

import pytest

pytest.importorskip("jax_tpu_embedding")

import numpy as np  # noqa: E402

import sc_programs  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es  # noqa: E402
from tf_tpu_emb import table_exchange  # noqa: E402
from tf_tpu_emb.jax import tables as jax_tables  # noqa: E402

pytestmark = [pytest.mark.jax, pytest.mark.system]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TF_PYTHON = os.environ.get("TF_TPU_EMB_TF_PYTHON")
LR, INITIAL = 0.05, 0.1
DEVICES, NUM_SC, VOCAB, DIM, BATCH = 2, 2, 256, 8, 16


def bits_equal(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def assert_same_tables(got, want, what):
  assert sorted(got) == sorted(want), what
  for table in want:
    assert sorted(got[table]) == sorted(want[table]), (what, table)
    for state in want[table]:
      assert bits_equal(got[table][state], want[table][state]), (what, table, state)


@pytest.mark.skipif(not TF_PYTHON, reason="needs the TensorFlow venv's Python in "
                    "TF_TPU_EMB_TF_PYTHON (`make test-jax` sets it)")
def test_jax_table_through_tpu_embedding_v2_and_back(tmp_path):
  rng = np.random.default_rng(38)
  spec = es.AdagradOptimizerSpec(learning_rate=LR, initial_accumulator_value=INITIAL)
  prog = sc_programs.Program(DEVICES, NUM_SC, VOCAB, DIM, spec, BATCH)
  specs = embedding.get_table_specs(prog.feature_specs)
  shards = DEVICES * NUM_SC
  table = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
  variables = prog.variables(table, np.full((VOCAB, DIM), INITIAL, np.float32),
                             slot_type=es.AdagradSlotVariables)
  for _ in range(2):
    ids, weights = sc_programs.ragged(rng, BATCH, VOCAB)
    grads = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    variables = prog.update({"f0": grads}, prog.preprocess({"f0": ids}, {"f0": weights}),
                            variables)

  # JAX -> the per-table form: the package's own unsharding agrees.
  trained = jax_tables.logical_tables(specs, variables, shards)
  assert sorted(trained["table"]) == ["accumulators", "parameters"]
  var = variables[prog.stack]
  assert bits_equal(trained["table"]["parameters"], prog.unshard(var.table))
  assert bits_equal(trained["table"]["accumulators"], prog.unshard(var.slot.accumulator))
  assert not bits_equal(trained["table"]["parameters"], table)  # it trained
  in_path = table_exchange.save(str(tmp_path / "jax_trained"), trained)

  # The next step, for both front ends.
  ids, weights = sc_programs.ragged(rng, BATCH, VOCAB)
  grads = rng.normal(size=(BATCH, DIM)).astype(np.float32)
  step = {"table": "table", "vocab": VOCAB, "dim": DIM, "learning_rate": LR,
          "initial": INITIAL, "lengths": [len(x) for x in ids],
          "ids": np.concatenate(ids).tolist(),
          "weights": np.concatenate(weights).astype(float).tolist(),
          "grads": grads.astype(float).tolist()}
  step_path = tmp_path / "step.json"
  step_path.write_text(json.dumps(step))
  out = tmp_path / "tf"
  out.mkdir()
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  for key in ("XLA_FLAGS", "JAX_PLATFORMS", "KERAS_BACKEND"):
    env.pop(key, None)
  proc = subprocess.run(
      [TF_PYTHON, "-m", "tf_tpu_emb.run", "--embedding", "v2", "--replicas", "2",
       os.path.join(HERE, "tf_v2_round_trip.py"), in_path, str(step_path), str(out)],
      capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]

  # JAX -> TPUEmbeddingV2 -> the per-table form: bit for bit.
  loaded = table_exchange.load(str(out / "loaded.npz"))
  assert_same_tables(loaded, trained, "read back out of TPUEmbeddingV2")

  # ... -> JAX's stacked, sharded variables -> the per-table form: bit for bit.
  back = jax_tables.stacked_variables(specs, loaded, shards, prog.sharding)
  assert_same_tables(jax_tables.logical_tables(specs, back, shards), trained,
                     "JAX variables from TF's tables")

  # The same step on both sides: the same lookup, the same update.
  inputs = prog.preprocess({"f0": ids}, {"f0": weights})
  jax_acts = np.asarray(prog.lookup(inputs, back)["f0"])[:, :DIM]
  tf_acts = np.array(json.loads((out / "step.json").read_text())["activations"], np.float32)
  np.testing.assert_allclose(tf_acts, jax_acts, rtol=1e-6, atol=1e-6)
  after_jax = jax_tables.logical_tables(specs, prog.update({"f0": grads}, inputs, back), shards)
  after_tf = table_exchange.load(str(out / "trained.npz"))
  for state in ("parameters", "accumulators"):
    np.testing.assert_allclose(after_tf["table"][state], after_jax["table"][state],
                               rtol=1e-6, atol=1e-6, err_msg=state)
  # TF's trained table back into JAX: bit for bit again.
  assert_same_tables(jax_tables.logical_tables(
      specs, jax_tables.stacked_variables(specs, after_tf, shards, prog.sharding), shards),
      after_tf, "JAX variables from TF's trained tables")


def test_exchange_file_refuses_what_is_not_a_table(tmp_path):
  ok = {"t": {"parameters": np.zeros((4, 2), np.float32)}}
  table_exchange.save(str(tmp_path / "ok"), ok)
  assert_same_tables(table_exchange.load(str(tmp_path / "ok.npz")), ok, "plain")
  with pytest.raises(ValueError, match="'t' has no 'parameters'"):
    table_exchange.save(str(tmp_path / "x"), {"t": {"accumulators": ok["t"]["parameters"]}})
  with pytest.raises(ValueError, match="state 'accumulators'.*float64"):
    table_exchange.save(str(tmp_path / "x"), {"t": {
        "parameters": ok["t"]["parameters"], "accumulators": np.zeros((4, 2))}})
  with pytest.raises(ValueError, match="TensorFlow's TPU embedding has no such optimizer"):
    jax_tables.tf_state_names(es.LaPropOptimizerSpec())
  assert jax_tables.tf_state_names(es.AdamOptimizerSpec()) == (
      "parameters", "momenta", "velocities")
  assert jax_tables.tf_state_names(es.FTRLOptimizerSpec()) == (
      "parameters", "accumulators", "linears")
