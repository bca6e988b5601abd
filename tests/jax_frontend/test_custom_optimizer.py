"""The custom-optimizer primitive (sparse_dense_matmul_optimizer_grad) on CPU
devices: jax-tpu-embedding's `CustomOptimizerSpec`, its update given as a
JAX function (traced to StableHLO by the package) or as StableHLO text (the
form of the package's optimizers_computation), through
`tpu_sparse_dense_matmul_grad` under jax.jit + jax.shard_map at 1, 2 and 4
devices: table and slots after several steps against the numpy model, in
which the same update is written in numpy."""
import pytest

pytest.importorskip("jax_tpu_embedding")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import numpy_model as nm  # noqa: E402
import sc_programs  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es  # noqa: E402

pytestmark = pytest.mark.jax

LR = 0.05
MOMENTUM = 0.9


def heavy_ball(grad, table, velocity, lr):
  """A momentum optimizer the package does not have, as a user writes it:
  [1, width] operands (gradient, table row, slot row, learning rate)."""
  velocity = MOMENTUM * velocity + grad
  return table - lr * velocity, velocity


def heavy_ball_numpy(w, v, g, lr):
  v = MOMENTUM * v + g
  return w - lr * v, v


def sign_sgd(grad, table, lr):
  """No slot; one result (not a tuple); a reduction over the row."""
  return table - lr * jnp.sign(grad) * jnp.mean(jnp.abs(grad))


def sign_sgd_numpy(w, g, lr):
  return w - lr * np.sign(g) * np.abs(g).mean(axis=-1, keepdims=True)


def _run(prog, rng, steps, slots_init, numpy_update, limits=None):
  vocab, dim, batch = prog.vocab, prog.dim, prog.batch
  table = rng.normal(size=(vocab, dim)).astype(np.float32)
  slots = [np.full((vocab, dim), v, np.float32) for v in slots_init]
  variables = prog.variables(table, *slots, slot_type=(lambda *s: tuple(s)) if slots else None)
  want_w = table.astype(np.float64)
  want_s = [s.astype(np.float64) for s in slots]
  for step in range(steps):
    ids, weights = sc_programs.ragged(rng, batch, vocab)
    grads = rng.normal(size=(batch, dim)).astype(np.float32)
    variables = prog.update({"f0": grads}, prog.preprocess({"f0": ids}, {"f0": weights}),
                            variables, step)
    grad, touched = nm.row_gradients((vocab, dim), ids, weights, "sum", grads)
    assert not touched.all()
    new = numpy_update(want_w[touched], *[s[touched] for s in want_s], grad[touched], LR)
    new = new if isinstance(new, tuple) else (new,)
    want_w[touched] = nm.clip(new[0], limits)
    for s, value in zip(want_s, new[1:]):
      s[touched] = value
    var = variables[prog.stack]
    np.testing.assert_allclose(prog.unshard(var.table), want_w, rtol=2e-5, atol=2e-6,
                               err_msg=f"table after step {step}")
    for k, want in enumerate(want_s):
      np.testing.assert_allclose(prog.unshard(var.slot[k]), want, rtol=2e-5, atol=2e-6,
                                 err_msg=f"slot {k} after step {step}")


@pytest.mark.parametrize("devices,num_sc", [(1, 2), (2, 2), (4, 2)])
def test_custom_function_with_a_slot_matches_numpy(devices, num_sc):
  spec = es.CustomOptimizerSpec(learning_rate=LR, custom_computation_fn=heavy_ball,
                                slot_variable_initializers_tuple=(jax.nn.initializers.zeros,),
                                short_name_str="heavy_ball")
  prog = sc_programs.Program(devices, num_sc, 128, 8, spec, 8 * devices * num_sc)
  _run(prog, np.random.default_rng(40 + devices), 3, (0.0,), heavy_ball_numpy)


@pytest.mark.parametrize("devices,num_sc", [(1, 4), (2, 2)])
def test_custom_function_without_slots_clipped(devices, num_sc):
  """One result, a reduction over the row, and embedding_var_limits (the
  package wraps the computation with the clipping)."""
  spec = es.CustomOptimizerSpec(learning_rate=LR, custom_computation_fn=sign_sgd,
                                short_name_str="sign_sgd")
  prog = sc_programs.Program(devices, num_sc, 128, 8, spec, 8 * devices * num_sc,
                             limits=(-0.6, 0.6))
  _run(prog, np.random.default_rng(50 + devices), 3, (), sign_sgd_numpy, limits=(-0.6, 0.6))


def test_custom_stablehlo_text_and_minibatching():
  """The update given as StableHLO text (lowered once by the user, as the
  package's tests do), with minibatching."""
  width = 8
  row = jax.ShapeDtypeStruct((1, width), jnp.float32)
  text = jax.jit(heavy_ball).lower(row, row, row, row).as_text(dialect="stablehlo")
  spec = es.CustomOptimizerSpec(learning_rate=LR, stablehlo=text,
                                slot_variable_initializers_tuple=(jax.nn.initializers.zeros,),
                                short_name_str="heavy_ball_text")
  prog = sc_programs.Program(2, 2, 128, width, spec, 32, minibatching=True)
  _run(prog, np.random.default_rng(60), 3, (0.0,), heavy_ball_numpy)
