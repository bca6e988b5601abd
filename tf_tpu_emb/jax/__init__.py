"""jax-tpu-embedding's SparseCore primitives on a CPU.

    import tf_tpu_emb.jax
    tf_tpu_emb.jax.install()

After `install()`, a program written with jax-tpu-embedding 0.2.0 runs its
jitted lookup (`embedding.tpu_sparse_dense_matmul`) and gradient + update
(`embedding.tpu_sparse_dense_matmul_grad`) on CPU devices, unchanged: each
primitive gets a CPU lowering rule (`mlir.register_lowering(...,
platform="cpu")`, which takes precedence over the package's own rule, a
custom call that exists only in the TPU runtime) that calls a typed XLA FFI
handler of this project (jax_ffi/sparsecore_ffi.cc, built by `make
jax-build`).  The layout they read and the arithmetic are in
docs/sparsecore_semantics.md, "The JAX (jax-tpu-embedding) layout".

Primitives with a CPU rule: `sparse_dense_matmul_csr` (the lookup) and
`sparse_dense_matmul_grad_with_<optimizer>` (the gradient + update) for SGD,
Adagrad, Adam, FTRL, AdagradMomentum, LaProp and F2A, with and without
minibatching (a `quantization_config` is refused at lowering with
NotImplementedError); with `install(num_sc_per_device=S)` also
`sparse_dense_matmul_gradient_stack` and
`sparse_dense_matmul_activation_unstack` (their operands do not say how many
SparseCores a device has, so they need S); and the custom-optimizer
primitive (`sparse_dense_matmul_optimizer_grad`, as `CustomOptimizerSpec`
binds it), whose update is the StableHLO computation it carries, applied
once to each row with an id as a SparseCore applies it.

Several devices: under `jax.shard_map` over N CPU devices (each holding its
table shard, as jax-tpu-embedding lays a table out over devices x
SparseCores), the lookup rule gathers the table's shards from every device
and the update rule gathers every device's CSR buffers and activation
gradients, so each device computes what its SparseCores compute on a TPU,
where the SparseCores exchange ids and gradients themselves.

Nothing here imports TensorFlow.
"""

import ctypes
import functools
import os
from typing import Optional, Tuple

import numpy as np

from tf_tpu_emb import optimizer_specs

_LIB_NAME = "_sparsecore_ffi.so"
LOOKUP_TARGET = "tf_tpu_emb_sparsecore_lookup"
GRAD_TARGET = "tf_tpu_emb_sparsecore_grad"
ROW_GRADS_TARGET = "tf_tpu_emb_sparsecore_row_grads"

_installed = False
_num_sc_for_stacking: Optional[int] = None


def library_path() -> str:
  """Where `make jax-build` puts the FFI library."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIB_NAME)


def _load_library() -> ctypes.CDLL:
  path = library_path()
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"{path} is missing: build it with `make jax-build` (or "
        "`.venv-jax/bin/python jax_ffi/build.py`)")
  return ctypes.cdll.LoadLibrary(path)


# The minibatches a row-pointer buffer has room for with minibatching (the
# 64 divisions of the id space: docs/sparsecore_semantics.md §4, §11.1).
MAX_MINIBATCHES = 64


def _num_sc_per_device(rp_size: int, devices: int,
                       minibatching: bool = False) -> int:
  """The SparseCores per device that jax-tpu-embedding's preprocessing used.

  Its row-pointer buffer holds, per device, K groups of
  G = RoundUp(devices * num_sc, 8) entries for each of its num_sc
  SparseCores (docs/sparsecore_semantics.md §11.1): K = 1 without
  minibatching; with it, K = MAX_MINIBATCHES from the C++ preprocessing, or
  the step's minibatch count from the package's Python model
  (`input_preprocessing.preprocess_sparse_dense_matmul_input`).  Without
  minibatching the size determines num_sc.  With it several (num_sc, K) can
  fit; the one taken is, in order: the count given to
  `install(num_sc_per_device=...)`, the one with K = MAX_MINIBATCHES, the
  only one.
  """
  fits = {}  # num_sc -> K
  for num_sc in range(1, 257):
    group = -(-devices * num_sc // 8) * 8
    if num_sc * group > rp_size:
      break
    k, rest = divmod(rp_size, num_sc * group)
    if not rest and (k == 1 or (minibatching and k <= MAX_MINIBATCHES)):
      fits[num_sc] = k
  if minibatching:
    choices = [s for s in (_num_sc_for_stacking,) if s in fits]
    choices += [s for s, k in fits.items() if k == MAX_MINIBATCHES]
    choices += list(fits) if len(fits) == 1 else []
    if choices:
      return choices[0]
    if fits:
      raise ValueError(
          f"lhs_row_pointers: {rp_size} entries a device fit "
          f"{len(fits)} SparseCore counts ({sorted(fits)}) with minibatching: "
          "say which with tf_tpu_emb.jax.install(num_sc_per_device=...)")
  elif fits:
    return next(iter(fits))
  raise ValueError(
      f"lhs_row_pointers: {rp_size} entries a device is not "
      f"{'K (1 to ' + str(MAX_MINIBATCHES) + ') * ' if minibatching else ''}num_sc * "
      f"RoundUp({devices} devices * num_sc, 8) for any SparseCore count "
      "num_sc: not a buffer of jax-tpu-embedding's preprocessing for this mesh")


def _manual_axes(ctx) -> Tuple[Tuple[str, ...], int]:
  """The mesh axes a shard_map made manual around this primitive, and the
  number of devices over them (1, () outside shard_map)."""
  from jax._src import sharding_impls  # the lowering context's types
  axis_ctx = ctx.module_context.axis_context
  if isinstance(axis_ctx, sharding_impls.SPMDAxisContext):
    mesh = axis_ctx.mesh
    axes = tuple(a for a in mesh.axis_names if a in axis_ctx.manual_axes)
    n = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
    return axes, n
  if isinstance(axis_ctx, sharding_impls.ShardingContext):
    if axis_ctx.num_devices > 1:
      raise NotImplementedError(
          "jax-tpu-embedding's SparseCore primitives on CPU devices run under "
          "jax.shard_map (as the package's examples call them); this one was "
          f"lowered for {axis_ctx.num_devices} devices without it")
    return (), 1
  raise NotImplementedError(
      f"SparseCore primitive lowered in a {type(axis_ctx).__name__}: only "
      "jax.jit and jax.shard_map are supported on CPU")


def _lower_with_axes(ctx, axes, n, fn, *args, multiple_results):
  """Lowers fn(*args) in ctx, with the manual mesh axes bound so that fn's
  collectives over them trace."""
  from jax._src import core as jax_core
  from jax.interpreters import mlir
  lowered = mlir.lower_fun(fn, multiple_results=multiple_results)
  if not axes:
    return lowered(ctx, *args)
  mesh = ctx.module_context.axis_context.mesh
  with jax_core.extend_axis_env_nd([(a, mesh.shape[a]) for a in axes]):
    return lowered(ctx, *args)


def _check_supported(name: str, quantization_config=None):
  if quantization_config is not None:
    raise NotImplementedError(
        f"{name}: quantization_config is not supported on CPU (the "
        "SparseCore's quantized arithmetic is not published)")


def _lookup_rule(ctx, row_pointers, embedding_ids, sample_ids, gains,
                 num_minibatches, table, *, device_batch_size,
                 max_ids_per_partition, max_unique_ids_per_partition,
                 sharding_strategy=1, quantization_config=None,
                 enable_minibatching=False):
  import jax
  del max_ids_per_partition, max_unique_ids_per_partition
  _check_supported("sparse_dense_matmul_csr", quantization_config)
  if sharding_strategy != 1:
    raise NotImplementedError("sharding_strategy: only MOD (1) is supported")
  axes, n = _manual_axes(ctx)
  num_sc = _num_sc_per_device(ctx.avals_in[0].shape[0], n, enable_minibatching)
  (out_aval,) = ctx.avals_out

  def lookup(rp, ids, samples, g, nmb, tbl):  # the primitive's operands
    if n > 1:  # every device's shards, in global SparseCore order
      tbl = jax.lax.all_gather(tbl, axes, axis=0, tiled=True)
    return jax.ffi.ffi_call(
        LOOKUP_TARGET, jax.ShapeDtypeStruct(out_aval.shape, np.float32))(
            rp, ids, samples, g, nmb.reshape(1).astype(np.int32), tbl,
            num_sc_per_device=np.int64(num_sc), num_devices=np.int64(n),
            minibatching=bool(enable_minibatching))

  return _lower_with_axes(ctx, axes, n, lookup, row_pointers, embedding_ids,
                          sample_ids, gains, num_minibatches, table,
                          multiple_results=False)


def _grad_rule(optimizer: str, num_slots: int, num_hypers: int, ctx,
               row_pointers, embedding_ids, sample_ids, gains, num_minibatches,
               *rest, max_ids_per_partition, max_unique_ids_per_partition,
               computation_name="", sharding_strategy=1,
               enable_minibatching=False, min_value=None, max_value=None,
               multiply_linear_by_learning_rate=False):
  """The rule of sparse_dense_matmul_grad_with_<optimizer>; operands after
  the CSR buffers: the table, its `num_slots` slots, the activation
  gradients, the `num_hypers` hyper-parameters (the package's bind order)."""
  import jax
  del max_ids_per_partition, max_unique_ids_per_partition, computation_name

  if sharding_strategy != 1:
    raise NotImplementedError("sharding_strategy: only MOD (1) is supported")
  nvars = 1 + num_slots
  axes, n = _manual_axes(ctx)
  num_sc = _num_sc_per_device(ctx.avals_in[0].shape[0], n, enable_minibatching)
  var_avals = ctx.avals_in[5:5 + nvars]

  def grad(rp, ids, samples, g, nmb, *rest):  # the primitive's operands
    vs, agrad = rest[:nvars], rest[nvars]
    hs = [jax.numpy.asarray(h, np.float32).reshape(())
          for h in rest[nvars + 1:nvars + 1 + num_hypers]]
    (rp, ids, samples, g, nmb, agrad), offset = _shard_offsets(
        axes, n, num_sc, (rp, ids, samples, g, nmb.reshape(1).astype(np.int32), agrad))
    outs = jax.ffi.ffi_call(
        GRAD_TARGET,
        [jax.ShapeDtypeStruct(a.shape, np.float32) for a in var_avals],
        input_output_aliases={7 + i: i for i in range(nvars)})(
            rp, ids, samples, g, nmb, agrad, offset, *vs, *hs,
            optimizer=optimizer, num_sc_per_device=np.int64(num_sc),
            num_devices=np.int64(n), sources=np.int64(n),
            clip_min=min_value is not None,
            min_value=np.float32(0 if min_value is None else min_value),
            clip_max=max_value is not None,
            max_value=np.float32(0 if max_value is None else max_value),
            multiply_linear_by_lr=bool(multiply_linear_by_learning_rate),
            minibatching=bool(enable_minibatching))
    return list(outs)

  return _lower_with_axes(ctx, axes, n, grad, row_pointers, embedding_ids,
                          sample_ids, gains, num_minibatches, *rest,
                          multiple_results=True)


def _shard_offsets(axes, n, num_sc, operands):
  """Under shard_map: every device's CSR buffers and activation gradients
  (`operands`, gathered) and this device's first global SparseCore."""
  import jax
  if n > 1:  # (one device: nothing to gather, and no copy of the operands)
    gathered = [jax.lax.all_gather(x, axes, axis=0, tiled=True) for x in operands]
    return gathered, (jax.lax.axis_index(axes) * num_sc).astype(np.int32)
  return list(operands), jax.numpy.zeros((), np.int32)


def _module_text(stablehlo) -> str:
  if isinstance(stablehlo, bytes):
    return stablehlo.decode("utf-8")
  return str(stablehlo)  # text, or an ir.Module printed


def _call_module_abstract_eval(*args, module_text, name, out_avals):
  del args, module_text, name
  return tuple(out_avals)


def _call_module_lowering(ctx, *args, module_text, name, out_avals):
  """A call of the module's `main` (merged into the program under `name`),
  its results unpacked where it returns one tuple (the package's
  optimizers_computation functions do; a traced JAX function returns them
  flat)."""
  from jax.extend.mlir import ir
  from jax.extend.mlir.dialects import func as func_dialect
  from jax.extend.mlir.dialects import stablehlo as hlo
  from jax.interpreters import mlir
  del out_avals
  module = ir.Module.parse(module_text, context=ctx.module_context.context)
  callee = mlir.merge_mlir_modules(ctx.module_context.module, name, module,
                                   dst_symtab=ctx.module_context.symbol_table)
  fn = ctx.module_context.symbol_table[callee]
  results = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value).results
  call = func_dialect.CallOp(list(results), ir.FlatSymbolRefAttr.get(callee), list(args))
  values = list(call.results)
  if len(values) == 1 and _is_tuple(ir, values[0].type):
    values = [hlo.get_tuple_element(values[0], i)
              for i in range(ir.TupleType(values[0].type).num_types)]
  return values


def _is_tuple(ir, mlir_type) -> bool:
  try:
    ir.TupleType(mlir_type)
  except ValueError:  # the cast refuses a type that is not a tuple
    return False
  return True


@functools.cache
def _call_module_primitive():
  """The primitive that calls a custom optimizer's StableHLO update on one
  row ([1, width] operands and results)."""
  import jax.extend as jex
  from jax.interpreters import mlir
  prim = jex.core.Primitive("tf_tpu_emb_call_optimizer_module")
  prim.multiple_results = True
  prim.def_abstract_eval(_call_module_abstract_eval)
  mlir.register_lowering(prim, _call_module_lowering)
  return prim


def _optimizer_grad_rule(ctx, row_pointers, embedding_ids, sample_ids, gains,
                         num_minibatches, activations_grad, *hypers_and_vars,
                         num_hyperparameters, stablehlo, max_ids_per_partition,
                         max_unique_ids_per_partition,
                         computation_name="sparse_dense_matmul_optimizer_grad",
                         sharding_strategy=1, enable_minibatching=False):
  """The rule of sparse_dense_matmul_optimizer_grad (the custom optimizer):
  each row with an id gets its gradient as the built-in optimizers' rows do
  (the FFI handler's RowGradients), then the primitive's StableHLO
  computation, called as the SparseCore calls it: on [1, width] operands
  (gradient, table row, slot rows, each hyper-parameter broadcast to the
  row) returning the table row and the slot rows; rows without an id are
  unchanged (docs/sparsecore_semantics.md §11.3)."""
  import jax
  import jax.numpy as jnp
  del max_ids_per_partition, max_unique_ids_per_partition
  if sharding_strategy != 1:
    raise NotImplementedError("sharding_strategy: only MOD (1) is supported")
  axes, n = _manual_axes(ctx)
  num_sc = _num_sc_per_device(ctx.avals_in[0].shape[0], n, enable_minibatching)
  var_avals = ctx.avals_in[6 + num_hyperparameters:]
  if not var_avals:
    raise ValueError("sparse_dense_matmul_optimizer_grad: no embedding variable")
  rows = var_avals[0].shape[0]
  width = var_avals[0].shape[1] if len(var_avals[0].shape) == 2 else 1
  for k, aval in enumerate(var_avals):
    if aval.shape[0] != rows or aval.size != rows * width:
      raise ValueError(f"sparse_dense_matmul_optimizer_grad: embedding variable {k} has "
                       f"shape {aval.shape}, the table {var_avals[0].shape}")
  # A row has an id only if one of the ids (all devices') is in it.
  capacity = max(1, min(rows, ctx.avals_in[1].shape[0] * n))
  text = _module_text(stablehlo)
  row_aval = jax.core.ShapedArray((1, width), np.float32)
  call = _call_module_primitive()

  def update(rp, ids, samples, g, nmb, agrad, *rest):  # the primitive's operands
    hs, vs = rest[:num_hyperparameters], rest[num_hyperparameters:]
    (rp, ids, samples, g, nmb, agrad), offset = _shard_offsets(
        axes, n, num_sc, (rp, ids, samples, g, nmb.reshape(1).astype(np.int32), agrad))
    vs = [v.reshape(rows, width) for v in vs]
    touched, count, grads = jax.ffi.ffi_call(
        ROW_GRADS_TARGET,
        [jax.ShapeDtypeStruct((capacity,), np.int32),
         jax.ShapeDtypeStruct((1,), np.int32),
         jax.ShapeDtypeStruct((capacity, width), np.float32)])(
             rp, ids, samples, g, nmb, agrad.reshape(-1, width), offset, vs[0],
             num_sc_per_device=np.int64(num_sc), num_devices=np.int64(n),
             sources=np.int64(n), minibatching=bool(enable_minibatching))
    hyper_rows = [jnp.broadcast_to(jnp.asarray(h, np.float32).reshape(()), (1, width))
                  for h in hs]

    def row(k, variables):
      r = touched[k]
      olds = [jax.lax.dynamic_slice(v, (r, 0), (1, width)) for v in variables]
      news = call.bind(jax.lax.dynamic_slice(grads, (k, 0), (1, width)), *olds,
                       *hyper_rows, module_text=text, name=computation_name,
                       out_avals=(row_aval,) * len(variables))
      return tuple(jax.lax.dynamic_update_slice(v, new, (r, 0))
                   for v, new in zip(variables, news))

    out = jax.lax.fori_loop(0, count[0], row, tuple(vs))
    return [v.reshape(a.shape) for v, a in zip(out, var_avals)]

  return _lower_with_axes(ctx, axes, n, update, row_pointers, embedding_ids,
                          sample_ids, gains, num_minibatches, activations_grad,
                          *hypers_and_vars, multiple_results=True)


# Optimizer (the package's name; the primitive is
# sparse_dense_matmul_grad_with_<name>), its slots, its scalar operands
# (the learning rate first): the optimizer source's JAX entries.
_GRAD_PRIMITIVES = tuple(
    (o.jax_name, len(o.slots), 1 + len(o.jax_hypers))
    for o in optimizer_specs.SPARSECORE_OPTIMIZERS if o.jax_name)


def _gradient_stack_rule(num_sc, ctx, *gradients, stacked_batch_size,
                         stacked_feature_dim):
  """sparse_dense_matmul_gradient_stack: the features' gradients (each
  [b_f, stacked_feature_dim], b_f split over the device's SparseCores) into
  one [stacked_batch_size, stacked_feature_dim], SparseCore major: for each
  SparseCore its slice of each feature in turn (the package's stacking
  without the primitive, embedding.stack_embedding_gradients)."""
  import jax.numpy as jnp
  from jax.interpreters import mlir
  for aval in ctx.avals_in:
    if aval.shape[0] % num_sc or aval.shape[1] != stacked_feature_dim:
      raise ValueError(
          f"sparse_dense_matmul_gradient_stack: a gradient of shape {aval.shape} "
          f"is not [a multiple of {num_sc} SparseCores, {stacked_feature_dim}]")
  if sum(a.shape[0] for a in ctx.avals_in) != stacked_batch_size:
    raise ValueError("sparse_dense_matmul_gradient_stack: the gradients' rows do not "
                     f"add up to stacked_batch_size {stacked_batch_size}")

  def stack(*gs):
    parts = [g.reshape(num_sc, -1, stacked_feature_dim) for g in gs]
    return jnp.concatenate(parts, axis=1).reshape(-1, stacked_feature_dim)

  return mlir.lower_fun(stack, multiple_results=False)(ctx, *gradients)


def _activation_unstack_rule(num_sc, ctx, stacked, *, per_feature_batch_sizes,
                             per_feature_dims):
  """sparse_dense_matmul_activation_unstack: the inverse of the stacking
  above, each feature's first per_feature_dims columns (the package's
  unstacking without the primitive, embedding.unstack_embedding_activations)."""
  from jax.interpreters import mlir
  (aval,) = ctx.avals_in
  if (any(b % num_sc for b in per_feature_batch_sizes)
      or sum(per_feature_batch_sizes) != aval.shape[0]
      or max(per_feature_dims) > aval.shape[-1]):
    raise ValueError(
        f"sparse_dense_matmul_activation_unstack: batch sizes {per_feature_batch_sizes} "
        f"and widths {per_feature_dims} do not cut activations of shape {aval.shape} "
        f"over {num_sc} SparseCores")

  def unstack(x):
    per_sc = x.reshape(num_sc, -1, x.shape[-1])
    outs, offset = [], 0
    for b, d in zip(per_feature_batch_sizes, per_feature_dims):
      n = b // num_sc
      outs.append(per_sc[:, offset:offset + n, :d].reshape(b, d))
      offset += n
    return outs

  return mlir.lower_fun(unstack, multiple_results=True)(ctx, stacked)


def install(num_sc_per_device: Optional[int] = None) -> None:
  """Registers the FFI handlers and the CPU lowering rules (idempotent).

  num_sc_per_device: the SparseCores a device presents (as given to the
  package's functions); needed by the gradient-stack and activation-unstack
  primitives, whose rules are registered where it is given, and by
  minibatching row-pointer buffers sized for fewer than 64 minibatches
  (the package's Python preprocessing model), whose size can fit several
  SparseCore counts (`_num_sc_per_device`).
  """
  global _installed, _num_sc_for_stacking
  if num_sc_per_device is not None:
    if _num_sc_for_stacking not in (None, num_sc_per_device):
      raise ValueError(
          f"install(num_sc_per_device={num_sc_per_device}): already installed "
          f"with {_num_sc_for_stacking}")
    if _num_sc_for_stacking is None:
      import importlib
      from jax.interpreters import mlir
      prims = "jax_tpu_embedding.sparsecore.lib.core.primitives."
      stack = importlib.import_module(prims + "sparse_dense_matmul_gradient_stack")
      unstack = importlib.import_module(prims + "sparse_dense_matmul_activation_unstack")
      mlir.register_lowering(
          stack.tpu_sparse_dense_matmul_gradient_stack_primitive,
          functools.partial(_gradient_stack_rule, num_sc_per_device), platform="cpu")
      mlir.register_lowering(
          unstack.tpu_sparse_dense_matmul_activation_unstack_primitive,
          functools.partial(_activation_unstack_rule, num_sc_per_device), platform="cpu")
      _num_sc_for_stacking = num_sc_per_device
  if _installed:
    return
  import importlib

  import jax
  from jax.interpreters import mlir

  lib = _load_library()
  jax.ffi.register_ffi_target(
      LOOKUP_TARGET, jax.ffi.pycapsule(lib.TfTpuEmbScLookup), platform="cpu")
  jax.ffi.register_ffi_target(
      GRAD_TARGET, jax.ffi.pycapsule(lib.TfTpuEmbScGrad), platform="cpu")
  jax.ffi.register_ffi_target(
      ROW_GRADS_TARGET, jax.ffi.pycapsule(lib.TfTpuEmbScRowGrads), platform="cpu")

  prims = "jax_tpu_embedding.sparsecore.lib.core.primitives."
  csr = importlib.import_module(prims + "sparse_dense_matmul_csr")
  mlir.register_lowering(csr.tpu_sparse_dense_matmul_csr_primitive,
                         _lookup_rule, platform="cpu")
  custom = importlib.import_module(prims + "sparse_dense_matmul_optimizer_grad")
  mlir.register_lowering(custom.tpu_sparse_dense_matmul_optimizer_grad_primitive,
                         _optimizer_grad_rule, platform="cpu")
  for name, slots, hypers in _GRAD_PRIMITIVES:
    module = importlib.import_module(prims + "sparse_dense_matmul_grad_with_" + name)
    prim = getattr(module, f"tpu_sparse_dense_matmul_grad_with_{name}_primitive")
    mlir.register_lowering(
        prim, functools.partial(_grad_rule, name, slots, hypers), platform="cpu")
  _installed = True
