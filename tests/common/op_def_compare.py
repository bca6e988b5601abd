"""Our op defs against TensorFlow's, field by field (tests/ops,
tests/sparsecore): what graph authors, SavedModels and the generated
wrappers see of an op, so any drift (an input renamed, a default changed, a
constraint dropped, statefulness lost) is a compatibility bug."""
from tensorflow.python.framework import op_def_registry

from tf_tpu_emb import ops as tte_ops

PREFIX = tte_ops.PREFIX

ARG_FIELDS = ("name", "type", "type_attr", "number_attr", "type_list_attr", "is_ref")
ATTR_FIELDS = ("name", "type", "has_minimum", "minimum")
OP_FLAGS = ("is_stateful", "is_commutative", "is_aggregate", "allows_uninitialized_input")


def registered(bare):
    """``(core, ours)``: TF's op def of ``bare`` (None where this TF has no
    such op) and ours (``TfTpuEmb>bare``, which must exist)."""
    ours = op_def_registry.get(PREFIX + bare)
    assert ours is not None, "tf_tpu_emb does not register %s" % (PREFIX + bare)
    return op_def_registry.get(bare), ours


def args(arg_defs):
    """The compared fields of each input or output arg."""
    return [{f: getattr(a, f) for f in ARG_FIELDS} for a in arg_defs]


def attr(attr_def):
    """The compared fields of one attr: its type and minimum, and its default
    and allowed values as deterministic bytes."""
    d = {f: getattr(attr_def, f) for f in ATTR_FIELDS}
    for f in ("default_value", "allowed_values"):
        d[f] = (getattr(attr_def, f).SerializeToString(deterministic=True)
                if attr_def.HasField(f) else None)
    return d


def flags(op_def):
    """The op's flags (statefulness and the like)."""
    return {f: getattr(op_def, f) for f in OP_FLAGS}
