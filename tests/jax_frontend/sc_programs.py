"""jax-tpu-embedding programs as the package's examples write them (one
table, its features, preprocessing, the lookup and the gradient + update
under jax.jit and jax.shard_map over N CPU devices), and the logical view
of their tables for the numpy models (tests/jax_frontend/numpy_model.py)."""
import functools

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax_tpu_embedding.sparsecore.lib.nn import embedding
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec
from jax_tpu_embedding.sparsecore.utils import utils
import numpy as np


def mesh(devices: int) -> jax.sharding.Mesh:
  return jax.sharding.Mesh(np.array(jax.devices()[:devices]), ("x",))


def ragged(rng, batch, vocab, max_len=4, weighted=True):
  """A batch of ragged samples (1..max_len ids each) and their weights."""
  ids = np.empty(batch, dtype=object)
  weights = np.empty(batch, dtype=object)
  for i in range(batch):
    n = int(rng.integers(1, max_len + 1))
    ids[i] = rng.integers(0, vocab, size=n).astype(np.int32)
    weights[i] = (rng.uniform(0.25, 2.0, size=n) if weighted
                  else np.ones(n)).astype(np.float32)
  return ids, weights


class Program:
  """One table of `vocab` x `dim` and `len(features)` features on it."""

  def __init__(self, devices, num_sc, vocab, dim, optimizer, batch,
               combiner="sum", features=1, limits=None, minibatching=False,
               max_ids_per_partition=256, stacking_primitives=False):
    self.devices, self.num_sc, self.vocab, self.dim = devices, num_sc, vocab, dim
    self.batch, self.mesh = batch, mesh(devices)
    self.limits, self.minibatching = limits, minibatching
    self.stacking_primitives = stacking_primitives
    table = embedding_spec.TableSpec(
        vocabulary_size=vocab, embedding_dim=dim,
        initializer=jax.nn.initializers.zeros, optimizer=optimizer,
        combiner=combiner, name="table", max_ids_per_partition=max_ids_per_partition,
        max_unique_ids_per_partition=max_ids_per_partition)
    self.feature_specs = {
        f"f{k}": embedding_spec.FeatureSpec(
            table_spec=table, input_shape=(batch, 1),
            output_shape=(batch, dim), name=f"f{k}")
        for k in range(features)}
    embedding.prepare_feature_specs_for_training(
        self.feature_specs, global_device_count=devices, num_sc_per_device=num_sc)
    setting = table.setting_in_stack
    self.stack = setting.stack_name
    self.padded_dim = setting.padded_embedding_dim
    self.padded_vocab = setting.padded_vocab_size
    assert self.padded_vocab == vocab, "tests use vocabularies needing no padding"
    self.sharding = NamedSharding(self.mesh, P("x"))

  def preprocess(self, ids, weights):
    """ids/weights: {feature: ragged arrays}."""
    out, _ = embedding.preprocess_sparse_dense_matmul_input(
        ids, weights, self.feature_specs, local_device_count=self.devices,
        global_device_count=self.devices, num_sc_per_device=self.num_sc,
        enable_minibatching=self.minibatching)
    return out

  def shard(self, logical: np.ndarray) -> jax.Array:
    """A logical [vocab, dim] table as the devices hold it (MOD sharding)."""
    padded = np.zeros((self.vocab, self.padded_dim), np.float32)
    padded[:, :self.dim] = logical
    sharded = utils.shard_emb_table(
        padded, num_devices=self.devices, num_sc_per_device=self.num_sc)
    return jax.device_put(sharded.reshape(-1, self.padded_dim), self.sharding)

  def unshard(self, array: jax.Array) -> np.ndarray:
    per_device = np.asarray(array).reshape(self.devices, -1, self.padded_dim)
    return utils.unshard_emb_table(per_device, num_sc_per_device=self.num_sc)[:, :self.dim]

  def variables(self, table, *slots, slot_type=None):
    slot = () if slot_type is None else slot_type(*(self.shard(s) for s in slots))
    return {self.stack: embedding.EmbeddingVariables(table=self.shard(table), slot=slot)}

  @functools.cached_property
  def lookup(self):
    fn = functools.partial(
        embedding.tpu_sparse_dense_matmul, global_device_count=self.devices,
        feature_specs=self.feature_specs, num_sc_per_device=self.num_sc,
        enable_minibatching=self.minibatching,
        use_activation_unstack_primitive=self.stacking_primitives)
    return jax.jit(jax.shard_map(fn, mesh=self.mesh, in_specs=(P("x"), P("x")),
                                 out_specs=P("x"), check_vma=False))

  @functools.cached_property
  def update(self):
    """update(grads, inputs, variables, step=0): the step is an operand
    (replicated), as a training loop passes it for step-dependent
    hyper-parameters (Adam's bias correction, LaProp's decay, F2A's step)."""
    limits = None if self.limits is None else {self.stack: self.limits}

    def fn(grads, inputs, variables, step):
      return embedding.tpu_sparse_dense_matmul_grad(
          grads, inputs, variables, feature_specs=self.feature_specs,
          global_device_count=self.devices, num_sc_per_device=self.num_sc,
          embedding_var_limits=limits, step=step, enable_minibatching=self.minibatching,
          use_gradient_stacking_primitive=self.stacking_primitives)

    jitted = jax.jit(jax.shard_map(fn, mesh=self.mesh,
                                   in_specs=(P("x"), P("x"), P("x"), P()),
                                   out_specs=P("x"), check_vma=False))
    return lambda grads, inputs, variables, step=0: jitted(
        grads, inputs, variables, np.int32(step))
