"""Waits a person can live with: Ctrl-C and the end of the main thread end a
waiting Recv (README "Waits").

A ``RecvTPUEmbeddingActivations`` that waits holds no thread (engine/step.cc),
so neither a Ctrl-C nor the end of the program would reach it before its
timeout.  When the op library loads, :func:`install`:

* puts the library's SIGINT handler in front of Python's.  With no Recv
  waiting it hands the signal straight to Python.  While one waits, the
  library ends every present wait with ``Cancelled`` (the step fails at once,
  the engine keeps its state, as after a timeout) and calls :func:`_notify`;
  Python's own SIGINT handling then raises ``KeyboardInterrupt`` in the main
  thread at its first bytecode that is not part of building an exception:
  TensorFlow turns the failed op's status into a Python exception by calling
  its ``__init__``, and an interrupt raised inside it would replace that
  exception half-built (pybind11's "MISMATCH of original and normalized
  active exception types").  The user gets a ``KeyboardInterrupt`` whose
  context is the op's ``CancelledError`` ("interrupted (SIGINT, Ctrl-C) while
  this op waited; ...").
* watches the main thread: once it has finished (the interpreter is about to
  join the other threads), no wait lasts more than ``EXIT_GRACE_SECONDS``
  (present or later ones), so a Recv left waiting in a non-daemon thread never
  holds the process, while a training thread that outlives the main thread
  keeps its short waits (replicas handing a step over).
"""
import ctypes
import sys
import threading

_lock = threading.Lock()
_library = None

_NOTIFY_TYPE = ctypes.CFUNCTYPE(None)
_PENDING_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_add_pending_call = ctypes.pythonapi.Py_AddPendingCall
_add_pending_call.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
_add_pending_call.restype = ctypes.c_int


def _building_an_exception(frame):
    """Whether `frame` or its two callers construct an exception."""
    for _ in range(3):
        if frame is None:
            return False
        if frame.f_code.co_name in ("__init__", "__new__") and frame.f_code.co_varnames:
            target = frame.f_locals.get(frame.f_code.co_varnames[0])
            if isinstance(target, BaseException) or (
                    isinstance(target, type) and issubclass(target, BaseException)):
                return True
        frame = frame.f_back
    return False


def _pending(_):
    """A pending call: runs in the main thread between two bytecodes.  Until
    the interrupted frame builds no exception it queues itself again (Python
    runs it at each of the next bytecodes); then it queues the library's C
    function that trips SIGINT, so that no Python code runs in between."""
    if _building_an_exception(sys._getframe(1)):  # pylint: disable=protected-access
        function = _PENDING_ADDRESS
    else:
        function = ctypes.cast(_library.TfTpuEmbRaiseSigintInPython, ctypes.c_void_p).value
    _add_pending_call(function, None)
    return 0


def _notify():
    """On the library's watcher thread, after a Ctrl-C ended the waits."""
    _add_pending_call(_PENDING_ADDRESS, None)


#: Once the main thread has finished, no wait lasts longer than this.
EXIT_GRACE_SECONDS = 2.0


def _end_waits_after_main_thread():
    threading.main_thread().join()
    _library.TfTpuEmbCloseWaits(EXIT_GRACE_SECONDS)


_NOTIFY_CALLBACK = _NOTIFY_TYPE(_notify)
_PENDING_CALLBACK = _PENDING_TYPE(_pending)
_PENDING_ADDRESS = ctypes.cast(_PENDING_CALLBACK, ctypes.c_void_p).value


def install(library_path):
    """Once per process, after the op library has loaded (``_loader``)."""
    global _library
    with _lock:
        if _library is not None:
            return
        library = ctypes.CDLL(library_path)  # the loaded library: dlopen shares it
        library.TfTpuEmbCloseWaits.argtypes = [ctypes.c_double]
        library.TfTpuEmbInstallInterruptHandler.argtypes = [_NOTIFY_TYPE]
        _library = library
        threading.Thread(target=_end_waits_after_main_thread, daemon=True,
                         name="tf_tpu_emb-main-thread-watch").start()
        library.TfTpuEmbInstallInterruptHandler(_NOTIFY_CALLBACK)
