"""Logical tables in a file both front ends read: one table, two front ends.

A table trained by a JAX program (jax-tpu-embedding; ``tf_tpu_emb.jax.tables``
takes it out of, and puts it back into, the package's stacked, sharded
variables) and the same table in TF's ``TPUEmbeddingV2``
(``tf_tpu_emb.sparsecore_checkpoint``: ``tables_of`` / ``load_into``) meet
here in the per-table form ``{table name: {state name: array}}``: each state
``[vocabulary_size, dim]`` float32 without the SparseCore padding, the states
named as TF names them (``parameters``, then the optimizer's slots in TF's
order, e.g. ``accumulators``; :data:`tf_tpu_emb.optimizer_specs.OPTIMIZERS`).

The file is a numpy ``.npz`` (no TensorFlow and no JAX needed to read it),
one array per ``<table>/<state>`` key; the values are written and read
bit for bit.  Nothing here imports TensorFlow or JAX.
"""
import os
from typing import Dict, Mapping

import numpy as np

__all__ = ["save", "load"]

Tables = Dict[str, Dict[str, np.ndarray]]


def save(path: str, tables: Mapping[str, Mapping[str, np.ndarray]]) -> str:
    """Writes ``tables`` to ``path`` (``.npz`` is appended where missing);
    returns the path written.  Every state must be a 2-D float32 array and
    every table must have ``parameters`` of the same shape as its slots."""
    arrays = {}
    for table, states in tables.items():
        if "/" in table or not table:
            raise ValueError("Table name %r: empty or holding '/'" % table)
        if "parameters" not in states:
            raise ValueError("Table %r has no 'parameters' (its states: %s)"
                             % (table, ", ".join(sorted(states))))
        shape = np.shape(states["parameters"])
        for state, value in states.items():
            value = np.asarray(value)
            if value.dtype != np.float32 or value.ndim != 2 or value.shape != shape:
                raise ValueError("Table %r, state %r: %s %s, not float32 %s like its "
                                 "parameters" % (table, state, value.dtype, value.shape, shape))
            arrays[table + "/" + state] = value
    if not path.endswith(".npz"):
        path += ".npz"
    np.savez(path, **arrays)
    return path


def load(path: str) -> Tables:
    """The tables :func:`save` wrote to ``path``."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    out: Tables = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            table, sep, state = key.partition("/")
            if not sep or not state:
                raise ValueError("%s: key %r is not <table>/<state>" % (path, key))
            out.setdefault(table, {})[state] = data[key]
    for table, states in out.items():
        if "parameters" not in states:
            raise ValueError("%s: table %r has no parameters" % (path, table))
    return out
