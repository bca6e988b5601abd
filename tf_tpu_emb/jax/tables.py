"""A JAX program's tables in the per-table form TF's ``TPUEmbeddingV2`` reads.

jax-tpu-embedding keeps each stack of tables as ``EmbeddingVariables(table,
slot)``: arrays of ``[devices * SparseCores * rows a shard, width]``, the
tables padded, stacked and MOD-sharded (docs/sparsecore_semantics.md §11.1).
:func:`logical_tables` takes every table out of them as
``{table name: {state name: [vocabulary_size, dim] float32}}``, the states
named as TF names them (``parameters`` and the slots of the V1 optimizer the
JAX optimizer is: ``SPARSECORE_OPTIMIZERS``' ``hyper`` and ``OPTIMIZERS``'
slot names, in the same order as the package's slot fields);
:func:`stacked_variables` puts such tables back.  Both use the package's own
stacking functions (``table_stacking.unshard_and_unstack_tables``,
``stack_and_shard_tables``).  :mod:`tf_tpu_emb.table_exchange` writes and
reads the form; ``tf_tpu_emb.sparsecore_checkpoint.load_into`` /
``tables_of`` move it into and out of ``TPUEmbeddingV2``.

Nothing here imports TensorFlow.
"""
from typing import Dict, Mapping

import numpy as np

from tf_tpu_emb import optimizer_specs

__all__ = ["tf_state_names", "logical_tables", "stacked_variables"]


def tf_state_names(optimizer) -> tuple:
    """``("parameters", <TF's slot names>...)`` for a jax-tpu-embedding
    ``OptimizerSpec``; ValueError for an optimizer TF's TPU embedding does
    not have (LaProp, F2A, a custom one)."""
    name = optimizer.short_name()
    for info in optimizer_specs.SPARSECORE_OPTIMIZERS:
        if info.jax_name == name:
            v1 = optimizer_specs.BY_PROTO_FIELD.get(info.hyper)
            if v1 is None or not info.tf_ops:
                break
            if len(v1.slots) != len(info.slots):
                raise AssertionError("optimizer source: %s's slots differ from %s's"
                                     % (info.name, v1.proto_field))
            return ("parameters",) + tuple(v1.slots)
    raise ValueError("Optimizer %r (%s): TensorFlow's TPU embedding has no such optimizer, "
                     "so its tables have no TPUEmbeddingV2 form"
                     % (name, type(optimizer).__name__))


def _tables_by_name(table_specs) -> Dict[str, object]:
    import jax
    specs = {}
    for spec in jax.tree.leaves(table_specs, is_leaf=lambda x: hasattr(x, "setting_in_stack")):
        specs[spec.name] = spec
    return specs


def logical_tables(table_specs, variables: Mapping[str, object],
                   num_shards: int) -> Dict[str, Dict[str, np.ndarray]]:
    """``{table: {state: array}}`` of the tables of ``table_specs`` (a
    jax-tpu-embedding ``TableSpec`` collection, prepared for training) out of
    ``variables`` (``{stack name: EmbeddingVariables}``, as the package's
    ``init_embedding_variables`` and ``tpu_sparse_dense_matmul_grad`` give
    them).  ``num_shards``: devices x SparseCores per device."""
    from jax_tpu_embedding.sparsecore.lib.nn import table_stacking
    specs = _tables_by_name(table_specs)
    unstacked = table_stacking.unshard_and_unstack_tables(
        specs, {k: _host(v) for k, v in variables.items()}, num_shards)
    out = {}
    for name, spec in specs.items():
        names = tf_state_names(spec.optimizer)
        value = unstacked[name]
        arrays = [value.table] + list(value.slot)
        if len(arrays) != len(names):
            raise ValueError("Table %r: %d variables, its optimizer %s has %d"
                             % (name, len(arrays), spec.optimizer.short_name(), len(names)))
        out[name] = {state: np.asarray(a, np.float32) for state, a in zip(names, arrays)}
    return out


def _host(variables):
    import jax
    return jax.tree.map(lambda a: np.asarray(jax.device_get(a)), variables)


def stacked_variables(table_specs, tables: Mapping[str, Mapping[str, np.ndarray]],
                      num_shards: int, sharding=None) -> Dict[str, object]:
    """The inverse of :func:`logical_tables`: ``{stack name:
    EmbeddingVariables}`` holding ``tables`` (every table of ``table_specs``,
    with every state its optimizer has), placed with ``sharding`` (e.g.
    ``NamedSharding(mesh, P("x"))``) where given."""
    import jax
    from jax_tpu_embedding.sparsecore.lib.nn import embedding, table_stacking
    specs = _tables_by_name(table_specs)
    missing = sorted(set(specs) - set(tables))
    if missing:
        raise ValueError("No values for table %s (given: %s)"
                         % (", ".join(map(repr, missing)), ", ".join(sorted(tables))))
    trees = {}
    for name, spec in specs.items():
        names = tf_state_names(spec.optimizer)
        absent = [n for n in names if n not in tables[name]]
        if absent:
            raise ValueError("Table %r: no %s (its optimizer %s has %s)"
                             % (name, ", ".join(absent), spec.optimizer.short_name(),
                                ", ".join(names)))
        want = (spec.vocabulary_size, spec.embedding_dim)
        states = [np.asarray(tables[name][n], np.float32) for n in names]
        for n, value in zip(names, states):
            if value.shape != want:
                raise ValueError("Table %r, %s: shape %s, the table is %s"
                                 % (name, n, value.shape, want))
        slot_type = type(spec.optimizer.slot_variables_initializers())
        trees[name] = embedding.EmbeddingVariables(
            table=states[0], slot=slot_type(*states[1:]))
    stacked = table_stacking.stack_and_shard_tables(specs, trees, num_shards)
    out = {}
    for stack, tree in stacked.items():
        def place(a):
            a = a.reshape(-1, a.shape[-1])
            return a if sharding is None else jax.device_put(a, sharding)
        out[stack] = jax.tree.map(place, tree)
    return out
