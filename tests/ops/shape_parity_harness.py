"""How the shape-parity tests (tests/ops/test_shape_parity_by_*.py) build an
op both as TF's core op and as ours (``TfTpuEmb>``) in a fresh graph, and
compare the two outcomes: both fail or succeed together, with the same
exception type and, for the InvalidArgument messages we reproduce, the same
message, and infer the same static shapes.

The one allowance, (d) of test_shape_parity_by_config.py: TF's LoadAll /
RetrieveAll report some errors as an Internal RET_CHECK where ours reports
InvalidArgument, so for those two ops only error-or-success is compared, plus
the messages when TF's error is an InvalidArgument one.
"""
import collections
import re

import tensorflow as tf
from tensorflow.python.framework import op_def_library
from tensorflow.python.framework import op_def_registry

from tf_tpu_emb import ops as tte_ops


PREFIX = tte_ops.PREFIX


# ====================================================== building and comparing

Outcome = collections.namedtuple("Outcome", ["error", "message", "shapes"])


class Ph(collections.namedtuple("Ph", ["shape", "dtype"])):
    """A placeholder spec: shape is a tuple (None entries = unknown) or None."""
    __slots__ = ()

    def __new__(cls, shape, dtype=tf.float32):
        return super().__new__(cls, None if shape is None else tuple(shape), dtype)


def _shape_of(tensor):
    return None if tensor.shape.rank is None else tensor.shape.as_list()


def _materialize(value, cache):
    if isinstance(value, Ph):
        if value not in cache:
            cache[value] = tf.compat.v1.placeholder(
                value.dtype, shape=None if value.shape is None else list(value.shape))
        return cache[value]
    if isinstance(value, list) and value and isinstance(value[0], Ph):
        return [_materialize(v, cache) for v in value]
    return value


def _try_build(op_type, kwargs, cache, name):
    try:
        _, _, op, _ = op_def_library._apply_op_helper(
            op_type, name=name, **{k: _materialize(v, cache) for k, v in kwargs.items()})
    except Exception as e:  # noqa: BLE001 - the exception itself is the result
        return Outcome(type(e), str(e), None)
    return Outcome(None, "", [_shape_of(t) for t in op.outputs])


def build_pair(bare, **kwargs):
    """Builds TF's op `bare` and ours in a fresh graph; returns (core, ours)."""
    with tf.Graph().as_default():
        cache = {}
        core = _try_build(bare, kwargs, cache, "core")
        ours = _try_build(PREFIX + bare, _with_engine(bare, kwargs), cache, "ours")
    return core, ours


def _with_engine(bare, kwargs):
    """Our op's kwargs: its last attr `engine` (absent from TF's op) as the
    generated wrapper passes it by default."""
    attrs = [a.name for a in op_def_registry.get(PREFIX + bare).attr]
    return dict(kwargs, engine="") if "engine" in attrs else kwargs


def build_ours(bare, **kwargs):
    with tf.Graph().as_default():
        return _try_build(PREFIX + bare, _with_engine(bare, kwargs), {}, "ours")


# InvalidArgument messages our shape functions reproduce (or share with TF's
# shape-inference helpers).  Every instance in TF's message, numbers included,
# must be in ours.
KEY_PHRASES = tuple(re.compile(p) for p in (
    r"Malformed tpu_embedding_config\.",
    r"num outputs != size of output shapes",
    r"Shape \[[-0-9,?]*\] has dimensions with values below -1",
    r"Shape \[[-0-9,?]*\] is too large",
    r"exactly one of table_id or table_name must be non-default",
    r"Invalid length of combiners\. Have \d+ but expected 0 or \d+",
    r"Shape must be rank \d+ but is rank \d+",
    r"Shape must be at least rank \d+ but is rank \d+",
    r"Dimension \d+ in both shapes must be equal, but are -?\d+ and -?\d+",
    r"Dimension must be -?\d+ but is -?\d+",
    r"All embedding shards must be non-empty, shard ID: -?\d+ is empty, "
    r"vocabulary size: -?\d+, number of shards: -?\d+",
    r"The number of shards for the embedding layer must be > 0\. Currently set to: -?\d+",
    r"The value of shard_id must be >= 0 and < -?\d+\. Currently set to: -?\d+",
    r"No optimization algorithm specified",
))

ALL_TABLES_OPS = ("LoadAllTPUEmbeddingParameters", "RetrieveAllTPUEmbeddingParameters")


def mismatch(bare, core, ours, case):
    """A description of how `ours` differs from `core`, or None."""
    where = "%s %s" % (bare, case)
    if core.error is TypeError:  # the op was never built: a bug of this file
        return "%s: harness error, TF raised TypeError(%r)" % (where, core.message[:300])
    if (core.error is None) != (ours.error is None):
        return "%s: TF %s, ours %s" % (
            where, "OK %s" % (core.shapes,) if core.error is None else
            "%s(%r)" % (core.error.__name__, core.message[:300]),
            "OK %s" % (ours.shapes,) if ours.error is None else
            "%s(%r)" % (ours.error.__name__, ours.message[:300]))
    if core.error is None:
        if core.shapes != ours.shapes:
            return "%s: shapes TF %s, ours %s" % (where, core.shapes, ours.shapes)
        return None
    if bare not in ALL_TABLES_OPS and core.error is not ours.error:
        return "%s: TF raised %s(%r), ours %s(%r)" % (
            where, core.error.__name__, core.message[:300], ours.error.__name__,
            ours.message[:300])
    if core.error is ValueError:  # an InvalidArgument from the shape function
        for phrase in KEY_PHRASES:
            expected = phrase.findall(core.message)
            if expected and phrase.findall(ours.message) != expected:
                return "%s: TF says %r, ours %r" % (where, core.message[:300],
                                                    ours.message[:300])
    return None


def assert_parity(results, label=""):
    problems = [m for m in (mismatch(*r) for r in results) if m]
    assert not problems, "%s: %d parity mismatch(es):\n  %s" % (
        label, len(problems), "\n  ".join(problems))


# Learning-rate input shapes of SendTPUEmbeddingGradients the sweeps try.
LEARNING_RATES = ([], [()], [(), ()], [(3,)], [None], [(), (1,)], [(None,)], [(1, 1)])


def _selector(**selector):
    """table_id/table_name/config attrs, defaults filled in (_apply_op_helper
    wants every non-type attr, like the generated wrappers pass them)."""
    return dict(dict(table_id=-1, table_name="", config=b""), **selector)
