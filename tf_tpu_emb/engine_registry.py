"""Who owns which engine: the one registry on the Python side.

The C++ registry maps an engine name to an engine (``ConfigureTPUEmbedding``
creates one, ``ShutdownTPUEmbedding`` removes it; see engine/engine.h).  ""
is the process's default engine, the one TF's core-named ops address; each
:class:`tf_tpu_emb.TPUEmbedding` configures an engine of its own under a
name from :func:`new_name`, and a front end may hold that object on the
user's behalf (the Keras ``TPUEmbeddingLayer``).  This module records both,
per engine; nothing else keeps engine-ownership state.

An owner is recorded by identity (``id``), not only by weak reference: a
``TPUEmbedding`` collected in a reference cycle loses its weak references
before its ``__del__`` runs, and that ``__del__`` must still recognise itself
as the owner to shut its engine down.
"""
import itertools
import threading
import weakref

from tf_tpu_emb import ops as _ops

__all__ = ["new_name", "name_for", "claim", "set_holder", "is_owner", "engine_of", "engines", "owners",
           "holders", "holder", "release"]

_lock = threading.Lock()
_names = itertools.count()
# engine name -> [owner id, weak ref to the owner, weak ref to its holder]
_engines = {}
# owner -> its engine name (the same for every configure of the owner)
_owner_names = weakref.WeakKeyDictionary()


def new_name(prefix="tpu_embedding"):
    """A fresh engine name, unique in this process (never "", the default)."""
    return "%s_%d" % (prefix, next(_names))


def name_for(obj, prefix="tpu_embedding"):
    """The engine name of owner `obj`: fresh at the first call, then the same
    for `obj`'s life (a rebuild after a shutdown reuses it)."""
    with _lock:
        name = _owner_names.get(obj)
        if name is None:
            name = _owner_names[obj] = new_name(prefix)
        return name


def claim(obj, engine, holder=None):
    """Records `obj` (which has just configured `engine`) as its owner, held
    by `holder` (e.g. a Keras layer) if given."""
    with _lock:
        _engines[engine] = [id(obj), _weak(obj), _weak(holder) if holder is not None else None]


def set_holder(obj, holder):
    """Records `holder` as the front end holding owner `obj` (no-op if `obj`
    owns no engine)."""
    with _lock:
        for record in _engines.values():
            if record[0] == id(obj):
                record[2] = _weak(holder)


def engine_of(obj):
    """The name of the engine `obj` configured and has not released, or None."""
    with _lock:
        for name, record in _engines.items():
            if record[0] == id(obj):
                return name
    return None


def is_owner(obj):
    """True if `obj` configured an engine and has not released it."""
    return engine_of(obj) is not None


def engines():
    """The names of the engines claimed and not released, in configure order."""
    with _lock:
        return list(_engines)


def owners():
    """The live objects that configured an engine, in configure order."""
    with _lock:
        refs = [record[1] for record in _engines.values()]
    return [o for o in (r() if r is not None else None for r in refs) if o is not None]


def holders():
    """The live front ends holding an engine's owner (e.g. Keras layers)."""
    with _lock:
        refs = [record[2] for record in _engines.values()]
    return [h for h in (r() if r is not None else None for r in refs) if h is not None]


def holder():
    """The front end that most recently came to hold an engine, or None."""
    found = holders()
    return found[-1] if found else None


def release(obj):
    """Shuts down the engine `obj` owns, if any; returns whether it did."""
    with _lock:
        name = next((n for n, record in _engines.items() if record[0] == id(obj)), None)
        if name is None:
            return False
        del _engines[name]
    _ops.shutdown_tpu_embedding(engine=name)
    return True


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # not weak-referenceable: keep identity only
        return None
