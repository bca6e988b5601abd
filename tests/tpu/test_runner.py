"""``python -m tf_tpu_emb.run``: runs a program as ``python`` would (argv,
__main__, sys.path[0], exit status, uncaught exceptions; ``-m MODULE``,
``-m pytest``), on the stand-in TPU system of ``--replicas`` CPU replicas, and
a TPU program trains through the engine with TPU Adagrad's numerics."""
import json
import os
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.system
RUN = ["-m", "tf_tpu_emb.run"]


def run(args, tmp_path, timeout=300):
    return harness.run_python(RUN + list(args), timeout=timeout, cwd=str(tmp_path))


def test_script_runs_as_python_would(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent("""
        import sys
        import tensorflow as tf
        print("argv", sys.argv)
        print("name", __name__, "path0", sys.path[0])
        print("replicas", tf.distribute.TPUStrategy(
            tf.distribute.cluster_resolver.TPUClusterResolver("")).num_replicas_in_sync)
        if sys.argv[1] == "exit":
            sys.exit(3)
        if sys.argv[1] == "raise":
            raise KeyError("the program's own error")
    """))
    proc = run(["--replicas", "2", str(script), "ok", "--flag"], tmp_path)
    assert proc.returncode == 0, harness.describe(proc)
    assert "argv ['%s', 'ok', '--flag']" % script in proc.stdout
    assert "name __main__ path0 %s" % tmp_path in proc.stdout
    assert "replicas 2" in proc.stdout
    assert run([str(script), "exit"], tmp_path).returncode == 3
    proc = run([str(script), "raise"], tmp_path)
    assert proc.returncode == 1 and "KeyError: \"the program's own error\"" in proc.stderr
    proc = run(["--replicas", "0", str(script)], tmp_path)
    assert proc.returncode == 2 and "--replicas must be a positive integer" in proc.stderr
    assert run([], tmp_path).returncode == 2


def test_module_and_pytest(tmp_path):
    (tmp_path / "tpu_prog.py").write_text(textwrap.dedent("""
        import sys
        print("module argv", sys.argv[1:], __name__)
    """))
    proc = run(["-m", "tpu_prog", "a", "b"], tmp_path)
    assert proc.returncode == 0 and "module argv ['a', 'b'] __main__" in proc.stdout, \
        harness.describe(proc)
    (tmp_path / "test_on_tpu.py").write_text(textwrap.dedent("""
        import tensorflow as tf
        from tensorflow.python.distribute import tpu_strategy

        def test_a_tpu_strategy():
            s = tf.distribute.TPUStrategy(tf.distribute.cluster_resolver.TPUClusterResolver())
            assert isinstance(s, tpu_strategy.TPUStrategyV2)
            assert s.num_replicas_in_sync == 2

        def test_fails():
            assert False
    """))
    proc = run(["--replicas", "2", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "test_on_tpu.py"], tmp_path)
    assert proc.returncode == 1 and "1 failed, 1 passed" in proc.stdout, harness.describe(proc)


def test_tpu_program_trains_with_tpu_numerics_on_two_replicas(tmp_path):
    proc = run(["--replicas", "2", harness.script(__file__, "standin_training_script.py")],
               tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)


def test_several_strategies_and_an_indivisible_batch_at_three_replicas(tmp_path):
    proc = run(["--replicas", "3", harness.script(__file__, "standin_replica_rules_script.py")],
               tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)


def _example(tmp_path, replicas):
    example = os.path.join(harness.ROOT, "examples", "tpu_unchanged.py")
    directory = tmp_path / ("r%d" % replicas)
    proc = run(["--replicas", str(replicas), example, str(directory)], tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), harness.describe(proc)
    assert ("embedding class: tf_tpu_emb.mid_level.TPUEmbedding, %d replica(s)" % replicas
            in proc.stdout)
    losses = json.loads([line for line in proc.stdout.splitlines()
                         if line.startswith("LOSSES ")][-1][7:])
    path = str(directory / "ckpt-2")   # after 30 steps
    return losses, {name: tf.train.load_variable(path, name)
                    for name, _ in tf.train.list_variables(path)
                    if name.startswith(("embedding/", "dense/"))}


@pytest.fixture(scope="module")
def example_on_one_replica(tmp_path_factory):
    return _example(tmp_path_factory.mktemp("example"), 1)


@pytest.mark.parametrize("replicas", [2, pytest.param(4, marks=pytest.mark.long),
                                      pytest.param(8, marks=pytest.mark.long)])
def test_example_tpu_script_at_tpu_replica_counts(tmp_path, replicas, example_on_one_replica):
    """The example, as written for a TPU, at 2, 4 and 8 replicas (a v3-8)
    trains as on one: a TPU's step is a global-batch step (the tables' and
    the dense weights' gradients summed over the replicas), so the losses
    and every table and dense weight after 30 steps equal the one-replica
    run's (rtol / atol 1e-6; the one-replica run's tables follow TPU Adagrad:
    standin_training_script.py checks that formula step by step)."""
    losses, weights = _example(tmp_path, replicas)
    reference_losses, reference = example_on_one_replica
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-6)
    assert sorted(weights) == sorted(reference) and any(n.startswith("embedding/")
                                                        for n in weights)
    worst = max(float(np.max(np.abs(weights[n] - reference[n]))) for n in weights)
    print("SYMMETRY example R=%d max|weight diff| vs R=1 %.3g" % (replicas, worst))
    assert worst <= 1e-6, worst


def test_example_is_a_tpu_script_unchanged():
    source = open(os.path.join(harness.ROOT, "examples", "tpu_unchanged.py")).read()
    assert "tf_tpu_emb" not in source.split('"""', 2)[2]   # code written for a TPU only
