"""Table stacking (embedding.auto_stack_tables): two tables of different
vocabularies in one stacked, rotated, sharded table, as jax-tpu-embedding
builds it (table_stacking.stack_and_shard_tables); the lookup and two
Adagrad steps, read back through the package's unshard_and_unstack_tables,
exact against the numpy model on each logical table."""
import functools

import pytest

pytest.importorskip("jax_tpu_embedding")

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402

import numpy_model as nm  # noqa: E402
import sc_programs  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es  # noqa: E402
from jax_tpu_embedding.sparsecore.lib.nn import table_stacking  # noqa: E402

pytestmark = pytest.mark.jax

LR, INIT_ACC, DIM = 0.05, 0.1, 8
VOCABS = {"A": 40, "B": 100}


@pytest.mark.parametrize("devices,num_sc", [(1, 2), (2, 2), (4, 2)])
def test_stacked_tables_lookup_and_adagrad_match_numpy(devices, num_sc):
  batch = 8 * devices * num_sc
  opt = es.AdagradOptimizerSpec(learning_rate=LR, initial_accumulator_value=INIT_ACC)
  specs = {name: es.TableSpec(vocabulary_size=v, embedding_dim=DIM,
                              initializer=jax.nn.initializers.zeros, optimizer=opt,
                              combiner="mean", name=name, max_ids_per_partition=256,
                              max_unique_ids_per_partition=256)
           for name, v in VOCABS.items()}
  features = {f"f{name}": es.FeatureSpec(table_spec=specs[name], input_shape=(batch, 1),
                                         output_shape=(batch, DIM), name=f"f{name}")
              for name in VOCABS}
  embedding.auto_stack_tables(features, global_device_count=devices, num_sc_per_device=num_sc)
  embedding.prepare_feature_specs_for_training(features, global_device_count=devices,
                                               num_sc_per_device=num_sc)
  stacks = {f.table_spec.stacked_table_spec.stack_name for f in features.values()}
  assert len(stacks) == 1, stacks
  (stack,) = stacks
  specs = {name: features[f"f{name}"].table_spec for name in VOCABS}
  shards = devices * num_sc

  rng = np.random.default_rng(devices)
  tables = {n: rng.normal(size=(v, DIM)).astype(np.float32) for n, v in VOCABS.items()}
  accs = {n: np.full((v, DIM), INIT_ACC, np.float32) for n, v in VOCABS.items()}
  mesh = sc_programs.mesh(devices)
  sharding = NamedSharding(mesh, P("x"))

  def put(logical, pad):
    stacked = table_stacking.stack_and_shard_tables(specs, logical, num_shards=shards,
                                                    pad_value=pad)[stack]
    return jax.device_put(np.asarray(stacked).reshape(-1, DIM), sharding)

  def logical(array):
    out = table_stacking.unshard_and_unstack_tables(
        specs, {stack: np.asarray(array).reshape(shards, -1, DIM)}, num_shards=shards)
    return {n: np.asarray(out[n]) for n in VOCABS}

  variables = {stack: embedding.EmbeddingVariables(
      table=put(tables, 0.0), slot=es.AdagradSlotVariables(accumulator=put(accs, INIT_ACC)))}
  common = dict(global_device_count=devices, feature_specs=features, num_sc_per_device=num_sc)
  lookup = jax.jit(jax.shard_map(functools.partial(embedding.tpu_sparse_dense_matmul, **common),
                                 mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"),
                                 check_vma=False))
  update = jax.jit(jax.shard_map(
      functools.partial(embedding.tpu_sparse_dense_matmul_grad, **common), mesh=mesh,
      in_specs=(P("x"), P("x"), P("x")), out_specs=P("x"), check_vma=False))

  want = {n: (tables[n].astype(np.float64), accs[n].astype(np.float64)) for n in VOCABS}
  for step in range(2):
    ids, weights = {}, {}
    for n, v in VOCABS.items():
      ids[f"f{n}"], weights[f"f{n}"] = sc_programs.ragged(rng, batch, v)
    inputs, _ = embedding.preprocess_sparse_dense_matmul_input(
        ids, weights, features, local_device_count=devices, global_device_count=devices,
        num_sc_per_device=num_sc)
    act = lookup(inputs, variables)
    grads = {f: rng.normal(size=(batch, DIM)).astype(np.float32) for f in features}
    for n in VOCABS:
      f = f"f{n}"
      np.testing.assert_allclose(np.asarray(act[f]),
                                 nm.lookup(want[n][0], ids[f], weights[f], "mean"),
                                 rtol=1e-5, atol=1e-5, err_msg=f"{f} at step {step}")
    variables = update(grads, inputs, variables)
    got_w, got_acc = logical(variables[stack].table), logical(variables[stack].slot.accumulator)
    for n in VOCABS:
      f = f"f{n}"
      grad, touched = nm.row_gradients(want[n][0].shape, ids[f], weights[f], "mean", grads[f])
      want[n] = nm.adagrad(want[n][0], want[n][1], grad, touched, LR)
      np.testing.assert_allclose(got_w[n], want[n][0], rtol=1e-5, atol=1e-6,
                                 err_msg=f"table {n} after step {step}")
      np.testing.assert_allclose(got_acc[n], want[n][1], rtol=1e-5, atol=1e-6,
                                 err_msg=f"accumulator {n} after step {step}")
