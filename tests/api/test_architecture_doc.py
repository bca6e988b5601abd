"""ARCHITECTURE.md stays true: every top-level folder, every test folder,
every module of the package and every C++ source file is named there (a
module added without a word in the map of the code fails here).

A name counts when it appears in backquotes as a path: `tf_tpu_emb/mid_level.py`
or, in the package's table, `mid_level.py` / `cluster/hosts.py`; brace forms
such as `engine/engine.{h,cc}` name each of their files."""
import itertools
import pathlib
import re
import subprocess

import harness  # tests/common: ROOT

ROOT = pathlib.Path(harness.ROOT)
DOC = (ROOT / "ARCHITECTURE.md").read_text()


def _tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():  # e.g. the package check's copy
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    return out.stdout.split()


def _named():
    """Every path the document names in backquotes, brace forms expanded."""
    names = set()
    for token in re.findall(r"`([^`\s]+)`", DOC):
        parts = re.split(r"\{([^}]*)\}", token)
        choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
        names.update("".join(c) for c in itertools.product(*choices))
    return {n.rstrip("/") for n in names}


NAMED = _named()
FILES = _tracked()


def _missing(paths, accept):
    return sorted(p for p in paths if not any(name in NAMED for name in accept(p)))


def test_every_top_level_folder_is_named():
    folders = {f.split("/")[0] for f in FILES if "/" in f} - {".ci"}
    assert _missing(folders, lambda d: [d]) == []


def test_every_test_folder_is_named():
    folders = {"/".join(f.split("/")[:2]) for f in FILES
               if f.startswith("tests/") and f.count("/") >= 2}
    assert _missing(folders, lambda d: [d]) == []


def test_every_package_module_is_named():
    modules = [f for f in FILES if f.startswith("tf_tpu_emb/") and f.endswith(".py")
               and not f.endswith("__init__.py")]
    # `tf_tpu_emb/cluster/hosts.py`, or `cluster/hosts.py` in the package's table.
    assert _missing(modules, lambda f: [f, f[len("tf_tpu_emb/"):]]) == []


def test_every_cpp_source_is_named():
    sources = [f for f in FILES if f.split("/")[0] in ("core", "engine", "kernels", "ops")
               and f.endswith((".h", ".cc"))]
    assert _missing(sources, lambda f: [f]) == []


def test_the_checker_sees_a_missing_name():
    assert "tf_tpu_emb/no_such_module.py" not in NAMED
    assert _missing(["tf_tpu_emb/no_such_module.py"], lambda f: [f]) == [
        "tf_tpu_emb/no_such_module.py"]
    assert "engine/engine.h" in NAMED and "engine/engine.cc" in NAMED  # a brace form
