"""The C++ unit tests (tests/cpp/*_test.cc) and the C++ include graph.

The unit tests are built with the op library's compiler and flags
(tests/cpp/build.py) and run as one binary; every case must pass.  The
include graph of core/, engine/, kernels/ and ops/ must follow the layers
(kernels -> engine -> core <- ops) and have no cycle.
"""
import os
import re
import subprocess

import pytest

import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.system  # child processes, servers or compilers

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS = ("core", "engine", "kernels", "ops")
# What each layer may include (besides itself).
ALLOWED = {"core": set(), "engine": {"core"}, "kernels": {"engine", "core"}, "ops": {"core"}}


def test_cpp_unit_tests_pass(tmp_path):
    built = harness.run_python([os.path.join(HERE, "build.py"), "--out", str(tmp_path)],
                               timeout=1200)
    assert built.returncode == 0, harness.describe(built)
    binary = built.stdout.strip().splitlines()[-1]
    run = subprocess.run([binary], capture_output=True, text=True, timeout=300,
                         env=harness.child_env())
    assert run.returncode == 0, harness.describe(run)
    passed = re.search(r"unit: (\d+) passed, 0 failed", run.stdout)
    assert passed and int(passed.group(1)) >= 10, run.stdout


def _include_graph():
    """Every .h / .cc of the layers (sub-folders included) -> the project
    headers it includes."""
    graph = {}
    for layer in LAYERS:
        for folder, _, names in sorted(os.walk(os.path.join(harness.ROOT, layer))):
            for name in sorted(n for n in names if n.endswith((".h", ".cc"))):
                path = os.path.relpath(os.path.join(folder, name), harness.ROOT)
                with open(os.path.join(harness.ROOT, path)) as f:
                    graph[path] = re.findall(r'^#include "((?:%s)/[^"]+)"' % "|".join(LAYERS),
                                             f.read(), re.M)
    return graph


def test_include_graph_follows_the_layers():
    graph = _include_graph()
    assert "core/config.h" in graph and "engine/engine.h" in graph
    assert "kernels/sparsecore/chips.h" in graph
    wrong = ["%s includes %s" % (src, dst) for src, deps in graph.items() for dst in deps
             if dst.split("/")[0] != src.split("/")[0]
             and dst.split("/")[0] not in ALLOWED[src.split("/")[0]]]
    missing = ["%s includes missing %s" % (src, dst) for src, deps in graph.items()
               for dst in deps if dst not in graph]
    assert not wrong and not missing, wrong + missing


def test_include_graph_has_no_cycle():
    graph = _include_graph()
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for dep in graph.get(node, ()):
            if state.get(dep) == "open":
                raise AssertionError("include cycle: " + " -> ".join(stack + [node, dep]))
            if dep not in state:
                visit(dep, stack + [node])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [])
