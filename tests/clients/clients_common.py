"""What the client tests share: where the client venv is, how a client
program runs in it (under the stand-in or not), and the skip when the client
packages are absent (the default lane has no client venv: `make clients-venv`)."""
import json
import os
import subprocess

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


def losses_on_the_stand_in_and_mirrored(script, replicas, **env):
    """Runs a client script's ``tpu`` mode under the stand-in (it must end
    with "OK", its numpy check) and its ``mirrored`` mode; returns the loss
    lists fit reported in each, and the tpu run's output."""
    tpu = run_client([script, "tpu", str(replicas)], replicas=replicas, **env)
    assert tpu.returncode == 0 and tpu.stdout.strip().endswith("OK"), harness.describe(tpu)
    mirrored = run_client([script, "mirrored", str(replicas)], **env)
    assert mirrored.returncode == 0, harness.describe(mirrored)
    ours, theirs = (json.loads(line_value(p.stdout, "LOSSES ")) for p in (tpu, mirrored))
    return ours, theirs, tpu.stdout


def line_value(stdout, key):
    """The rest of the last output line starting with `key` (e.g. "LOSSES ")."""
    lines = [l for l in stdout.splitlines() if l.startswith(key)]
    assert lines, "no %r line in:\n%s" % (key, stdout[-3000:])
    return lines[-1][len(key):]
