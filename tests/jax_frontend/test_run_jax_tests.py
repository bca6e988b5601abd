"""tools/run_jax_tests.py, the runner of jax-tpu-embedding's own tests on
CPU devices: its harness on a source tree written here (always), and a
small subset of the package's real tests where a source tree is given
(JAX_TPU_EMBEDDING_SRC: a checkout or git directory; CI has no network to
fetch one)."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax_tpu_embedding")

pytestmark = pytest.mark.jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "run_jax_tests.py")


def run_tool(*args):
  return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True,
                        cwd=ROOT, timeout=1800)


def summary(stdout, devices):
  m = re.search(r"SUMMARY %d device\(s\), \d+ SparseCores each: (\d+) passed, (\d+) failed as "
                r"expected, (\d+) failed unexpectedly, (\d+) skipped" % devices, stdout)
  assert m, stdout
  return tuple(int(x) for x in m.groups())


def write_source(root):
  """A source tree in the package's layout: a test beside its helper
  module, which the wheel does not ship, and a library module that must NOT
  be taken from the tree (the installed one is)."""
  tests = root / "jax_tpu_embedding" / "sparsecore" / "lib" / "nn" / "tests"
  tests.mkdir(parents=True)
  (tests / "helper.py").write_text("VALUE = 7\n")
  (root / "jax_tpu_embedding" / "sparsecore" / "lib" / "nn" / "embedding.py").write_text(
      "raise ImportError('the source tree library module was imported')\n")
  (tests / "harness_test.py").write_text(textwrap.dedent("""\
      from absl.testing import absltest
      import jax
      from jax_tpu_embedding.sparsecore.lib.nn import embedding
      from jax_tpu_embedding.sparsecore.lib.nn.tests import helper
      from jax_tpu_embedding.sparsecore.utils import utils


      class HarnessTest(absltest.TestCase):

        def test_installed_package_and_helper(self):
          self.assertIn("site-packages", embedding.__file__)
          self.assertEqual(helper.VALUE, 7)

        def test_devices_and_sparsecores(self):
          self.assertEqual(utils.num_sparsecores_per_device(), 3)
          self.assertIn(len(jax.devices()), (1, 2))

        def test_fails(self):
          self.assertEqual(len(jax.devices()), 1)

        def test_skips(self):
          self.skipTest("needs a TPU")
      """))


def test_harness_on_a_source_tree(tmp_path):
  src = tmp_path / "src"
  write_source(src)
  proc = run_tool("--source", str(src), "--num-sc", "3", "--work", str(tmp_path / "work"))
  # test_fails fails at 2 devices only, and is not an expected failure.
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert summary(proc.stdout, 1) == (3, 0, 0, 1)
  assert summary(proc.stdout, 2) == (2, 0, 1, 1)
  assert "(upstream's skip: needs a TPU)" in proc.stdout
  assert re.search(r"FAILED\s+HarnessTest::test_fails", proc.stdout)


def test_source_that_is_not_a_tree(tmp_path):
  proc = run_tool("--source", str(tmp_path))
  assert proc.returncode != 0
  assert "neither a jax-tpu-embedding checkout nor a git directory" in proc.stderr


SRC = os.environ.get("JAX_TPU_EMBEDDING_SRC")


@pytest.mark.skipif(not SRC, reason="JAX_TPU_EMBEDDING_SRC (a jax-tpu-embedding checkout or git "
                    "directory) is not set: its tests are not in the wheel and CI cannot "
                    "fetch them")
def test_upstream_subset():
  """The lookup primitive's tests, with and without minibatching: at 1 and 2
  devices all pass but the quantization test (an expected failure)."""
  proc = run_tool("--source", SRC, "sparse_dense_matmul_csr_test.py",
                  "sparse_dense_matmul_csr_minibatching_test.py")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  for devices in (1, 2):
    passed, expected, unexpected, _ = summary(proc.stdout, devices)
    assert passed >= 10 and expected == 1 and unexpected == 0, proc.stdout
