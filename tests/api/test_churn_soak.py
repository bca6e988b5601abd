"""1,000 build/destroy cycles of a TPUEmbedding keep the resident set flat
(a child process, churn_soak_script.py; engine names are pooled, so TF's
eager kernel cache stops growing).

Not `slow`: the default lane runs it on the plain build.  Under
AddressSanitizer the freed memory sits in its quarantine and the resident
set measures the sanitizer, not the engine (tests/engine/test_soak.py says
the same of its soak); the churn's memory errors are the sanitizer lane's
test_lifecycle_stress.py churn beside a trainer.
"""
import json

import pytest

import harness

pytestmark = [pytest.mark.system, pytest.mark.long]

CYCLES = 1000
# After the first 100 cycles.  Before the name pool, TF's eager kernel cache
# grew by one set of kernels per object: ~90 MiB over 1,000 cycles.
GROWTH_MIB = 24


def test_build_destroy_churn_keeps_rss_flat():
    out = harness.run_python([harness.script(__file__, "churn_soak_script.py"), str(CYCLES)],
                             timeout=1800)
    assert out.returncode == 0, harness.describe(out)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    print("churn soak:", figures)
    rss = figures["rss_mib"]
    assert len(rss) == 20
    assert max(rss[2:]) - rss[1] < GROWTH_MIB, figures
    # Names in use at once: the live object plus the functions of objects not
    # yet collected (the child collects every CYCLES / 20 cycles); never one per object.
    assert figures["names_made"] <= CYCLES // 20, figures
