"""Who owns this process's engine: the one registry on the Python side.

The C++ engine is process-global (configured by ``ConfigureTPUEmbedding``,
removed by ``ShutdownTPUEmbedding``; see engine/engine.h).  On the Python side
exactly one object configures it at a time -- a
:class:`tf_tpu_emb.TPUEmbedding` -- and a front end may hold that object on
the user's behalf (the Keras ``TPUEmbeddingLayer``).  This module records
both; nothing else keeps engine-ownership state.

The owner is recorded by identity (``id``), not only by weak reference: a
``TPUEmbedding`` collected in a reference cycle loses its weak references
before its ``__del__`` runs, and that ``__del__`` must still recognise itself
as the owner to shut the engine down.
"""
import weakref

from tf_tpu_emb import ops as _ops

__all__ = ["claim", "owner", "holder", "is_owner", "release"]

_owner_id = None      # id() of the TPUEmbedding that configured the engine
_owner_ref = None     # weak reference to it
_holder_ref = None    # weak reference to the front end holding it, if any


def claim(obj, holder=None):
    """Records `obj` (which has just configured the engine) as its owner,
    held by `holder` (e.g. a Keras layer) if given."""
    global _owner_id, _owner_ref, _holder_ref
    _owner_id = id(obj)
    _owner_ref = _weak(obj)
    _holder_ref = _weak(holder) if holder is not None else None


def set_holder(obj, holder):
    """Records `holder` as the front end holding owner `obj` (no-op if `obj`
    does not own the engine)."""
    global _holder_ref
    if is_owner(obj):
        _holder_ref = _weak(holder)


def is_owner(obj):
    """True if `obj` configured the engine and has not released it."""
    return _owner_id is not None and _owner_id == id(obj)


def owner():
    """The object that configured the engine, or None."""
    return _owner_ref() if _owner_ref is not None else None


def holder():
    """The front end holding the engine's owner (e.g. a Keras layer), or None."""
    return _holder_ref() if _holder_ref is not None else None


def release(obj):
    """Shuts the engine down if `obj` owns it; returns whether it did."""
    global _owner_id, _owner_ref, _holder_ref
    if not is_owner(obj):
        return False
    _ops.shutdown_tpu_embedding()
    _owner_id = _owner_ref = _holder_ref = None
    return True


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # not weak-referenceable: keep identity only
        return None
