"""The coverage-guided fuzz targets (fuzz/targets/*.cc) in CI: every target
built once under ASan+UBSan with libFuzzer (fuzz/build.py) and run about
6 s from its committed seeds, its regression inputs
(fuzz/regressions/<target>/, replayed first) and the working corpus of
earlier runs (fuzz/run.py); any finding fails the test, with its input and
REPLAY.txt under out/fuzz-cov/findings/<target>/.  The sanitizer lane runs
this file (the default lane leaves it out; `make fuzz-deps` installs
clang-14)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "fuzz"))

import build as fuzz_build  # noqa: E402  (fuzz/build.py)

pytestmark = pytest.mark.system  # compiles and runs child processes

SECONDS = int(os.environ.get("TF_TPU_EMB_FUZZ_COV_SECONDS", "6"))
TARGETS = fuzz_build.targets()
LINE = re.compile(r"^fuzz-cov (\S+): (\d+) execs, (\d+) edges, (\d+) findings$", re.M)


def _needs_jax(name):
    return fuzz_build.target_header(name)[1] == "jax"


@pytest.fixture(scope="module")
def binaries():
    """Every target built once (objects shared between targets and runs)."""
    if not shutil.which(fuzz_build.CLANG):
        pytest.skip("clang++-14 is not installed (`make fuzz-deps`)")
    have_jax = os.path.exists(os.path.join(ROOT, ".venv-jax", "bin", "python"))
    names = [n for n in TARGETS if have_jax or not _needs_jax(n)]
    try:
        return dict(zip(names, fuzz_build.build(names)))
    except SystemExit as e:  # the build's own message: which file, which command
        pytest.fail(str(e), pytrace=False)


def test_every_target_declares_what_it_links():
    assert TARGETS, "no fuzz/targets/*.cc"
    for name in TARGETS:
        sources, needs = fuzz_build.target_header(name)
        assert needs in fuzz_build.NEEDS
        assert all(s.endswith(".cc") for s in sources), (name, sources)
        corpus = os.path.join(ROOT, "fuzz", "corpus", name)
        assert os.path.isdir(corpus) and os.listdir(corpus), "%s has no seeds in %s" % (
            name, corpus)
        size = sum(os.path.getsize(os.path.join(corpus, f)) for f in os.listdir(corpus))
        assert size < 100 * 1024, (name, size)


@pytest.mark.parametrize("name", TARGETS)
def test_target_runs_without_findings(binaries, name):
    if name not in binaries:
        pytest.skip("%s needs .venv-jax (`make venv-jax`)" % name)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "fuzz", "run.py"), "--no-build",
                           "--seconds", str(SECONDS), name],
                          cwd=ROOT, capture_output=True, text=True, timeout=SECONDS + 300)
    m = LINE.search(proc.stdout)
    assert m, proc.stdout + proc.stderr
    target, execs, edges, findings = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    assert target == name
    log = os.path.join(ROOT, "out", "fuzz-cov", "logs", name + ".log")
    tail = open(log, errors="replace").read()[-6000:] if os.path.exists(log) else ""
    assert findings == 0 and proc.returncode == 0, (
        "%s: %d findings; inputs and REPLAY.txt in out/fuzz-cov/findings/%s/\n%s"
        % (name, findings, name, tail))
    # The run did fuzz: its inputs executed and reached code.
    assert execs > 0 and edges > 0, proc.stdout + tail
