"""The CPU stand-in for a SparseCore TPU, for JAX programs.

``python -m tf_tpu_emb.run --jax --replicas N SCRIPT`` (or
``install(replicas=N)`` before the program imports jax) presents N CPU
devices as N SparseCore TPU chips of S SparseCores each (S =
``tf_tpu_emb.chips.SPARSECORES_PER_CHIP``, 4 as on a TPU v5p;
``num_sc_per_device=`` / ``--sparsecores-per-chip`` / ``$TF_TPU_EMB_SPARSECORES``
change it to another count jax-tpu-embedding knows: 2 or 4) to a program
written for a TPU, unchanged:

* the environment, before jax starts its CPU backend:
  ``XLA_FLAGS=--xla_force_host_platform_device_count=N``,
  ``JAX_PLATFORMS=cpu``, and ``KERAS_BACKEND=jax`` unless set;
* :func:`tf_tpu_emb.jax.install` with ``num_sc_per_device=S`` (the CPU
  lowerings of jax-tpu-embedding's primitives);
* public names rebound (restored by :func:`uninstall`):

  ====================================================  =====================================
  public name                                           under the stand-in
  ====================================================  =====================================
  ``jax.devices``, ``jax.local_devices``,               ``backend="tpu"`` answers with the
  ``jax.device_count``, ``jax.local_device_count``      CPU devices (other backends as jax)
  ``jax_tpu_embedding.sparsecore.utils.utils.``         S for a CPU device (others as the
  ``num_sparsecores_per_device``                        package: by ``device_kind``)
  ====================================================  =====================================

  Every caller in jax-tpu-embedding 0.2.0 and Keras-RS 0.4.0 reaches
  ``num_sparsecores_per_device`` through the module attribute
  (``utils.num_sparsecores_per_device(...)``), so the rebinding reaches them.

**Seam** (a private fact a client reads; guarded by
tests/jax_frontend/test_standin.py, which fails when the client changes):

* Keras-RS 0.4.0 decides whether SparseCores exist in
  ``keras_rs.src.layers.embedding.base_distributed_embedding.
  DistributedEmbedding._has_sparsecore(self)``, which reads
  ``jax.devices("tpu")[0].device_kind`` and accepts only ``"TPU v5"`` and
  ``"TPU v6 lite"``.  A jax ``Device`` is a C++ object whose ``device_kind``
  is ``"cpu"`` and has no setter, and a proxy object in a device's place
  fails where jax puts data on it (``batched_device_put(): incompatible
  function arguments``, with jax 0.12); so that one method is replaced
  on that base class, which the JAX layer inherits it from (answering True
  on the JAX backend), when the module is imported (an import hook waits
  for it) --
  ``placement="sparsecore"`` then builds, and ``placement="auto"`` resolves
  to ``"sparsecore"``, as on a TPU.

What it cannot be: the devices stay CPU devices (``device.platform`` and
``device_kind`` are ``"cpu"``, ``jax.default_backend()`` is ``"cpu"``); a
program that branches on them sees a CPU.

Nothing here imports TensorFlow.
"""
import importlib
import importlib.abc
import inspect
import os
import sys
import threading

from tf_tpu_emb import chips

__all__ = ["install", "uninstall", "installed", "KERAS_RS_BASE_MODULE", "JTE_UTILS_MODULE"]

# The modules whose names are rebound (module docstring).
JTE_UTILS_MODULE = "jax_tpu_embedding.sparsecore.utils.utils"
KERAS_RS_BASE_MODULE = "keras_rs.src.layers.embedding.base_distributed_embedding"

_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
_JAX_DEVICE_NAMES = ("devices", "local_devices", "device_count", "local_device_count")

_lock = threading.Lock()
_installed = None   # (replicas, num_sc_per_device) while installed
_rebound = []       # (object, attribute, original), restored by uninstall()
_hook = None        # the import hook waiting for Keras-RS, if any


def installed():
  """(replicas, SparseCores per chip) of the installed stand-in, or None."""
  return _installed


def _set_environment(replicas):
  flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
           if not f.startswith(_DEVICE_COUNT_FLAG + "=")]
  os.environ["XLA_FLAGS"] = " ".join(flags + [f"{_DEVICE_COUNT_FLAG}={replicas}"])
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ.setdefault("KERAS_BACKEND", "jax")


def _rebind(obj, name, value):
  _rebound.append((obj, name, getattr(obj, name)))
  setattr(obj, name, value)


def _tpu_as_cpu(backend):
  return "cpu" if isinstance(backend, str) and backend.lower() == "tpu" else backend


def _device_function(name, original):
  parameters = list(inspect.signature(original).parameters)
  position = parameters.index("backend")  # local_devices: (process_index, backend, ...)

  def answer(*args, **kwargs):
    if len(args) > position:
      args = args[:position] + (_tpu_as_cpu(args[position]),) + args[position + 1:]
    elif "backend" in kwargs:
      kwargs["backend"] = _tpu_as_cpu(kwargs["backend"])
    return original(*args, **kwargs)
  answer.__name__ = name
  answer.__doc__ = ("The stand-in's jax.%s: backend 'tpu' is the CPU devices "
                    "(tf_tpu_emb.jax.standin).\n\n%s" % (name, original.__doc__))
  answer.__wrapped__ = original
  return answer


def _sparsecores_function(original, num_sc, jax):
  def num_sparsecores_per_device(device=None):
    target = device if device is not None else jax.devices()[0]
    if getattr(target, "device_kind", None) == "cpu":
      return num_sc
    return original(device)
  num_sparsecores_per_device.__doc__ = (
      "The stand-in's answer: %d for a CPU device (tf_tpu_emb.jax.standin)." % num_sc)
  num_sparsecores_per_device.__wrapped__ = original
  return num_sparsecores_per_device


def _patch_keras_rs(module):
  """The seam: Keras-RS's SparseCore check answers True on the JAX backend."""
  cls = module.DistributedEmbedding
  original = cls.__dict__["_has_sparsecore"]

  def _has_sparsecore(self):
    import keras  # pylint: disable=import-outside-toplevel
    if keras.backend.backend() == "jax" and _installed is not None:
      return True
    return original(self)
  _has_sparsecore.__wrapped__ = original
  _rebind(cls, "_has_sparsecore", _has_sparsecore)


class _AfterImport(importlib.abc.MetaPathFinder):
  """Runs callback(module) right after `name` is first imported."""

  def __init__(self, name, callback):
    self.name, self.callback = name, callback

  def find_spec(self, fullname, path, target=None):
    if fullname != self.name:
      return None
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec = finder.find_spec(fullname, path, target)
      if spec is not None:
        break
    else:
      return None
    loader, callback = spec.loader, self.callback
    exec_module = loader.exec_module

    def exec_then_patch(module):
      exec_module(module)
      callback(module)
      loader.exec_module = exec_module
    loader.exec_module = exec_then_patch
    self.remove()
    return spec

  def remove(self):
    if self in sys.meta_path:
      sys.meta_path.remove(self)


def _sparsecores(num_sc_per_device):
  if num_sc_per_device is None:
    num_sc_per_device = os.environ.get("TF_TPU_EMB_SPARSECORES", "") or chips.SPARSECORES_PER_CHIP
  try:
    num_sc = int(num_sc_per_device)
  except (TypeError, ValueError):
    num_sc = None
  from jax_tpu_embedding.sparsecore.utils import utils  # pylint: disable=import-outside-toplevel
  known = sorted(set(utils.NUM_SC_PER_DEVICE_MAP.values()))
  if num_sc not in known:
    raise ValueError(f"num_sc_per_device: {num_sc_per_device!r} SparseCores per chip; "
                     f"jax-tpu-embedding knows chips of {known}")
  return num_sc


def install(replicas=1, num_sc_per_device=None):
  """Presents `replicas` CPU devices as SparseCore TPU chips (module doc).

  Call it before the program's first use of jax: XLA reads the device count
  once, when jax starts its CPU backend.  RuntimeError if jax has already
  started it with another count, or if a stand-in is installed.
  """
  global _installed, _hook
  if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
    raise ValueError(f"replicas: {replicas!r} is not a positive integer")
  with _lock:
    if _installed is not None:
      raise RuntimeError(f"a JAX stand-in is already installed: {_installed}")
    _set_environment(replicas)
    num_sc = _sparsecores(num_sc_per_device)  # imports jax
    import jax  # pylint: disable=import-outside-toplevel
    cpu = jax.devices("cpu")
    if len(cpu) != replicas:
      raise RuntimeError(
          f"jax started its CPU backend with {len(cpu)} devices before the stand-in "
          f"could ask for {replicas} ({_DEVICE_COUNT_FLAG}): install it before jax runs")
    import tf_tpu_emb.jax as tj  # pylint: disable=import-outside-toplevel
    tj.install(num_sc_per_device=num_sc)
    for name in _JAX_DEVICE_NAMES:
      _rebind(jax, name, _device_function(name, getattr(jax, name)))
    utils = importlib.import_module(JTE_UTILS_MODULE)
    _rebind(utils, "num_sparsecores_per_device",
            _sparsecores_function(utils.num_sparsecores_per_device, num_sc, jax))
    _installed = (replicas, num_sc)
    if KERAS_RS_BASE_MODULE in sys.modules:
      _patch_keras_rs(sys.modules[KERAS_RS_BASE_MODULE])
    else:
      _hook = _AfterImport(KERAS_RS_BASE_MODULE, _patch_keras_rs)
      sys.meta_path.insert(0, _hook)


def uninstall():
  """Restores every rebound name (the FFI lowerings stay registered)."""
  global _installed, _hook
  with _lock:
    if _hook is not None:
      _hook.remove()
      _hook = None
    while _rebound:
      obj, name, original = _rebound.pop()
      setattr(obj, name, original)
    _installed = None
