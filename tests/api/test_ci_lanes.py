"""Every test runs in at least one CI lane (docs/contributing.md "Tests and CI
lanes"): the default lane (`make test`) leaves out only the `slow` and
`clients` tests, so each test file with `slow` tests must be in the sanitizer
lane's SAN_TESTS and each with `clients` tests in the client lane's folder;
`.ci/run` runs every lane (the documentation site's included), and the
README's test command is the default lane's."""
import pathlib
import re
import subprocess

import harness

ROOT = pathlib.Path(harness.ROOT)
MAKEFILE = (ROOT / "Makefile").read_text()


def _make_var(name):
    """The variable's value as make expands it (`make print-NAME`)."""
    assert re.search(r"^%s\s*\??=" % name, MAKEFILE, re.M), name
    out = subprocess.run(["make", "-s", "--no-print-directory", "print-" + name], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def _files_marked(marker):
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("*/test_*.py")
                  if re.search(r"pytest\.mark\.%s\b" % marker, p.read_text()))


def _covered(path, roots):
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def test_slow_tests_run_in_the_sanitizer_lane():
    """Slow tests run in the sanitizer lane, except the client lane's slow
    tier (4 and 8 replicas), which `make test-clients-all` runs."""
    san = _make_var("SAN_TESTS")
    assert _files_marked("slow"), "no slow tests found: the check would be vacuous"
    assert [f for f in _files_marked("slow")
            if not _covered(f, san) and f not in _files_marked("clients")] == []


def test_files_the_default_lane_leaves_out_run_in_the_sanitizer_lane():
    """DEFAULT_IGNORE's files run whole in the sanitizer lane: under
    SAN_TESTS, and not in a folder of which it runs only the `slow` tests."""
    ignored = [a.split("=", 1)[1] for a in _make_var("DEFAULT_IGNORE")]
    assert ignored and all(a.startswith("--ignore=") for a in _make_var("DEFAULT_IGNORE"))
    san, slow_only = _make_var("SAN_TESTS"), _make_var("SAN_SLOW_ONLY")
    assert [f for f in ignored if not (ROOT / f).exists() or not _covered(f, san)
            or _covered(f, slow_only)] == []
    # A test that skips itself under the sanitizers would then run nowhere.
    files = [p for f in ignored for p in ([ROOT / f] if f.endswith(".py")
                                           else (ROOT / f).rglob("test_*.py"))]
    assert [str(p) for p in files if "UNDER_ASAN" in p.read_text()] == []
    assert re.search(r'^test: build\n.*-m "\$\(DEFAULT_LANE\)" \$\(DEFAULT_IGNORE\)', MAKEFILE,
                     re.M)


def test_long_tests_run_in_test_all_and_in_no_ci_lane():
    """The `long` tier (pyproject.toml) is `make test-all`'s: neither the
    default lane nor the sanitizer lane's two runs take it; each long test
    is a bigger cell or an end-to-end run beside tests CI runs, so a file
    holds CI tests too or is one end-to-end run named in the contributing
    page."""
    assert re.search(r'^test-all: build\n.*-m "not clients"', MAKEFILE, re.M)
    san = re.search(r"^sanitize: .*\n((?:\t.*\n)+)", MAKEFILE, re.M).group(1)
    assert len(re.findall(r'-m "[^"]*not long"', san)) == 2, san
    docs = (ROOT / "docs" / "contributing.md").read_text()
    for f in _files_marked("long"):
        text = (ROOT / f).read_text()
        if re.search(r"^pytestmark = .*pytest\.mark\.long", text, re.M):
            assert "`%s`" % f in docs, f


def test_client_tests_run_in_the_client_lane():
    assert [f for f in _files_marked("clients") if not f.startswith("tests/clients/")] == []
    assert re.search(r'^test-clients:.*\n.*-m "clients and not slow" tests/clients', MAKEFILE,
                     re.M)
    assert re.search(r"^test-clients-all:.*\n.*-m clients tests/clients", MAKEFILE, re.M)


def test_ci_runs_every_lane_and_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    for target in ("test", "test-jax", "sanitize", "package-check", "test-tfio", "docs",
                   "test-clients"):
        assert re.search(r"^lane \S+ make %s$" % target, ci, re.M), target
    assert re.search(r"^make test\s+# ", (ROOT / "README.md").read_text(), re.M)
    assert '-m "$(DEFAULT_LANE)"' in MAKEFILE
    assert "DEFAULT_LANE  = not slow and not clients and not long" in MAKEFILE


def test_the_docs_lane_builds_strictly_and_every_lane_is_in_the_table():
    """`make docs` is mkdocs --strict, and the contributing page's lane table
    (the one place CI lane times are given) has a row for each lane."""
    assert re.search(r"^docs: .*\n.*mkdocs build --strict", MAKEFILE, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    table = (ROOT / "docs" / "contributing.md").read_text()
    for target in re.findall(r"^lane \S+ make (\S+)$", ci, re.M):
        assert re.search(r"^\| `make %s` \|" % re.escape(target), table, re.M), target


def test_the_package_lane_checks_the_repaired_wheel_without_a_compiler():
    """CI's package lane is one cell of the release check: the wheel pip
    builds from the sdist, repaired as `make wheel` repairs (tools/wheel.sh),
    installed and tested without a compiler (tools/wheel_check.sh); the
    release matrix (`make release-check`, every Python) is the slow tier,
    never in CI."""
    package_check = (ROOT / "tools" / "package_check.sh").read_text()
    assert re.search(r"^bash tools/wheel\.sh .*\"\$WHEEL\"$", package_check, re.M)
    assert re.search(r"bash tools/wheel_check\.sh ", package_check)
    assert re.search(r"^wheel: build tools-venv\n\tbash tools/wheel\.sh ", MAKEFILE, re.M)
    assert re.search(r"^release-check: .*\n\tbash tools/release_check\.sh ", MAKEFILE, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert not re.search(r"^[^#]*make release-check", ci, re.M)
    # The three Pythons of the slow tier (the variable's continued lines).
    pythons = re.search(r"^RELEASE_PYTHONS \?=((?:.*\\\n)*.*)$", MAKEFILE, re.M).group(1)
    for version in ("3.10", "3.12", "3.13"):
        assert re.search(r"/bin/python%s\b" % re.escape(version), pythons), version


def test_tensorflow_runs_from_bytecode():
    """The virtualenvs hold compiled bytecode (the Makefile's `uv_install`,
    --compile-bytecode): where PYTHONDONTWRITEBYTECODE is set, as on CI's
    machines, Python writes no .pyc files, and a virtualenv without them
    compiles TensorFlow's Python from source in every process (its import
    took 24 s instead of 10; the default lane ran 2,113 s).  A virtualenv made
    by an older Makefile: `rm -rf .venv && make venv`."""
    import importlib.util

    from tensorflow.python import pywrap_tensorflow
    from tensorflow.python.framework import ops

    import tensorflow as tf

    missing = [m.__file__ for m in (tf, pywrap_tensorflow, ops)
               if not pathlib.Path(importlib.util.cache_from_source(m.__file__)).exists()]
    assert missing == [], "no bytecode beside %s" % missing
