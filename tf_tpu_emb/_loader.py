"""Lazy loading of the op library, with a TensorFlow version check.

Importing :mod:`tf_tpu_emb` never touches the shared library; the first use of
an op (or an explicit :func:`load_library`) loads it.  A library built against
another TensorFlow minor version is refused with a message that says how to
rebuild, instead of failing later with an ``undefined symbol`` or a crash.
"""
import os
import threading

_LIB_FILE = "_tf_tpu_emb_ops.so"
#: The namespace of every op the library registers (TF owns the bare names).
PREFIX = "TfTpuEmb>"
_lock = threading.Lock()
_module = None


def library_path():
    """Absolute path of the compiled op library inside the package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _LIB_FILE)


def _rebuild_hint():
    return ("Rebuild it against the installed TensorFlow with "
            "`pip install --no-build-isolation --force-reinstall --no-deps .` "
            "(or `make build`) from the tf_tpu_emb source tree.")


def check_version(running_version, built_version):
    """Raises ImportError unless the two TensorFlow versions share major.minor."""
    if running_version.split(".")[:2] != built_version.split(".")[:2]:
        raise ImportError(
            "tf_tpu_emb's op library was built against TensorFlow %s, but "
            "TensorFlow %s is installed; C++ op libraries are not binary "
            "compatible across TensorFlow minor versions. %s"
            % (built_version, running_version, _rebuild_hint()))


def load_library():
    """Loads (once) and returns the op library module.

    Call it before ``tf.saved_model.load`` of a model that contains tf_tpu_emb
    ops, otherwise TensorFlow reports ``Op type not registered``.
    """
    global _module
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        import tensorflow as tf

        path = library_path()
        try:
            from tf_tpu_emb import _build_info
        except ImportError:
            raise ImportError(
                "tf_tpu_emb's op library has not been built (%s is missing). %s"
                % (path, _rebuild_hint())) from None
        check_version(tf.__version__, _build_info.TF_VERSION)
        if not os.path.exists(path):
            raise ImportError("tf_tpu_emb's op library is missing at %s. %s"
                              % (path, _rebuild_hint()))
        try:
            module = tf.load_op_library(path)
        except tf.errors.NotFoundError as e:
            raise ImportError("Loading %s failed: %s. %s"
                              % (path, e, _rebuild_hint())) from e
        # Any graph with the op can now be built: make it differentiable.
        from tf_tpu_emb import activation_gradient  # pylint: disable=import-outside-toplevel
        activation_gradient.register(PREFIX + "TPUEmbeddingActivations")
        # Ctrl-C and the main thread's end reach a waiting Recv.
        from tf_tpu_emb import waits  # pylint: disable=import-outside-toplevel
        waits.install(path)
        _module = module
        return _module


register_all = load_library
