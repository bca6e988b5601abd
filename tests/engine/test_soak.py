"""Soak: resident memory stays flat over 10,000 training steps and 1,000
configure / shutdown cycles (run in a child process, tests/engine/soak_script.py).

The bounds are generous on purpose (allocator and TensorFlow caches move
RSS by a few MiB): a leak of one batch per step (~10 KiB) or of one table per
configure (12.5 MiB here) exceeds them many times over."""
import json
import os

import pytest

import harness  # tests/common: the one way to start a child process

pytestmark = [pytest.mark.system, pytest.mark.slow]  # a child process, minutes

TRAIN_GROWTH_MIB = 48     # after the first 1,000 steps
CONFIGURE_GROWTH_MIB = 64  # after the first 100 cycles
# Under `make sanitize`, AddressSanitizer keeps freed memory in a quarantine
# (256 MiB by default) before reusing it: RSS grows by up to that much.
ASAN_QUARANTINE_MIB = 256 if "libasan" in os.environ.get("LD_PRELOAD", "") else 0


def test_rss_flat_over_training_steps_and_configure_cycles():
    out = harness.run_python([harness.script(__file__, "soak_script.py"), "10000", "1000"],
                             timeout=1800)
    assert out.returncode == 0, harness.describe(out)
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    print(figures)
    train, configure = figures["train"], figures["configure"]
    assert len(train) == 20 and len(configure) == 20
    assert max(train[2:]) - train[1] < TRAIN_GROWTH_MIB + ASAN_QUARANTINE_MIB, figures
    assert max(configure[2:]) - configure[1] < CONFIGURE_GROWTH_MIB + ASAN_QUARANTINE_MIB, figures
