#!/usr/bin/env python3
"""Runs jax-tpu-embedding's own tests and examples on CPU devices with this
project's lowerings (tf_tpu_emb.jax): the INSTALLED jax-tpu-embedding 0.2.0
of .venv-jax, ``tf_tpu_emb.jax.install(num_sc_per_device=S)`` applied first
(tools/jax_tests/conftest.py is the harness), at 1 and at 2 CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``).  The wheel ships
no tests, so they come from the package's source repository, a checkout or a
git directory (bare or not; --rev, default HEAD):

    git clone https://github.com/jax-ml/jax-tpu-embedding /tmp/jte
    .venv-jax/bin/python tools/run_jax_tests.py --source /tmp/jte
    .venv-jax/bin/python tools/run_jax_tests.py --source /tmp/jte/.git --rev 566086d
    make jax-upstream-tests JAX_TPU_EMBEDDING_SRC=/tmp/jte

The tests also import chex and clu, which the wheel does not depend on
(`make jax-upstream-tests` installs them into .venv-jax).

Only the tests, their helper modules and the examples are copied (to a
temporary directory, or --work); the library is always the installed one.
Prints each test's outcome and, per device count, one summary line; exits
non-zero if a test or example failed that the lists below (each entry with
its reason) do not name, or a file gave no result.  Upstream's own skips are printed with
their reasons.
docs/contributing.md "jax-tpu-embedding's own tests" has the counts.
Needs nothing from the network; nothing of the package is kept here."""
import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PKG = "jax_tpu_embedding"

# The SparseCores each CPU device stands for (the conftest gives it to
# install() and to the package's device-kind table).  4: a v5p chip's count,
# which the package's tests use where they name one (the minibatching and
# primitive tests lay out 4 SparseCores per device).
DEFAULT_NUM_SC = 4

# Test files (path under jax_tpu_embedding/sparsecore/) -> a reason, for files
# that cannot run against the installed 0.2.0 wheel on CPU at all.
EXCLUDED_FILES = {
    "lib/core/primitives/tests/local_sparse_dense_matmul_test.py":
        "tests lib/core/primitives/local_sparse_dense_matmul.py, which the "
        "0.2.0 wheel does not ship",
    "lib/nn/tests/embedding_pipelining_utils_test.py":
        "tests lib/nn/embedding_pipelining_utils.py, which the 0.2.0 wheel "
        "does not ship",
    "examples/shakespeare/jax_sc_shakespeare_pipelined_jit_test.py":
        "imports lib/nn/embedding_pipelining_utils.py, which the 0.2.0 wheel "
        "does not ship",
}

# Tests not run (pytest --deselect), per test file: Class::test -> why.
DESELECTED = {
    "lib/nn/tests/minibatching_test.py": {
        "MultiHostMinibatchingTest::test_multi_host_minibatching_required":
            "simulates 4 hosts in one process (threads exchanging minibatch "
            "counts through the package's gRPC all-reduce on localhost, in its "
            "C++ preprocessing, no primitive); it aborts the whole process "
            "(SIGABRT) on this host, so the file's other tests would give no result",
    },
}

# Failures that are not this project's, per test file: fnmatch pattern of
# the test id (Class::test) -> (what the failure's message must contain, why).
# Each was read in the package's source; a failure with another message is
# unexpected.
QUANTIZATION = ("quantization_config is not supported on CPU",
                "uses quantization_config, which the CPU rules refuse "
                "(NotImplementedError): the SparseCore's quantized arithmetic is "
                "not published (docs/sparsecore_semantics.md §11)")
F64_LEARNING_RATE = (
    "Max relative difference among violations: 0.0000001",
    "1 ulp: the expected rows are w - count * lr computed in float64 from the "
    "Python learning rate, then rounded; the primitive gets the learning rate "
    "as a float32 operand, and float32 arithmetic on it gives, e.g., "
    "-4 * f32(0.001) = -0.0040000002 against f32(-0.004) = -0.0039999997 "
    "(assert_allclose's default rtol 1e-7; the constant rate passes)")
READ_ONLY_EXPECTED = (
    "assignment destination is read-only",
    "after the update ran, the test builds its expected table by writing "
    "into np.asarray(a jax.Array) (test_utils."
    "create_per_device_sharded_stacked_tables returns one), which JAX "
    "makes read-only on every backend; with that line writing into a copy "
    "(np.array) both tests pass at 2 devices, the count they are written for")
LINEN_MESH = ("unexpected keyword argument 'mesh'",
              "the source's test passes `mesh=` to linen SparseCoreEmbed; the "
              "0.2.0 wheel's field is `_mesh` (its API changed after the "
              "source revision): TypeError before any primitive runs")
EXPECTED_FAILURES = {
    "lib/core/primitives/tests/sparse_dense_matmul_csr_test.py": {
        "*::test_sc_emb_forward_pass_with_quantization_enabled": QUANTIZATION},
    "lib/nn/tests/tpu_sparse_dense_matmul_grad_test.py": {
        "*::test_custom_optimizer_stacked": READ_ONLY_EXPECTED,
        "*::test_tpu_sparse_dense_matmul_grad_with_learning_rate_*": F64_LEARNING_RATE,
        "*::test_tpu_sparse_dense_matmul_grad_sharded_two_tables_stacked": READ_ONLY_EXPECTED,
    },
    "lib/nn/tests/tpu_sparse_dense_matmul_test.py": {
        "*::test_sparse_dense_matmul_quantized": QUANTIZATION},
    "lib/flax/linen/tests/autograd_test.py": {
        "ShakespeareTest::test_shakespeare_model_loss_convergence": LINEN_MESH},
    "lib/flax/linen/tests/embed_test.py": {
        "EmbeddingLayerTest::test_forward_and_backward_with_table_stacking_*": LINEN_MESH},
}

# Tests written for at least K devices (their names say K chips, or they
# take jax.devices()[:K] and lay tables out for K), per test file: pattern ->
# K.  Below K devices their failures are expected; at K or more they must pass.
NEEDS_DEVICES = {
    "lib/nn/tests/tpu_sparse_dense_matmul_test.py": {
        "*::test_sparse_dense_matmul_two_chips_*": 2,
        "*::test_sparse_dense_matmul_two_tables*": 2,
        "*::test_sparse_dense_matmul_four_chips_*": 4,
    },
    "lib/nn/tests/tpu_sparse_dense_matmul_grad_test.py": {
        "*::test_tpu_sparse_dense_matmul_grad_sharded_two_tables*": 2,
    },
    "lib/nn/tests/embedding_test.py": {
        # its expected proto (shard_rotation, col_shift) is a 2-device one
        "*::test_create_proto_from_feature_specs": 2,
        "*::test_nd_mesh_for_init_embedding_variables": 2,
        # pops device count // 2 and appends it: the same order below 3
        "*::test_non_default_device_mesh_for_init_embedding_variables": 3,
        # expects 8 rows of each table a SparseCore: 16 SparseCores, 4 x 4
        "*::test_init_embedding_variables_for_pmap*": 4,
        "*::test_init_embedding_variables_stacking_for_jit*": 4,
    },
}

# The examples (under jax_tpu_embedding/sparsecore/), run as programs for a
# few steps.  --batch_size 32: the examples' max_ids_per_partition (64) is
# sized for a TPU slice's many partitions; 256 samples over one device's 4
# partitions exceed it, and the package's preprocessing then aborts the
# process (a CHECK in sort_and_group_coo_tensors_impl.h).  Passed: exit
# status 0 and the last logged loss below the first.
EXAMPLES = {
    "examples/shakespeare/jax_sc_shakespeare_jit_flax_nnx.py": [],
    "examples/shakespeare/jax_sc_shakespeare_jit.py": [],
}
EXAMPLE_ARGS = ["--num_steps=10", "--log_frequency=5", "--batch_size=32"]
# Examples that fail for reasons not this project's -> why.
EXPECTED_EXAMPLE_FAILURES = {
    "examples/shakespeare/jax_sc_shakespeare_jit.py": (
        "'str' object has no attribute 'from_model_output'",
        "declares its clu metrics as annotations (TrainMetrics.train_loss: "
        "metrics.Average.from_output('loss')) under `from __future__ import "
        "annotations`, so clu 0.0.12 sees strings: AttributeError \"'str' object "
        "has no attribute 'from_model_output'\" in the first training step, "
        "after the lookup"),
}

SELECT = ("*_test.py", "*/tests/*.py", "*/examples/*")


def _copy_tree(source, work):
  """Copies the tests, their helpers and the examples under work/PKG."""
  top = os.path.join(source, PKG)
  if not os.path.isdir(top):
    raise SystemExit("%s: no %s/ directory (not a jax-tpu-embedding source tree)"
                     % (source, PKG))
  for dirpath, _, names in os.walk(top):
    for name in names:
      rel = os.path.relpath(os.path.join(dirpath, name), source)
      if name in ("BUILD", "BUILD.bazel") or not any(
          fnmatch.fnmatch("/" + rel, p) for p in SELECT):
        continue
      dest = os.path.join(work, rel)
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      shutil.copy(os.path.join(source, rel), dest)


def _export(git_dir, rev, dest):
  """`git archive` of rev's jax_tpu_embedding/ into dest."""
  os.makedirs(dest)
  proc = subprocess.run(["git", "--git-dir", git_dir, "archive", rev, PKG],
                        capture_output=True)
  if proc.returncode:
    raise SystemExit("%s: neither a jax-tpu-embedding checkout nor a git directory "
                     "with %s/ at %s: %s" % (git_dir, PKG, rev, proc.stderr.decode().strip()))
  archive = proc.stdout
  subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def test_files(work, only=()):
  base = os.path.join(work, PKG, "sparsecore")
  found = []
  for dirpath, _, names in os.walk(base):
    for name in names:
      if name.endswith("_test.py"):
        rel = os.path.relpath(os.path.join(dirpath, name), base)
        if not only or any(fnmatch.fnmatch(rel, p) or rel.endswith(p) for p in only):
          found.append(rel)
  return sorted(found)


def _expected(rel, test_id, message, devices):
  for pattern, k in NEEDS_DEVICES.get(rel, {}).items():
    if devices < k and fnmatch.fnmatch(test_id, pattern):
      return "written for %d devices, run on %d" % (k, devices)
  for pattern, (needle, reason) in EXPECTED_FAILURES.get(rel, {}).items():
    if fnmatch.fnmatch(test_id, pattern) and needle in message:
      return reason
  return None


def _env(work, devices, num_sc):
  """The harness's settings: SparseCores per device, N CPU devices, this
  source tree importable (tf_tpu_emb)."""
  return dict(os.environ, TF_TPU_EMB_JAX_TESTS_NUM_SC=str(num_sc), TEST_TMPDIR=work,
              JAX_PLATFORMS="cpu",
              XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") +
                         " --xla_force_host_platform_device_count=%d" % devices).strip(),
              PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")]
                                                   if p]))


def run_file(work, rel, devices, num_sc, python, timeout):
  """pytest on one file; [(test id, outcome, message)] or None."""
  report = os.path.join(work, "report-%d.xml" % devices)
  if os.path.exists(report):
    os.remove(report)
  env = _env(work, devices, num_sc)
  try:
    proc = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
         "--junitxml", report, "-o", "junit_family=xunit1",
         os.path.join(PKG, "sparsecore", rel)] + [
             "--deselect=%s::%s" % (os.path.join(PKG, "sparsecore", rel), test)
             for test in DESELECTED.get(rel, {})],
        cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return None, "timed out after %ds" % timeout
  if not os.path.exists(report):
    return None, (proc.stdout + proc.stderr)[-2000:]
  results = []
  for case in ET.parse(report).getroot().iter("testcase"):
    test_id = "%s::%s" % (case.get("classname", "").split(".")[-1], case.get("name"))
    outcome, message = "passed", ""
    for child in case:
      if child.tag in ("failure", "error"):
        outcome = "failed"
        message = "%s\n%s" % (child.get("message") or "", child.text or "")
        break
      if child.tag == "skipped":
        outcome, message = "skipped", (child.get("message") or "")[:200]
    results.append((test_id, outcome, message))
  if not results:  # an import error is a collection error: no testcase
    return None, (proc.stdout + proc.stderr)[-2000:]
  return results, ""


def run_example(work, rel, devices, num_sc, python, timeout):
  """The example as a program under the harness: (passed, detail)."""
  path = os.path.join(PKG, "sparsecore", rel)
  launcher = ("import runpy, sys; sys.path.insert(0, '.'); import conftest; "
              "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
  checkpoints = os.path.join(work, "checkpoints-%d-%s" % (devices, os.path.basename(rel)))
  shutil.rmtree(checkpoints, ignore_errors=True)
  try:
    proc = subprocess.run(
        [python, "-c", launcher, path, *EXAMPLE_ARGS, "--checkpoint_dir=" + checkpoints],
        cwd=work, env=_env(work, devices, num_sc), capture_output=True, text=True,
        timeout=timeout)
  except subprocess.TimeoutExpired:
    return False, "timed out after %ds" % timeout, ""
  out = proc.stdout + proc.stderr
  losses = [float(m) for m in re.findall(r"Loss(?:es)?\s*[=:]\s*([0-9.eE+-]+)", out)]
  if proc.returncode:
    lines = out.splitlines()
    last = ([s for s in lines if "Error:" in s and not s.startswith(" ")] or
            [s for s in lines if s.strip() and not s.startswith((" ", "I1", "W0"))])
    return False, "exit status %d: %s" % (proc.returncode, last[-1][:300] if last else ""), out
  if len(losses) >= 2 and not losses[-1] < losses[0]:
    return False, "the loss did not fall: %s" % losses, out
  shown = ", ".join("%.4f" % loss for loss in losses) if losses else "not logged"
  return True, "losses %s" % shown, out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--source", required=True,
                      help="a jax-tpu-embedding checkout (holds jax_tpu_embedding/) or git "
                           "directory (bare or .git)")
  parser.add_argument("--rev", help="take the tests from this revision of --source's git "
                                    "directory (default: the checkout's files, or HEAD)")
  parser.add_argument("--work", help="copy the tests here (default: a temporary directory)")
  parser.add_argument("--devices", default="1,2", help="CPU device counts (default 1,2)")
  parser.add_argument("--num-sc", type=int, default=DEFAULT_NUM_SC,
                      help="SparseCores per CPU device (default %d)" % DEFAULT_NUM_SC)
  parser.add_argument("--python", default=sys.executable)
  parser.add_argument("--timeout", type=int, default=1800, help="seconds per file and device count")
  parser.add_argument("--no-examples", action="store_true", help="the tests alone")
  parser.add_argument("--examples-only", action="store_true", help="the examples alone")
  parser.add_argument("files", nargs="*",
                      help="only these test files (paths under jax_tpu_embedding/sparsecore/ "
                           "or their endings, fnmatch patterns)")
  args = parser.parse_args(argv)
  counts = [int(c) for c in args.devices.split(",")]
  work = args.work or tempfile.mkdtemp(prefix="jax_tests_")
  try:
    source = args.source
    if args.rev or not os.path.isdir(os.path.join(source, PKG)):
      git_dir = (os.path.join(source, ".git")
                 if os.path.isdir(os.path.join(source, ".git")) else source)
      source = os.path.join(work, "export")
      if os.path.exists(source):
        shutil.rmtree(source)
      _export(git_dir, args.rev or "HEAD", source)
    tree = os.path.join(work, "tree")
    if os.path.exists(tree):
      shutil.rmtree(tree)
    _copy_tree(source, tree)
    shutil.copy(os.path.join(HERE, "jax_tests", "conftest.py"), tree)
    files = [] if args.examples_only else test_files(tree, args.files)
    if not files and not args.examples_only:
      print("no test files selected")
      return 1
    unexpected = 0
    totals = {n: dict(passed=0, expected_failure=0, failed=0, skipped=0, excluded=0)
              for n in counts}
    for rel in files:
      if rel in EXCLUDED_FILES:
        print("%-70s excluded: %s" % (rel, EXCLUDED_FILES[rel]))
        for n in counts:
          totals[n]["excluded"] += 1
        continue
      for n in counts:
        results, error = run_file(tree, rel, n, args.num_sc, args.python, args.timeout)
        if results is None:
          print("%-70s %d device(s): NO RESULT\n%s" % (rel, n, error))
          unexpected += 1
          totals[n]["failed"] += 1
          continue
        for test, reason in DESELECTED.get(rel, {}).items():
          print("    %-7s %s  (not run: %s)" % ("EXCLUDED", test, reason))
          totals[n]["excluded"] += 1
        tally = dict(passed=0, failed=0, skipped=0)
        for test_id, outcome, message in results:
          tally[outcome] += 1
          line = "    %-7s %s" % (outcome.upper(), test_id)
          if outcome == "failed":
            reason = _expected(rel, test_id, message, n)
            if reason:
              totals[n]["expected_failure"] += 1
              line += "  (expected: %s)" % reason
            else:
              totals[n]["failed"] += 1
              unexpected += 1
              line += "  %s" % message.strip().splitlines()[0][:300] if message.strip() else ""
          else:
            totals[n][outcome] += 1
            if outcome == "skipped":
              line += "  (upstream's skip: %s)" % message
          if outcome != "passed" or os.environ.get("RUN_JAX_TESTS_VERBOSE"):
            print(line)
        print("%-70s %d device(s): %d passed, %d failed, %d skipped"
              % (rel, n, tally["passed"], tally["failed"], tally["skipped"]))
    examples = [] if (args.no_examples or args.files) else [
        rel for rel in sorted(EXAMPLES)
        if os.path.exists(os.path.join(tree, PKG, "sparsecore", rel))]
    for rel in examples:
      for n in counts:
        ok, detail, out = run_example(tree, rel, n, args.num_sc, args.python, args.timeout)
        needle, reason = EXPECTED_EXAMPLE_FAILURES.get(rel, ("", None))
        reason = None if ok or needle not in out else reason
        if ok:
          totals[n]["passed"] += 1
        elif reason:
          totals[n]["expected_failure"] += 1
          detail += "  (expected: %s)" % reason
        else:
          totals[n]["failed"] += 1
          unexpected += 1
        print("%-70s %d device(s): example %s, %s"
              % (rel, n, "PASSED" if ok else "FAILED", detail))
    for n in counts:
      t = totals[n]
      print("SUMMARY %d device(s), %d SparseCores each: %d passed, %d failed as expected, "
            "%d failed unexpectedly, %d skipped, %d file(s) excluded"
            % (n, args.num_sc, t["passed"], t["expected_failure"], t["failed"],
               t["skipped"], t["excluded"]))
    return 1 if unexpected else 0
  finally:
    if not args.work:
      shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
