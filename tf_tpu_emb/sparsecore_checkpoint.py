"""SparseCore (``TPUEmbeddingV2``) checkpoints in the per-table form.

A ``TPUEmbeddingV2`` checkpoint holds *stacked* tables (tables of one width
and optimizer share one variable), each *sharded* over every SparseCore of
every chip (TF's ``tensorflow/python/tpu/tpu_embedding_v3.py``:
``TPUEmbeddingShardedVariable``, one slice per device), plus the
``SparseCoreTableLayouts`` proto that says where each table sits
(``tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY``).  TF can
restore it into ``TPUEmbeddingV2`` (same or other layout: its
``TpuEmbeddingV3CheckpointAdapter``) and the *parameters* into
``TPUEmbeddingForServing``; it has no way back to per-table optimizer state
("Sharded to Unsharded is not implemented yet").  This module is that way:

* :func:`read_tables` -- ``{table name: {state name: array}}`` from a V2
  checkpoint: ``parameters`` and the optimizer's slots (TF's slot names,
  e.g. ``accumulators``; the names :meth:`tf_tpu_emb.TPUEmbedding.table_state_names`
  lists), each ``[vocabulary_size, dim]`` with the SparseCore padding removed;
* :func:`tables_of` -- the same from a live ``TPUEmbeddingV2`` object (its
  ``variables`` and ``embedding_layouts``), e.g. to serve a model that is
  still in memory (:func:`tf_tpu_emb.serving.serving_module` takes a V2
  object through it);
* :func:`load_into` -- those arrays into a V1 object (``tf_tpu_emb.TPUEmbedding``
  or what ``tf.tpu.experimental.embedding.TPUEmbedding`` is under the
  stand-in: every state through ``load_table``), into TF's
  ``TPUEmbeddingForServing`` (parameters), or into a built ``TPUEmbeddingV2``
  (every state, each table's rows written into its stacked, sharded
  variables by :func:`stack_table`), matched by table name; a
  ``tf.train.Checkpoint`` of a V1 object is then the per-table (V1) form.
  With :mod:`tf_tpu_emb.table_exchange` this is also how a table trained by
  a JAX program (``tf_tpu_emb.jax.tables``) enters ``TPUEmbeddingV2`` and
  leaves it again.

The row arithmetic (a table's rows in a stacked, sharded variable) is written
from the layout proto's fields as TF's ``unshuffle_from_sc_to_cpu`` and
``remove_padding_from_sc`` (``tpu_embedding_v3_utils.py``) read them:
the variable is ``num_sparse_cores`` shards of equal height; the table holds
rows ``[sparse_core_shard_row_offset, + unsharded_padded_shape[0] /
num_sparse_cores)`` of every shard; its id ``i`` is in shard ``(i +
sparse_core_shard_rotation) % num_sparse_cores``, row ``i // num_sparse_cores``
of its part; then the padding rows and columns beyond ``unsharded_shape`` go.
tests/sparsecore/test_checkpoint_generations.py checks it against TF's
functions and against checkpoints TF's ``TPUEmbeddingV2`` wrote.
"""
import collections

import numpy as np

__all__ = ["read_tables", "tables_of", "load_into", "unstack_table", "stack_table",
           "layouts_of"]

_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


def _layouts_key():
    from tensorflow.python.tpu import tpu_embedding_v3_utils
    return tpu_embedding_v3_utils.SPARSECORE_LAYOUTS_CHECKPOINT_KEY


def _unescape(local_name):
    """A checkpoint key's path component as the object's local name (TF
    escapes ``/`` as ``.S`` and ``.`` as ``..``)."""
    out, i = [], 0
    while i < len(local_name):
        if local_name[i] == "." and i + 1 < len(local_name):
            out.append("/" if local_name[i + 1] == "S" else local_name[i + 1])
            i += 2
        else:
            out.append(local_name[i])
            i += 1
    return "".join(out)


def layouts_of(reader):
    """``(prefix, [SparseCoreTableLayout])`` of the one V2 embedding object
    in the checkpoint ``reader`` (``tf.train.load_checkpoint``).  ValueError
    when there is none or more than one."""
    from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
    found = [k for k in reader.get_variable_to_dtype_map()
             if k.endswith(_VALUE_SUFFIX) and k[:-len(_VALUE_SUFFIX)].rsplit("/", 1)[-1]
             == _layouts_key()]
    if not found:
        raise ValueError("The checkpoint has no SparseCore table layouts (%s): it was not "
                         "written by TPUEmbeddingV2" % _layouts_key())
    if len(found) > 1:
        raise ValueError("The checkpoint holds %d TPUEmbeddingV2 objects (%s): read_tables "
                         "reads one; pass prefix= to choose" % (len(found), ", ".join(found)))
    key = found[0]
    layouts = sparse_core_layout_pb2.SparseCoreTableLayouts()
    layouts.ParseFromString(reader.get_tensor(key))
    prefix = key[:-len(_VALUE_SUFFIX)].rsplit("/", 1)[0]
    return prefix, list(layouts.tables)


def _shards(stacked, layout):
    """(the stacked value as [SparseCores, rows a shard, width] -- a view --,
    the table's first row in each shard, its rows in each shard), checked
    against the layout."""
    n = layout.num_sparse_cores
    if stacked.ndim != 2 or stacked.shape[0] % n:
        raise ValueError("Stacked table %r of shape %s does not split into %d SparseCore "
                         "shards" % (layout.stacked_table_name, stacked.shape, n))
    per_shard = layout.unsharded_padded_shape[0] // n
    start = layout.sparse_core_shard_row_offset
    shards = stacked.reshape(n, stacked.shape[0] // n, stacked.shape[1])
    if start + per_shard > shards.shape[1]:
        raise ValueError("Table %r: rows [%d, %d) of each shard are outside the stacked "
                         "table %r (%d rows a shard)" % (layout.table_name, start,
                                                         start + per_shard,
                                                         layout.stacked_table_name,
                                                         shards.shape[1]))
    return shards, start, per_shard


def unstack_table(stacked, layout):
    """One table's ``[vocabulary_size, dim]`` rows out of a stacked, sharded
    variable's value (numpy), by the rule of the module doc."""
    shards, start, per_shard = _shards(np.asarray(stacked), layout)
    part = shards[:, start:start + per_shard, :]
    part = np.roll(part, -layout.sparse_core_shard_rotation, axis=0)
    table = part.transpose(1, 0, 2).reshape(per_shard * layout.num_sparse_cores,
                                            shards.shape[2])
    rows, cols = layout.unsharded_shape
    return table[:rows, :cols]


def stack_table(stacked, table, layout):
    """The inverse of :func:`unstack_table`: a copy of the stacked variable's
    value ``stacked`` with the rows of ``table`` (``[vocabulary_size, dim]``
    = the layout's ``unsharded_shape``) written where the layout puts them;
    every other entry (other tables, padding) is kept."""
    stacked = np.array(stacked, copy=True)
    table = np.asarray(table)
    rows, cols = layout.unsharded_shape
    if table.shape != (rows, cols):
        raise ValueError("Table %r: values of shape %s, the layout's table is %s"
                         % (layout.table_name, table.shape, (rows, cols)))
    if stacked.ndim == 2 and stacked.shape[1] < cols:
        raise ValueError("Stacked table %r of shape %s has fewer than the table's %d columns"
                         % (layout.stacked_table_name, stacked.shape, cols))
    shards, start, per_shard = _shards(stacked, layout)
    n = layout.num_sparse_cores
    # The table's part as unstack_table reads it, with the new rows in it.
    part = np.roll(shards[:, start:start + per_shard, :], -layout.sparse_core_shard_rotation,
                   axis=0)
    logical = part.transpose(1, 0, 2).reshape(per_shard * n, stacked.shape[1])
    logical[:rows, :cols] = table
    part = logical.reshape(per_shard, n, stacked.shape[1]).transpose(1, 0, 2)
    shards[:, start:start + per_shard, :] = np.roll(part, layout.sparse_core_shard_rotation,
                                                    axis=0)
    return shards.reshape(stacked.shape)


def read_tables(path, prefix=None):
    """``{table name: {state name: numpy array}}`` of the V2 checkpoint at
    ``path`` (a prefix ``tf.train.Checkpoint.save`` returned, or a directory):
    ``parameters`` and every slot the checkpoint holds for the table's stack.
    ``prefix``: the object path of the V2 embedding in the checkpoint when it
    holds more than one."""
    import tensorflow as tf
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise ValueError("No checkpoint in %r" % path)
        path = latest
    reader = tf.train.load_checkpoint(path)
    if prefix is None:
        prefix, layouts = layouts_of(reader)
    else:
        from tensorflow.core.tpu.kernels import sparse_core_layout_pb2
        msg = sparse_core_layout_pb2.SparseCoreTableLayouts()
        msg.ParseFromString(reader.get_tensor(prefix + "/" + _layouts_key() + _VALUE_SUFFIX))
        layouts = list(msg.tables)
    # {stacked name: {state: checkpoint key}}: the stack's own variable is
    # "parameters", "<stack>/<slot>" its slots.
    states = collections.defaultdict(dict)
    stacks = {layout.stacked_table_name for layout in layouts}
    for key in reader.get_variable_to_dtype_map():
        if not (key.startswith(prefix + "/") and key.endswith(_VALUE_SUFFIX)):
            continue
        local = key[len(prefix) + 1:-len(_VALUE_SUFFIX)]
        if "/" in local:  # a child object of another object, not the embedding's
            continue
        name = _unescape(local)
        stack, _, slot = name.partition("/")
        if stack in stacks:
            states[stack][slot or "parameters"] = key
    out = {}
    for layout in layouts:
        keys = states.get(layout.stacked_table_name)
        if not keys or "parameters" not in keys:
            raise ValueError("The checkpoint has layouts for stacked table %r but not its "
                             "variable (under %r)" % (layout.stacked_table_name, prefix))
        out[layout.table_name] = {
            state: unstack_table(reader.get_tensor(key), layout)
            for state, key in sorted(keys.items(), key=lambda kv: kv[0] != "parameters")}
    return out


def is_v2(embedding):
    """Whether ``embedding`` is a SparseCore (``TPUEmbeddingV2``) object: the
    one mid-level class with ``embedding_layouts``."""
    return hasattr(type(embedding), "embedding_layouts")


def _whole(variable):
    """The full stacked value of a V2 variable (TF's sharded variable: its
    shards in device order, as its checkpoint concatenates them)."""
    import tensorflow as tf
    values = getattr(variable, "values", None)
    if values is None:
        return np.asarray(variable.numpy())
    return tf.concat([v.read_value() for v in values], axis=0).numpy()


def tables_of(embedding):
    """``{table name: {state name: numpy array}}`` of a live, built
    ``TPUEmbeddingV2`` object, as :func:`read_tables` gives them from its
    checkpoint: ``parameters`` and its slots, each table's rows out of its
    stacked, sharded variables by its layout."""
    if not is_v2(embedding):
        raise TypeError("tables_of takes a TPUEmbeddingV2 object, got %s"
                        % type(embedding).__name__)
    layouts = embedding.embedding_layouts
    variables = embedding.variables  # {stacked table: {state: sharded variable}}
    whole = {}
    out = {}
    for name, layout in layouts.items():
        stack = layout.stacked_table_name
        if stack not in variables:
            raise ValueError("Table %r: its stacked table %r has no variables" % (name, stack))
        if stack not in whole:
            whole[stack] = {state: _whole(var) for state, var in variables[stack].items()}
        out[layout.table_name] = {state: unstack_table(value, layout)
                                  for state, value in whole[stack].items()}
    return out


def load_into(embedding, tables):
    """Writes :func:`read_tables`' arrays into ``embedding``, matched by table
    name: a V1 object (``load_table``: its ``table_state_names`` must all be
    present), TF's ``TPUEmbeddingForServing`` (parameters only) or a built
    ``TPUEmbeddingV2`` (every state of each table's stack).  Tables of
    ``embedding`` missing from ``tables`` are a ValueError naming them, and
    nothing is written then."""
    if is_v2(embedding):
        return _load_into_v2(embedding, tables)
    configs = {t.name: t for t in embedding._table_config}  # pylint: disable=protected-access
    missing = sorted(set(configs) - set(tables))
    if missing:
        raise ValueError("The checkpoint has no table named %s (it has %s)"
                         % (", ".join(map(repr, missing)), ", ".join(sorted(tables))))
    for name, table in configs.items():
        state = tables[name]
        want = (table.vocabulary_size, table.dim)
        if state["parameters"].shape != want:
            raise ValueError("Table %r: the checkpoint's parameters are %s, the table is %s"
                             % (name, state["parameters"].shape, want))
        if hasattr(embedding, "load_table"):
            names = embedding.table_state_names(table)
            absent = [n for n in names if n not in state]
            if absent:
                raise ValueError("Table %r: the checkpoint has no %s (its states: %s); the "
                                 "V2 and V1 optimizers must match"
                                 % (name, ", ".join(absent), ", ".join(sorted(state))))
            embedding.load_table(table, [state[n] for n in names])
        else:
            embedding.embedding_tables[table].assign(state["parameters"])


def _load_into_v2(embedding, tables):
    """load_into for a built TPUEmbeddingV2: every state of every table
    checked first, then each stack's variables written whole, shard by
    shard (one per device, as :func:`_whole` reads them)."""
    layouts = embedding.embedding_layouts
    variables = embedding.variables  # {stacked table: {state: sharded variable}}
    missing = sorted(set(layouts) - set(tables))
    if missing:
        raise ValueError("No values for table %s (given: %s)"
                         % (", ".join(map(repr, missing)), ", ".join(sorted(tables))))
    new = {}
    for name, layout in sorted(layouts.items()):
        stack = layout.stacked_table_name
        if stack not in variables:
            raise ValueError("Table %r: its stacked table %r has no variables" % (name, stack))
        states = variables[stack]
        absent = [state for state in states if state not in tables[name]]
        if absent:
            raise ValueError("Table %r: no %s (its optimizer's states: %s); the V2 optimizer "
                             "and the tables' must match" % (name, ", ".join(absent),
                                                             ", ".join(sorted(states))))
        if stack not in new:
            new[stack] = {state: _whole(var) for state, var in states.items()}
        for state in states:
            new[stack][state] = stack_table(new[stack][state],
                                            np.asarray(tables[name][state], np.float32), layout)
    for stack, states in new.items():
        for state, value in states.items():
            var = variables[stack][state]
            parts = getattr(var, "values", None) or [var]
            start = 0
            for part in parts:
                rows = int(part.shape[0])
                part.assign(value[start:start + rows])
                start += rows
