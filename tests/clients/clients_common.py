"""What the client tests share: where the client venv is, how a client
program runs in it (under the stand-in or not), and the skip when the client
packages are absent (the default lane has no client venv: `make clients-venv`)."""
import json
import os
import subprocess

import numpy as np
import pytest

import harness  # tests/common: the one way to start a child process

CLIENTS_PY = os.environ.get("TF_TPU_EMB_CLIENTS_PYTHON",
                            os.path.join(harness.ROOT, ".venv-clients", "bin", "python"))


def require(module):
    """Skips unless the client venv has `module` (pinned versions: Makefile)."""
    if not os.path.exists(CLIENTS_PY):
        pytest.skip("no client venv at %s (make clients-venv)" % CLIENTS_PY)
    probe = subprocess.run([CLIENTS_PY, "-c", "import importlib.util, sys; sys.exit("
                            "importlib.util.find_spec(%r) is None)" % module],
                           capture_output=True, env=harness.child_env())
    if probe.returncode:
        pytest.skip("%s is not installed in the client venv (make clients-venv)" % module)


def run_client(args, *, replicas=None, timeout=600, cwd=None, **env):
    """Runs ``python args`` in the client venv -- under ``python -m
    tf_tpu_emb.run --replicas R`` when `replicas` is given -- with the
    repository and tests/common importable; returns the CompletedProcess."""
    argv = [CLIENTS_PY] + (["-m", "tf_tpu_emb.run", "--replicas", str(replicas)]
                           if replicas else []) + list(args)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=harness.child_env(**env))


# Replica counts of the symmetry tests: TPU jobs run at 8 and more; 4 and 8
# (several minutes on two cores) are in the slow tier (`make test-clients-all`).
REPLICAS = [1, 2, pytest.param(4, marks=pytest.mark.slow),
            pytest.param(8, marks=pytest.mark.slow)]


def stand_in_and_mirrored(script, replicas, **env):
    """Runs a client script's ``tpu`` mode under the stand-in (it must end
    with "OK", its numpy check) and its ``mirrored`` mode; returns, for each,
    what it printed as ``LOSSES`` and ``TABLES`` (json), and the tpu run's
    output."""
    tpu = run_client([script, "tpu", str(replicas)], replicas=replicas, **env)
    assert tpu.returncode == 0 and tpu.stdout.strip().endswith("OK"), harness.describe(tpu)
    mirrored = run_client([script, "mirrored", str(replicas)], **env)
    assert mirrored.returncode == 0, harness.describe(mirrored)
    ours, theirs = ({key: json.loads(line_value(p.stdout, key.upper() + " "))
                     for key in ("losses", "tables")} for p in (tpu, mirrored))
    return ours, theirs, tpu.stdout


def assert_symmetric(client, replicas, ours, theirs, loss_rtol=1e-6, atol=1e-6):
    """The replica-symmetry contract (README "Running TPU programs
    unchanged"): the stand-in run with R replicas equals the MirroredStrategy
    run with R replicas -- losses to `loss_rtol`, every table and dense weight
    to `atol` absolute.  `ours`/`theirs` map "losses" to a list and "tables"
    / "dense" to {name: array}.  Prints one ``SYMMETRY`` line per call."""
    worst = {}
    for kind in ("tables", "dense"):
        a, b = ours.get(kind, {}), theirs.get(kind, {})
        assert sorted(a) == sorted(b), (kind, sorted(a), sorted(b))
        worst[kind] = max([float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k]))))
                           for k in a] or [0.0])
    mine, ref = np.asarray(ours["losses"]), np.asarray(theirs["losses"])
    assert mine.shape == ref.shape, (mine, ref)
    worst["loss"] = float(np.max(np.abs(mine - ref) / np.abs(ref)))
    print("SYMMETRY %s R=%d max|table diff| %.3g max|dense diff| %.3g max loss rel diff %.3g"
          % (client, replicas, worst["tables"], worst["dense"], worst["loss"]))
    np.testing.assert_allclose(mine, ref, rtol=loss_rtol, err_msg="%s R=%d" % (client, replicas))
    assert worst["tables"] <= atol and worst["dense"] <= atol, (client, replicas, worst)


def line_value(stdout, key):
    """The rest of the last output line starting with `key` (e.g. "LOSSES ")."""
    lines = [line for line in stdout.splitlines() if line.startswith(key)]
    assert lines, "no %r line in:\n%s" % (key, stdout[-3000:])
    return lines[-1][len(key):]
