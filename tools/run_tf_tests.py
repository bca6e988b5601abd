#!/usr/bin/env python3
"""Runs TensorFlow's own tests of the SparseCore ops and of TPUEmbeddingV2 on
this library: the CPU ops test with the op library loaded, the
``TPUEmbeddingV2`` tests on the stand-in SparseCore TPU (tools/tf_tests/
conftest.py is the harness).  TF's wheel ships no tests, so they come from a
TensorFlow source tree (of the TF version installed, or near it):

    git clone --depth 1 --branch v2.21.0 https://github.com/tensorflow/tensorflow /tmp/tf
    .venv/bin/python tools/run_tf_tests.py --tf-source /tmp/tf

Prints, per test file and replica count, TF's test counts (pytest's summary
line), and exits non-zero if any run had a failure not in EXPECTED_FAILURES (which
says why those fail; docs/guides/sparsecore.md "TensorFlow's own
tests").  Needs nothing from the network; the files are not kept here (they
are TensorFlow's)."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# test file (under tensorflow/python/tpu) -> stand-in replica counts (0: the
# op library alone, no stand-in).  TPUEmbeddingV2's own test is written for
# one replica (it compares with TPUEmbeddingForServing on one replica's batch).
SUITES = {
    "tpu_embedding_v3_cpu_ops_test.py": [0],
    "tpu_embedding_v3_test.py": [1],
    "tpu_embedding_v3_additional_test.py": [1, 2, 4],
    "tpu_embedding_v3_checkpoint_test.py": [1, 2, 4],
}
# Failures that are not the library's (checked against TF 2.21's own code):
# the initialization test expects the table initializer's rows in id order,
# which TF 2.21's TPUEmbeddingV2 does not produce (its
# _initialize_stacked_table_for_device calls the initializer with a chip
# shard's shape, rows in variable order; later TF changed that); the
# pipelining tests multiply float32 activations by an int32 variable in the
# test's own step (TypeError while tracing, before any embedding op runs).
EXPECTED_FAILURES = {
    "tpu_embedding_v3_test.py": {"test_embedding_initialization"} | {
        "test_pipelining_and_summary_recording%d" % k for k in range(4)},
}


def run(source, name, replicas, python):
    with tempfile.TemporaryDirectory() as work:
        shutil.copy(os.path.join(source, "tensorflow", "python", "tpu", name), work)
        shutil.copy(os.path.join(HERE, "tf_tests", "conftest.py"), work)
        env = dict(os.environ, TF_TPU_EMB_TF_TESTS_REPLICAS=str(replicas),
                   TEST_TMPDIR=work)
        proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "-rf", name], cwd=work, env=env, capture_output=True,
                              text=True)
    summary = [line for line in proc.stdout.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    failed = [line.split("::")[-1].split(" ")[0] for line in proc.stdout.splitlines()
              if line.startswith("FAILED ")]
    return (summary[-1].strip("= ") if summary else "no result (rc %d)" % proc.returncode,
            failed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tf-source", required=True,
                        help="a TensorFlow source tree (holds tensorflow/python/tpu)")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    unexpected = 0
    for name, counts in SUITES.items():
        if not os.path.exists(os.path.join(args.tf_source, "tensorflow", "python", "tpu", name)):
            print("%-40s not in this source tree" % name)
            continue
        for replicas in counts:
            summary, failed = run(args.tf_source, name, replicas, args.python)
            where = "op library" if replicas == 0 else "stand-in, %d replica(s)" % replicas
            print("%-40s %-24s %s" % (name, where, summary))
            for test in failed:
                known = test in EXPECTED_FAILURES.get(name, ())
                print("    failed: %s%s" % (test, " (expected: see EXPECTED_FAILURES)"
                                             if known else ""))
                unexpected += not known
            unexpected += summary.startswith("no result")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
