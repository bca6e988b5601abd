"""tf_tpu_emb: TensorFlow's TPU embedding programming model, running on CPU.

Importing the package imports nothing heavy (no TensorFlow): the command-line
entry points (``python -m tf_tpu_emb.demo --help``, ``python -m
tf_tpu_emb.server``) answer and set TensorFlow's log level before TensorFlow
loads.  The public names below are imported on first access.  The op library
is loaded lazily on first use (see :func:`load_library`), and loading it also
imports :mod:`tf_tpu_emb.gradients`, which registers the gradient of
``TfTpuEmb>TPUEmbeddingActivations``.
"""
import importlib

__version__ = "0.1.0"

# Public name -> (module, attribute or None for the module itself).
_PUBLIC = {
    "ops": ("tf_tpu_emb.ops", None),
    "gradients": ("tf_tpu_emb.gradients", None),
    "embedding_bag": ("tf_tpu_emb.embedding_bag", None),
    "optimizers": ("tf_tpu_emb.optimizers", None),
    "serving": ("tf_tpu_emb.serving", None),
    "TPUEmbedding": ("tf_tpu_emb.mid_level", "TPUEmbedding"),
    "TPUEmbeddingV0": ("tf_tpu_emb.v0", "TPUEmbeddingV0"),
    "export_serving": ("tf_tpu_emb.serving", "export_serving"),
    "load_library": ("tf_tpu_emb._loader", "load_library"),
    "register_all": ("tf_tpu_emb._loader", "register_all"),
    "library_path": ("tf_tpu_emb._loader", "library_path"),
}
# The optimizer classes TF's Python API lacks (tf_tpu_emb.optimizers.CLASSES;
# tests/api/test_optimizer_classes.py checks the two lists agree).
_OPTIMIZER_CLASSES = ("Adadelta", "Assign", "BoundedAdagrad", "CenteredRMSProp",
                      "FrequencyAwareAdagrad", "FrequencyEstimator", "Lion", "Momentum",
                      "OnlineYogi", "ProximalAdagrad", "ProximalYogi", "RMSProp")
_PUBLIC.update({name: ("tf_tpu_emb.optimizers", name) for name in _OPTIMIZER_CLASSES})

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    try:
        module, attribute = _PUBLIC[name]
    except KeyError:
        raise AttributeError("module 'tf_tpu_emb' has no attribute %r" % name) from None
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
