"""Who owns which engine: the one registry on the Python side.

The C++ registry maps an engine name to an engine (``ConfigureTPUEmbedding``
creates one, ``ShutdownTPUEmbedding`` removes it; see engine/engine.h).  ""
is the process's default engine, the one TF's core-named ops address; each
:class:`tf_tpu_emb.TPUEmbedding` configures an engine of its own under a name
from :func:`name_for`, and a front end may hold that object on the user's
behalf (the Keras ``TPUEmbeddingLayer``).  This module records both, per
engine; nothing else keeps engine-ownership state.

**Lifetime** (``tests/api/test_engine_lifetime.py``).  An owner's engine is
released by :func:`release` (``TPUEmbedding.shutdown``) or, when the owner is
garbage collected, by a ``weakref.finalize`` callback.  Both go through the library's C entry point
``TfTpuEmbReleaseEngine`` (engine/interrupts_and_c_api.cc, called with ctypes),
not through a TF op: a finalizer runs on whatever thread the collector runs
on, possibly in the middle of another thread's ``tf.function`` trace, where an
op would be added to that graph instead of running (the engine leaked, and
the unrelated function would shut engines down if it ever ran).  The C call
creates no op, holds no Python lock while it runs and is synchronous, so the
memory budget sees the release at once.

**Names are pooled.**  The engine name is an attr of every op, and TF's eager
kernel cache keeps one entry per distinct attr value for the life of the
process, so a fresh name per object grows memory with every object ever
built.  A name (:class:`EngineName`) is taken from a pool at an owner's first
configure, kept by the owner for its whole life (a rebuild after
``shutdown`` reuses it), and goes back to the pool only when nothing can
address it any more: the owner is gone *and* so is every graph whose ops
carry the name (:func:`pin`, called by the backend whenever it builds ops in
a graph).  A function traced for a collected object therefore can never reach
another object's engine: it keeps the name out of the pool for as long as it
exists, and its ops fail with FailedPrecondition ("not configured").

An owner is recorded by identity (``id``) as well as by weak reference: a
``TPUEmbedding`` collected in a reference cycle loses its weak references
before its finalizers run, and those must still recognise it as the owner.
"""
import ctypes
import heapq
import threading
import weakref

from tf_tpu_emb import _loader

__all__ = ["EngineName", "name_for", "lease_for", "pin", "claim", "set_holder", "is_owner",
           "engine_of", "engines", "owners", "holders", "holder", "release",
           "live_state_bytes", "pool_size", "release_when_collected"]

_lock = threading.Lock()
_made = 0  # name numbers made so far (0 .. _made - 1)
_free = []  # heap of pooled name numbers, back from collected owners and graphs
# engine name -> [owner id, weak ref to the owner, weak ref to its holder]
_engines = {}
# owner -> its EngineName (the same for every configure of the owner)
_leases = weakref.WeakKeyDictionary()
_GRAPH_ATTR = "_tf_tpu_emb_engine_names"
_clib = None


class EngineName:
    """A pooled engine name (``name``): its number goes back to the pool when
    this object is collected.  Owners, backends and graphs (:func:`pin`) hold
    it while they may address the engine."""

    __slots__ = ("name", "__weakref__")

    def __init__(self, prefix):
        global _made
        with _lock:
            if _free:
                number = heapq.heappop(_free)
            else:
                number, _made = _made, _made + 1
        self.name = "%s_%d" % (prefix, number)
        weakref.finalize(self, _return, number)

    def __repr__(self):
        return "EngineName(%r)" % self.name


def _return(number):
    with _lock:
        heapq.heappush(_free, number)


def lease_for(obj, prefix="tpu_embedding"):
    """The :class:`EngineName` of owner `obj`: taken from the pool at the first
    call, then the same for `obj`'s life.  The first call also arranges for
    `obj`'s engine to be released when `obj` is collected."""
    with _lock:
        lease = _leases.get(obj)
    if lease is None:
        lease = EngineName(prefix)
        with _lock:
            if obj in _leases:  # another thread won
                return _leases[obj]
            _leases[obj] = lease
        # The callback holds the lease, so the name cannot be pooled (and
        # configured by another owner) before this owner's engine is gone.
        weakref.finalize(obj, _owner_collected, lease, id(obj))
    return lease


def name_for(obj, prefix="tpu_embedding"):
    """The engine name of owner `obj` (see :func:`lease_for`)."""
    return lease_for(obj, prefix).name


def pin(lease):
    """Keeps `lease` out of the pool while the graph being built lives (a
    function graph, the function graphs enclosing it, and a TF1 graph they
    are built in): the ops built there carry its name.  No-op when executing
    eagerly."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if tf.executing_eagerly():
        return
    with tf.init_scope():
        outermost_eager = tf.executing_eagerly()
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        if outermost_eager and not getattr(graph, "building_function", False):
            break  # the process's global graph, outside every function: never collected
        pins = getattr(graph, _GRAPH_ATTR, None)
        if pins is None:
            pins = set()
            setattr(graph, _GRAPH_ATTR, pins)
        pins.add(lease)
        graph = getattr(graph, "outer_graph", None)


def pool_size():
    """``(name numbers ever made, numbers free in the pool)``: what bounds the
    engine names (and so TF's kernel cache) under object churn."""
    with _lock:
        return _made, len(_free)


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
    """Shuts down the engine `obj` owns, if any; returns whether it did.
    Safe on any thread and inside a trace (no TF op: see the module doc)."""
    with _lock:
        name = next((n for n, record in _engines.items() if record[0] == id(obj)), None)
        if name is None:
            return False
        del _engines[name]
    _release_engine(name)
    return True


def _owner_collected(lease, owner_id):
    """Finalizer of an owner: its engine (if configured) goes with it."""
    with _lock:
        record = _engines.get(lease.name)
        if record is not None and record[0] == owner_id:
            del _engines[lease.name]
    # Whether or not it is still configured: the name is this owner's alone.
    _release_engine(lease.name)


def release_when_collected(obj, engine):
    """For an engine whose name is not pooled (the stand-in TPU system's one
    engine, ``""``): released when `obj` is collected, if `obj` still owns it."""
    weakref.finalize(obj, _fixed_owner_collected, engine, id(obj))


def _fixed_owner_collected(engine, owner_id):
    with _lock:
        record = _engines.get(engine)
        if record is None or record[0] != owner_id:
            return  # released already, or another owner's now
        del _engines[engine]
    _release_engine(engine)


def _library():
    global _clib
    if _clib is None:
        _loader.load_library()  # TF loads it first (its op and kernel registrations)
        lib = ctypes.CDLL(_loader.library_path())  # the same loaded image
        lib.TfTpuEmbReleaseEngine.argtypes = [ctypes.c_char_p]
        lib.TfTpuEmbReleaseEngine.restype = None
        lib.TfTpuEmbLiveStateBytes.argtypes = []
        lib.TfTpuEmbLiveStateBytes.restype = ctypes.c_int64
        _clib = lib
    return _clib


def _release_engine(name):
    _library().TfTpuEmbReleaseEngine(name.encode())


def live_state_bytes():
    """Bytes of table and slot state reserved by every engine alive in this
    process (the memory budget's count, engine/engine.h LiveStateBytes)."""
    return int(_library().TfTpuEmbLiveStateBytes())


def _weak(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # not weak-referenceable: keep identity only
        return None
