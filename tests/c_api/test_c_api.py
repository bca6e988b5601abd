"""C clients (TF-Java, Go and plain C go through TF's C API): the plugin loaded
with TF_LoadLibrary runs a full training step built by op name, under TF's
core names and the plugin's prefixed names, and TF_AddGradients over
TPUEmbeddingActivations yields the activation gradient that feeds
SendTPUEmbeddingGradients (kernels/system_kernels.cc).  train_step.c prints
what it computed; the numpy reference here is written from the semantics
(docs/tpu_embedding_semantics.md §3 gradients, §4 mean combiner, §5 Adagrad)."""
import os
import shutil
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from engine_util import TableSpec, serialize, table_mode_config
from harness import describe, run_program
from tf_tpu_emb import _loader

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, DIM, LR = 10, 4, 0.1  # LR: engine_util's constant learning rate
# Four bags: weighted, a repeated id across bags, an empty bag, one id.
BAGS = [[(1, 0.5), (3, 2.0)], [(3, 1.0), (7, 1.0), (1, 3.0)], [], [(9, 1.5)]]
BATCH = len(BAGS)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """train_step.c compiled against TF's C headers from the installed
    package, linked with TF's two libraries only."""
    out = tmp_path_factory.mktemp("c_api") / "train_step"
    lib = tf.sysconfig.get_lib()
    cmd = [shutil.which("gcc") or "gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1",
           os.path.join(HERE, "train_step.c"), "-isystem", tf.sysconfig.get_include(),
           "-L" + lib, "-l:libtensorflow_cc.so.2", "-l:libtensorflow_framework.so.2",
           "-Wl,-rpath," + lib, "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return str(out)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    rng = np.random.default_rng(11)
    table = rng.uniform(-1, 1, (VOCAB, DIM)).astype(np.float32)
    accum = rng.uniform(0.1, 1, (VOCAB, DIM)).astype(np.float32)
    target = rng.uniform(-1, 1, (BATCH, DIM)).astype(np.float32)
    d = tmp_path_factory.mktemp("c_api_inputs")
    config = table_mode_config([TableSpec("t0", VOCAB, DIM, "adagrad", num_features=1)], BATCH)
    (d / "config.pb").write_bytes(serialize(config))
    splits = np.cumsum([0] + [len(b) for b in BAGS])
    ids = [i for b in BAGS for i, _ in b]
    weights = [w for b in BAGS for _, w in b]
    lines = ["%d %d %d %d" % (VOCAB, DIM, BATCH, len(ids))]
    for arr in (table, accum, splits, ids, weights, target):
        lines.append(" ".join(repr(float(x)) if isinstance(x, (float, np.floating))
                              else str(int(x)) for x in np.ravel(arr)))
    (d / "data.txt").write_text("\n".join(lines) + "\n")
    return dict(table=table, accum=accum, target=target, config=str(d / "config.pb"),
                data=str(d / "data.txt"))


def reference(table, accum, target):
    """One step in numpy: mean-combined lookup, loss sum((a - t)^2), its
    gradient, the per-row gradient summed over the batch, lazy Adagrad."""
    act = np.zeros((BATCH, DIM), np.float64)
    coef = []
    for b, bag in enumerate(BAGS):
        sum_w = sum(w for _, w in bag)
        for i, w in bag:
            act[b] += w * table[i] / sum_w
            coef.append((b, i, w / sum_w))
    grad = 2 * (act - target)
    row_grad = np.zeros((VOCAB, DIM))
    for b, i, c in coef:
        row_grad[i] += c * grad[b]
    touched = sorted({i for _, i, _ in coef})
    new_table, new_accum = table.astype(np.float64), accum.astype(np.float64)
    for i in touched:
        new_accum[i] += row_grad[i] ** 2
        new_table[i] -= LR * row_grad[i] / np.sqrt(new_accum[i])
    return dict(activations=act, loss=np.sum((act - target) ** 2), gradient=grad,
                parameters=new_table, accumulators=new_accum)


def parse(stdout):
    values = {}
    for line in stdout.splitlines():
        label, *numbers = line.split()
        values[label] = np.array([float(x) for x in numbers])
    return values


@pytest.mark.parametrize("prefix", ["", "TfTpuEmb>"], ids=["core_names", "prefixed_names"])
def test_training_step_from_c_matches_numpy(client, inputs, prefix):
    # Without LD_LIBRARY_PATH: the plugin finds TF's libraries by its RUNPATH.
    proc = run_program([client, _loader.library_path(), prefix, inputs["config"], inputs["data"]],
                       timeout=300, unset=("LD_LIBRARY_PATH",))
    assert proc.returncode == 0, describe(proc)
    got = parse(proc.stdout)
    want = reference(inputs["table"], inputs["accum"], inputs["target"])
    assert set(got) == set(want), describe(proc)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], np.ravel(value), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    # The step changed exactly the rows it looked up.
    changed = np.flatnonzero(np.any(
        got["parameters"].astype(np.float32).reshape(VOCAB, DIM) != inputs["table"], axis=1))
    assert changed.tolist() == [1, 3, 7, 9]


def test_plugin_records_where_tensorflow_is():
    """The library's RUNPATH names TF's directory (beside the installed
    package, and where it was at build time): a host process without
    Python resolves every dependency without LD_LIBRARY_PATH."""
    path = _loader.library_path()
    dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    runpath = [l for l in dyn.splitlines() if "RUNPATH" in l or "RPATH" in l]
    assert runpath and "$ORIGIN/../tensorflow" in runpath[0], dyn
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    ldd = subprocess.run(["ldd", path], capture_output=True, text=True, env=env).stdout
    assert "not found" not in ldd, ldd
    assert "libtensorflow_cc.so.2 =>" in ldd and "libtensorflow_framework.so.2 =>" in ldd, ldd
