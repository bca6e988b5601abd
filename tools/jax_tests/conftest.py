"""The harness under which jax-tpu-embedding's own tests and examples run on
CPU devices with this project's lowerings (tools/run_jax_tests.py copies the
package's test files and examples beside this file, under
``jax_tpu_embedding/``).

* The package itself is the INSTALLED one (jax-tpu-embedding 0.2.0 in
  .venv-jax); the copied tree holds only tests, their helpers and the
  examples, which the wheel does not ship.  Each installed package's
  ``__path__`` is extended with its copied directory, so that
  ``jax_tpu_embedding.sparsecore.lib.nn.tests.test_utils`` and
  ``jax_tpu_embedding.sparsecore.examples...`` import from the copy and every
  library module still from the wheel.
* ``tf_tpu_emb.jax.install(num_sc_per_device=S)`` with
  ``TF_TPU_EMB_JAX_TESTS_NUM_SC=S`` registers the CPU lowerings.
* jax-tpu-embedding asks ``utils.num_sparsecores_per_device`` for a device's
  SparseCore count, which it knows only for TPU device kinds; the package's
  table ``NUM_SC_PER_DEVICE_MAP`` gets the entry ``"cpu": S`` (the minimal
  way to say how many SparseCores a CPU device stands for).
* The device count comes from ``XLA_FLAGS=--xla_force_host_platform_device_count``
  (set by the tool); absltest's flags are marked parsed under pytest.
"""
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_SC = int(os.environ.get("TF_TPU_EMB_JAX_TESTS_NUM_SC", "4"))

sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]


def _extend_paths():
  """Adds each copied directory to the installed package of the same name."""
  import jax_tpu_embedding  # noqa: F401  (loaded before its __path__ is extended)
  todo = [("jax_tpu_embedding", os.path.join(HERE, "jax_tpu_embedding"))]
  while todo:
    name, copy = todo.pop()
    try:
      package = importlib.import_module(name)
    except ImportError:
      continue  # not in the wheel: its copy is reached through the parent
    if not hasattr(package, "__path__"):
      continue
    if copy not in package.__path__:
      package.__path__.append(copy)
    for entry in sorted(os.listdir(copy)):
      sub = os.path.join(copy, entry)
      if os.path.isdir(sub) and entry.isidentifier():
        todo.append((name + "." + entry, sub))


_extend_paths()

from jax_tpu_embedding.sparsecore.utils import utils as _jte_utils  # noqa: E402

import tf_tpu_emb.jax  # noqa: E402

_jte_utils.NUM_SC_PER_DEVICE_MAP.setdefault("cpu", NUM_SC)
tf_tpu_emb.jax.install(num_sc_per_device=NUM_SC)

from absl import flags  # noqa: E402

if not flags.FLAGS.is_parsed():
  flags.FLAGS.mark_as_parsed()
