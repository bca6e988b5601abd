"""benchmarks/bench_steady.py (the profiling and build-comparison loop): its
--quick run completes for the forward and a training mode, with one and with
several steps per tf.function call, prints the pid line perf attaches to
before the timed loop, and reports a positive rate."""
import os
import re

import pytest

import harness

pytestmark = pytest.mark.system  # child processes, servers or compilers

BENCH = os.path.join(harness.ROOT, "benchmarks", "bench_steady.py")


# CI (the sanitizer lane) runs the training mode with several steps a call;
# the forward mode and one step a call are the `long` tier's (end-to-end
# runs of a benchmark beside the engine tests of the same code).
@pytest.mark.parametrize("mode,per_call", [pytest.param("forward", 1, marks=pytest.mark.long),
                                           pytest.param("sgd", 1, marks=pytest.mark.long),
                                           ("sgd", 2)])
def test_quick_run(mode, per_call):
    result = harness.run_python([BENCH, "--quick", "--mode", mode, "--steps", "3",
                                 "--warmup", "1", "--steps-per-call", str(per_call)],
                                timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    pid = [i for i, line in enumerate(lines) if re.fullmatch(r"PERF: \d+", line)]
    rate = [i for i, line in enumerate(lines)
            if re.match(r"%s dim 64, 8 x 100000 rows: [\d.]+ ms/step, [\d.]+ CPU ms/step, "
                        r"\d+ samples/s$" % mode, line)]
    assert pid and rate and pid[0] < rate[0], result.stdout
    assert float(re.search(r"(\d+) samples/s", lines[rate[0]]).group(1)) > 0
