"""tf_tpu_emb.jax.install(): what it changes, and that it needs no TensorFlow.
A child process, so that the lookup runs once before install()."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax_tpu_embedding")

pytestmark = [pytest.mark.jax, pytest.mark.system]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import numpy as np
    import sc_programs
    from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec
    prog = sc_programs.Program(1, 2, 64, 8, embedding_spec.SGDOptimizerSpec(learning_rate=0.1), 16)
    ids, weights = sc_programs.ragged(np.random.default_rng(0), 16, 64)
    inputs = prog.preprocess({{"f0": ids}}, {{"f0": weights}})
    table = np.ones((64, 8), np.float32)
    try:
      prog.lookup(inputs, prog.variables(table))
      print("BEFORE: ran")
    except Exception as e:  # the package's TPU custom call
      print("BEFORE:", type(e).__name__, str(e).splitlines()[0])
    import tf_tpu_emb.jax
    tf_tpu_emb.jax.install()
    tf_tpu_emb.jax.install()  # idempotent
    prog.__dict__.pop("lookup")  # a fresh jit: lowered again with the CPU rule
    act = np.asarray(prog.lookup(inputs, prog.variables(table))["f0"])
    sums = np.array([w.sum() for w in weights], np.float32)
    print("AFTER:", bool(np.allclose(act, sums[:, None] * np.ones(8), rtol=1e-6)))
    print("TENSORFLOW:", "tensorflow" in sys.modules)
""")


def test_install_replaces_the_tpu_custom_call_and_imports_no_tensorflow():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-c", CHILD.format(tests=os.path.dirname(__file__))],
                       capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
  assert "No registered implementation" in lines["BEFORE"], out.stdout
  assert "SparseDenseMatmulOp" in lines["BEFORE"], out.stdout
  assert lines["AFTER"] == "True", out.stdout
  assert lines["TENSORFLOW"] == "False", out.stdout
