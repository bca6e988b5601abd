"""C clients (TF-Java, Go and plain C go through TF's C API): the example
program examples/c/train.c, compiled and run with the commands of
docs/guides/clients.md exactly as printed, trains through the plugin --
loaded with TF_LoadLibrary, ops built by TF's core names and by the plugin's
prefixed names, the activation gradient from TF_AddGradients over
TPUEmbeddingActivations feeding SendTPUEmbeddingGradients
(kernels/system_kernels.cc).  Every number it prints is checked against a
numpy reference written from the semantics (docs/tpu_embedding_semantics.md
§3 gradients, §4 mean combiner, §5 Adagrad) and from the data the program
documents in its header."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import optimizer_reference
from harness import ROOT, child_env, describe, run_program
from tf_tpu_emb import _loader

pytestmark = pytest.mark.system

EXAMPLE = pathlib.Path(ROOT) / "examples" / "c" / "train.c"
GUIDE = pathlib.Path(ROOT) / "docs" / "guides" / "clients.md"
# examples/c/train.c's model (its header comment).
VOCAB, DIM, BATCH, STEPS, LR = 16, 4, 4, 5, 0.1


def guide_commands():
    """The shell block of the "A C program" section of docs/guides/clients.md,
    as printed."""
    text = GUIDE.read_text()
    section = text[text.index("## A C program"):]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The guide's commands run verbatim in a folder holding examples/c/,
    with the virtualenv's python first on PATH (what `. .venv/bin/activate`
    does); returns (folder, the commands' output)."""
    work = tmp_path_factory.mktemp("c_client")
    (work / "examples" / "c").mkdir(parents=True)
    shutil.copy(EXAMPLE, work / "examples" / "c" / "train.c")
    env = child_env(unset=("LD_LIBRARY_PATH",))  # the plugin's RUNPATH must do
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", guide_commands()], cwd=work,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, describe(proc)
    assert (work / "train").exists()
    return work, proc.stdout


def bags():
    """(bag, id, weight) of every lookup of a step (the same every step)."""
    return [(b, (5 * b + 3 * k) % VOCAB, 1.0 + 0.5 * k) for b in range(BATCH) for k in range(b)]


def reference():
    """STEPS steps in numpy: mean-combined lookup, loss sum((a - t)^2), its
    gradient, per-row gradients summed over the batch, Adagrad on the rows
    looked up (optimizer_reference.adagrad)."""
    table = (0.01 * np.arange(VOCAB * DIM, dtype=np.float32) - 0.3).astype(np.float32)
    table = table.astype(np.float64).reshape(VOCAB, DIM)
    accum = np.full((VOCAB, DIM), 0.1)
    target = np.array([[(b + c) % 3 - 1 for c in range(DIM)] for b in range(BATCH)], float)
    lookups = bags()
    total = np.zeros(BATCH)
    for b, _, w in lookups:
        total[b] += w
    losses = []
    for _ in range(STEPS):
        act = np.zeros((BATCH, DIM))
        for b, i, w in lookups:
            act[b] += w / total[b] * table[i]
        losses.append(np.sum((act - target) ** 2))
        grad = 2 * (act - target)
        row_grad = {}
        for b, i, w in lookups:
            row_grad[i] = row_grad.get(i, 0) + w / total[b] * grad[b]
        for i, g in row_grad.items():
            table[i], (accum[i],) = optimizer_reference.adagrad(table[i], (accum[i],), g, LR, {})
    return losses, table, accum


def parse(stdout):
    losses, values = [], {}
    for line in stdout.splitlines():
        words = line.split()
        if words[:1] == ["step"]:
            losses.append(float(words[3]))
        elif words[:1] in (["parameters"], ["accumulators"]):
            values[words[0]] = np.array([float(x) for x in words[1:]])
    return losses, values


def check_output(stdout):
    losses, values = parse(stdout)
    want_losses, want_table, want_accum = reference()
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    np.testing.assert_allclose(values["parameters"], want_table.ravel(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values["accumulators"], want_accum.ravel(), rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0]  # it trains


def test_guide_commands_build_and_train(built):
    """The guide's commands compile the example and run it (core op names)."""
    check_output(built[1])


def test_prefixed_op_names(built):
    """The same program building the ops by the plugin's prefixed names."""
    proc = run_program([str(built[0] / "train"), _loader.library_path(), "TfTpuEmb>"],
                       timeout=300, unset=("LD_LIBRARY_PATH",))
    assert proc.returncode == 0, describe(proc)
    check_output(proc.stdout)


def test_bad_usage_and_plugin_path(built):
    """Wrong arguments: usage and exit 2; a wrong plugin path: TF's error, exit 1."""
    proc = run_program([str(built[0] / "train")], timeout=60)
    assert proc.returncode == 2 and "usage:" in proc.stderr
    proc = run_program([str(built[0] / "train"), "/nonexistent/plugin.so"], timeout=60)
    assert proc.returncode == 1 and "TF_LoadLibrary" in proc.stderr, describe(proc)


def test_plugin_records_where_tensorflow_is():
    """The library's RUNPATH names TF's directory (beside the installed
    package, and where it was at build time): a host process without
    Python resolves every dependency without LD_LIBRARY_PATH."""
    path = _loader.library_path()
    dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    runpath = [line for line in dyn.splitlines() if "RUNPATH" in line or "RPATH" in line]
    assert runpath and "$ORIGIN/../tensorflow" in runpath[0], dyn
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    ldd = subprocess.run(["ldd", path], capture_output=True, text=True, env=env).stdout
    assert "not found" not in ldd, ldd
    assert "libtensorflow_cc.so.2 =>" in ldd and "libtensorflow_framework.so.2 =>" in ldd, ldd
