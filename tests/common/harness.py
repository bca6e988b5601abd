"""The one way tests start a child process.

Some checks need a fresh Python: TensorFlow's logical CPU devices (several
replicas) can only be configured before its runtime starts, exports must load
where tf_tpu_emb was never imported, a crash must not take the test session
with it.  ``run_python`` starts such a child with the environment every test
child needs -- TensorFlow's C++ logging quiet, the repository root and the
shared test helpers (``tests/common``) importable -- under a timeout, and
returns the finished ``subprocess.CompletedProcess`` (text output captured) for
the test to assert on; ``start_python`` starts a long-lived child (a server).
``describe`` formats a child's exit status and output
for an assertion message.
"""
import os
import subprocess
import sys

COMMON = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(COMMON)
ROOT = os.path.dirname(TESTS)


def child_env(unset=(), **extra):
    """os.environ for a child: quiet TF logging, ROOT and COMMON on PYTHONPATH,
    the variables in `unset` removed and `extra` set."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    paths = [ROOT, COMMON] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    for name in unset:
        env.pop(name, None)
    env.update(extra)
    return env


def run_python(args, *, timeout, input=None, unset=(), cwd=None):
    """Runs ``python *args`` (a script path and its arguments, ``-c CODE`` or
    ``-m MODULE``) in a child; returns its CompletedProcess.  A child that
    outlives `timeout` seconds raises subprocess.TimeoutExpired."""
    return subprocess.run([sys.executable] + list(args), input=input, capture_output=True,
                          text=True, env=child_env(unset), timeout=timeout, cwd=cwd)


def run_program(argv, *, timeout, unset=(), cwd=None):
    """Runs a non-Python program (a compiled client) in a child with the same
    environment as ``run_python``; returns its CompletedProcess."""
    return subprocess.run(list(argv), capture_output=True, text=True, env=child_env(unset),
                          timeout=timeout, cwd=cwd)


def script(layer_file, name):
    """Path of the child script `name` beside the test file `layer_file`."""
    return os.path.join(os.path.dirname(os.path.abspath(layer_file)), name)


def common_script(name):
    """Path of a child script shared by several layers (tests/common)."""
    return os.path.join(COMMON, name)


def describe(proc, stdout_tail=4000, stderr_tail=4000):
    """'exit N / stdout / stderr' of a finished child, for assertion messages."""
    return "exit %d\nstdout:\n%s\nstderr:\n%s" % (proc.returncode, proc.stdout[-stdout_tail:],
                                                 proc.stderr[-stderr_tail:])


def start_python(args, *, unset=(), cwd=None, stdin=False, **extra_env):
    """Starts ``python *args`` as a long-lived child (a server): stdout is a text
    pipe, stderr merged into it, stdin a text pipe too if `stdin`, the same
    environment as `run_python` (plus `extra_env`); returns the
    ``subprocess.Popen``.  The caller must end it (``tests/common/cluster.py``
    does: SIGTERM, then SIGKILL)."""
    return subprocess.Popen([sys.executable] + list(args), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.PIPE if stdin else None,
                            env=child_env(unset, **extra_env), cwd=cwd)
