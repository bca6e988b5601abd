"""Several replicas: one queue per tensor core, device_ordinal k (or -1 on
/CPU:k) feeds replica k and Recv on /CPU:k pops it.  TF's logical CPU devices
can only be configured before its runtime starts, so the checks run in fresh
processes (tests/engine/*_script.py, started through tests/common/harness.py)."""
import pytest

import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.system  # child processes, servers or compilers


def _run_script(name):
    proc = harness.run_python([harness.script(__file__, name)], timeout=180)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)


def test_multi_replica_queues():
    _run_script("multi_replica_script.py")


def test_invalid_send_fails_the_step_for_every_replica():
    _run_script("abort_step_script.py")
