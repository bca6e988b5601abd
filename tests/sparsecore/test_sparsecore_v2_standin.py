"""TF's own TPUEmbeddingV2 on the stand-in SparseCore TPU
(``python -m tf_tpu_emb.run --embedding v2``), in child processes
(sparsecore_v2_script.py): training against the numpy global-batch model
(sparsecore_v2_model.py) at 1, 2 (and, slow, 4 and 8) replicas for SGD,
Adagrad, Adam, AdagradMomentum and FTRL; the checkpoint's sharded stacked
layout and a restore into a fresh object; a replica that never comes and an
id past the table (errors, not hangs); the runner's and install's options
(the V1 default unchanged)."""
import json
import time

import numpy as np
import pytest

import harness  # tests/common: the one way to start a child process
import sparsecore_v2_model
import sparsecore_v2_script as script

pytestmark = pytest.mark.system
SCRIPT = harness.script(__file__, "sparsecore_v2_script.py")
OPTIMIZERS = ["sgd", "adagrad", "adam", "adagrad_momentum", "ftrl"]
STEPS = 3
UNSET = ("TF_TPU_EMB_EMBEDDING",)  # the V1 default is what a child gets without it


def run_script(tmp_path, replicas, mode, opt="sgd", steps=STEPS, timeout=600):
    out = tmp_path / ("%s_%s_%d.json" % (mode, opt, replicas))
    proc = harness.run_python(["-m", "tf_tpu_emb.run", "--embedding", "v2", "--replicas",
                               str(replicas), SCRIPT, mode, str(out), opt, str(steps)],
                              timeout=timeout, cwd=str(tmp_path))
    assert proc.returncode == 0, harness.describe(proc)
    with open(out) as f:
        return json.load(f)


def model(result, opt):
    return sparsecore_v2_model.train(result, opt, script.TABLES, script.FEATURES,
                                     script.HYPER[opt], script.LEARNING_RATES)


def assert_close(actual, expected, what):
    np.testing.assert_allclose(np.array(actual, np.float32), expected, rtol=1e-6, atol=1e-6,
                               err_msg=what)


def assert_equals_model(result, opt):
    """Every step's activations and the final tables equal the numpy model."""
    tables, activations = model(result, opt)
    for step, (got, want) in enumerate(zip(result["activations"], activations)):
        for feature in script.FEATURES:
            assert_close(got[feature], want[feature], "step %d, %s" % (step, feature))
    for name in script.TABLES:
        assert_close(result["final"][name], tables[name], name)


def _cells():
    """Every optimizer at 2 replicas (the default lane) and 8 (`slow`: the
    sanitizer lane); at 4, Adagrad in the sanitizer lane and the others in the
    `long` tier, as at 1 (CI's time budget: the sanitized 4-replica cells
    took ~17 s each and check no path the 8-replica ones do not)."""
    for opt in OPTIMIZERS:
        yield pytest.param(opt, 1, marks=pytest.mark.long)
        yield pytest.param(opt, 2)
        yield pytest.param(opt, 4, marks=pytest.mark.slow if opt == "adagrad" else pytest.mark.long)
        yield pytest.param(opt, 8, marks=pytest.mark.slow)


@pytest.mark.parametrize("opt, replicas", list(_cells()))
def test_training_equals_the_global_batch_model(tmp_path, opt, replicas):
    result = run_script(tmp_path, replicas, "train", opt)
    assert result["replicas"] == replicas
    assert result["embedding_feature"] == "EmbeddingFeature.V2"
    assert result["sparsecores_per_chip"] == 4
    assert result["embedding_class"] == "tensorflow.python.tpu.tpu_embedding_v3.TPUEmbeddingV2"
    # TF stacked the two width-8 tables with one optimizer; item has its own.
    assert sorted(result["stacked"].values()) == [["item"], ["user", "video"]]
    # embedding_tables: TF's stacked tables (keyed by stack), one shard per chip.
    assert sorted(result["embedding_tables"]) == ["item", "user_video"]
    assert all(len(shards) == replicas for shards in result["embedding_tables"].values())
    for name, shards in result["table_shards"].items():
        assert [device for device, _ in shards] == [
            "/job:localhost/replica:0/task:0/device:CPU:%d" % k for k in range(replicas)]
        assert all(same for _, same in shards), (name, shards)
    assert_equals_model(result, opt)
    for name in script.TABLES:
        # Training moved every table (the comparison above could not pass by standing still).
        assert np.abs(np.array(result["final"][name]) - result["initial"][name]).max() > 1e-3


@pytest.mark.parametrize("opt", ["sgd", pytest.param("adam", marks=pytest.mark.long)])
def test_in_place_update_equals_tfs_functional_path(tmp_path, monkeypatch, opt):
    """Seam 7 (tf_tpu_emb/tpu/embedding_v2.py): in a traced step every
    gradient op's table and slots are updated in place (one InPlace op per
    stacked table and replica, TF's functional op left without consumers);
    with TF_TPU_EMB_V2_IN_PLACE=0 TF's functional path runs as written; both
    equal the numpy global-batch model."""
    fast = run_script(tmp_path, 2, "train", opt)
    assert fast["in_place_ops"] == [2 * 2, 2 * 2]  # 2 stacked tables x 2 replicas, 2 traces
    assert fast["used_grad_ops"] == [0, 0]
    assert fast["pipelining_marks"] == ["lookup=", "update="]  # no flag, no mark
    monkeypatch.setenv("TF_TPU_EMB_V2_IN_PLACE", "0")
    slow = run_script(tmp_path, 2, "train", opt)
    assert slow["in_place_ops"] == [0, 0] and slow["used_grad_ops"] == [4, 4]
    assert_equals_model(fast, opt)
    assert_equals_model(slow, opt)


@pytest.mark.parametrize("replicas", [pytest.param(1, marks=pytest.mark.long), 2])
@pytest.mark.parametrize("opt", ["sgd", "adagrad"])
def test_pipelined_lookups_are_one_step_old(tmp_path, opt, replicas):
    """pipeline_execution_with_tensor_core=True (seam 8, semantics
    "Pipelining"): step N+1's lookup does not see step N's update, step
    N+2's does; the updates, and so the final tables, follow in order.  Every
    step's activations and the final tables equal the pipelined numpy model;
    the first lookup after training does not see the last update, the second
    does."""
    result = run_script(tmp_path, replicas, "pipelined", opt, steps=4)
    assert result["pipelining_marks"] == ["lookup=forward", "update=backward"]
    tables, activations, previous = sparsecore_v2_model.train(
        result, opt, script.TABLES, script.FEATURES, script.HYPER[opt], script.LEARNING_RATES,
        pipelined=True, with_previous=True)
    for step, (got, want) in enumerate(zip(result["activations"], activations)):
        for feature in script.FEATURES:
            assert_close(got[feature], want[feature], "step %d, %s" % (step, feature))
    for name in script.TABLES:
        assert_close(result["final"][name], tables[name], name)
    # Not the program-order run: from step 1 on the activations differ.
    _, in_order = model(result, opt)
    assert np.abs(np.array(result["activations"][1]["clicked"])
                  - in_order[1]["clicked"]).max() > 1e-3
    lookup = sparsecore_v2_model.activations
    first, second = result["lookups_after"]
    for tables_seen, got in ((previous, first), (tables, second)):
        want, _ = lookup(tables_seen, result["inputs"][0], script.TABLES, script.FEATURES)
        for feature in script.FEATURES:
            assert_close(got[feature], want[feature], feature)


def test_pipelined_functional_path_and_tfs_sequential_switch(tmp_path, monkeypatch):
    """Pipelining on TF's functional path (TF_TPU_EMB_V2_IN_PLACE=0: the
    gradient op's outputs assigned) equals the pipelined model too; a step
    traced in TF's SequentialEmbeddingContext runs in program order (TF marks
    its ops "..._sequential"), as does a run without the flag."""
    monkeypatch.setenv("TF_TPU_EMB_V2_IN_PLACE", "0")
    functional = run_script(tmp_path, 2, "pipelined", "adagrad", steps=4)
    assert functional["in_place_ops"] == [0, 0]
    tables, activations = sparsecore_v2_model.train(
        functional, "adagrad", script.TABLES, script.FEATURES, script.HYPER["adagrad"],
        script.LEARNING_RATES, pipelined=True)
    for step, (got, want) in enumerate(zip(functional["activations"], activations)):
        for feature in script.FEATURES:
            assert_close(got[feature], want[feature], "step %d, %s" % (step, feature))
    for name in script.TABLES:
        assert_close(functional["final"][name], tables[name], name)
    monkeypatch.delenv("TF_TPU_EMB_V2_IN_PLACE")
    sequential = run_script(tmp_path, 2, "sequential", "adagrad", steps=4)
    assert sequential["pipelining_marks"] == ["lookup=forward_sequential",
                                              "update=backward_sequential"]
    assert_equals_model(sequential, "adagrad")


def test_checkpoint_is_the_sharded_stacked_layout_and_restores(tmp_path):
    result = run_script(tmp_path, 2, "checkpoint", "adagrad", steps=2)
    # Across generations (tf_tpu_emb.sparsecore_checkpoint and TF's own paths):
    # per table with its slots, equal to TF's unshuffle of the live tables;
    # TF's TPUEmbeddingForServing restores the parameters; a per-table
    # checkpoint restores into a fresh TPUEmbeddingV2 through TF's adapter.
    gens = result["across_generations"]
    assert gens["read_states"] == {name: ["accumulators", "parameters"]
                                   for name in script.TABLES}
    for check in ("read_equal", "serving_equal", "back_equal"):
        assert gens[check] == {name: True for name in script.TABLES}, (check, gens[check])
    keys = result["checkpoint_keys"]
    # One variable per stacked table and slot: the shards saved as slices of
    # the full stacked table [shards * rows per shard, padded width].
    stacked = {k: v for k, v in keys.items() if k.startswith("embedding/")
               and k.endswith("/.ATTRIBUTES/VARIABLE_VALUE")}
    assert "embedding/user_video/.ATTRIBUTES/VARIABLE_VALUE" in stacked
    assert "embedding/item/.ATTRIBUTES/VARIABLE_VALUE" in stacked
    # TF's layout (SparseCoreLayoutStacker): 2 chips x 4 SparseCores = 8
    # shards; each table takes its rows per shard rounded up to 8 (user
    # 32/8 = 4 -> 8, video 64/8 = 8), widths rounded up to 8 (item 4 -> 8).
    assert stacked["embedding/user_video/.ATTRIBUTES/VARIABLE_VALUE"] == [8 * (8 + 8), 8]
    assert stacked["embedding/item/.ATTRIBUTES/VARIABLE_VALUE"] == [8 * 16, 8]
    assert any("accumulators" in k for k in stacked)
    assert all(result["checkpoint_tables"].values()), result["checkpoint_tables"]
    for name in script.TABLES:
        assert np.abs(np.array(result["fresh_before_restore"][name])
                      - result["final"][name]).max() > 1e-3
        assert_close(result["restored"][name], np.array(result["final"][name], np.float32),
                     name)
        assert_close(result["restored_after_more"][name],
                     np.array(result["after_more"][name], np.float32), name)


def serving_reference(table, combiner, rows, weights):
    """numpy: each row's combination of its ids' rows of `table`."""
    out = np.zeros((len(rows), table.shape[1]))
    for r, (ids, w) in enumerate(zip(rows, weights)):
        if not ids:
            continue
        w = np.array(w, np.float64)
        total = (w[:, None] * table[ids]).sum(0)
        scale = {"sum": 1.0, "mean": w.sum(), "sqrtn": np.sqrt((w * w).sum())}[combiner]
        out[r] = total / scale
    return out


def test_serving_export_from_a_v2_model_is_stock_ops(tmp_path):
    """export_serving takes the trained TPUEmbeddingV2 object itself; the
    SavedModel loads and serves where tf_tpu_emb was never imported, and its
    lookups combine the tables TF's own unshuffle reads from the V2 variables."""
    result = run_script(tmp_path, 2, "checkpoint", "sgd", steps=1)
    rng = np.random.RandomState(3)
    batch, flat, rows, weights = 5, {}, {}, {}
    for f, (table, form, most) in script.FEATURES.items():
        vocab = script.TABLES[table][0]
        if form == "dense":
            ids = rng.randint(0, vocab, batch)
            flat[f] = ids.astype(np.int32)
            rows[f], weights[f] = [[int(i)] for i in ids], [[1.0]] * batch
            continue
        lengths = rng.randint(0, most + 1, batch)
        lengths[0] = max(lengths[0], 1)
        ids = rng.randint(0, vocab, int(lengths.sum())).astype(np.int32)
        w = rng.uniform(0.5, 2.0, ids.size).astype(np.float32)
        splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat[f + "_values"] = ids
        if form == "sparse":
            flat[f + "_indices"] = np.array([[r, j] for r, n in enumerate(lengths)
                                             for j in range(n)], np.int64).reshape(-1, 2)
            flat[f + "_dense_shape"] = np.array([batch, most], np.int64)
        else:
            flat[f + "_row_splits"] = splits
        rows[f] = [ids[a:b].tolist() for a, b in zip(splits[:-1], splits[1:])]
        if f in script.SERVING_WEIGHTED:
            flat[f + "_weights"] = w
            weights[f] = [w[a:b].tolist() for a, b in zip(splits[:-1], splits[1:])]
        else:
            weights[f] = [[1.0] * len(r) for r in rows[f]]
    np.savez(tmp_path / "inputs.npz", **flat)
    kinds = {f: form for f, (_, form, _) in script.FEATURES.items()}
    case = {"dir": result["serving_dir"], "inputs": str(tmp_path / "inputs.npz"),
            "output": str(tmp_path / "out.npz"),
            "features": [[f, kinds[f], f in script.SERVING_WEIGHTED] for f in script.FEATURES]}
    with open(tmp_path / "cases.json", "w") as fp:
        json.dump([case], fp)
    proc = harness.run_python([harness.common_script("serving_load_script.py"),
                               str(tmp_path / "cases.json")], timeout=300)
    assert proc.returncode == 0, harness.describe(proc)
    got = dict(np.load(tmp_path / "out.npz").items())
    assert sorted(got["tables"]) == sorted(script.TABLES)
    for f, (table, _, _) in script.FEATURES.items():
        want = serving_reference(np.array(result["final"][table], np.float64),
                                 script.TABLES[table][2], rows[f], weights[f])
        for view in ("lookup/" + f, "sig/" + f):
            np.testing.assert_allclose(got[view], want, rtol=1e-5, atol=1e-6, err_msg=view)


def test_enqueue_on_a_replica_device(tmp_path):
    """TF's enqueue(..., device=strategy.extended.worker_devices[0]) (what
    TF's own TPUEmbeddingV2 tests do) preprocesses on that device's host; the
    dequeued lookup equals embedding(features).  A device that is no
    replica's keeps TF's error."""
    result = run_script(tmp_path, 1, "enqueue_device")
    assert result["equal"] == {f: True for f in script.FEATURES}
    assert "Non-TPU device" in result["error"] and "CPU:2" in result["error"]


def test_a_replica_that_never_comes_is_an_error_not_a_hang(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_TPU_EMB_STEP_TIMEOUT_SECONDS", "2")
    start = time.monotonic()
    result = run_script(tmp_path, 2, "missing")
    assert time.monotonic() - start < 120
    kind, message = result["error"]
    assert kind == "DeadlineExceededError", result["error"]
    assert "XlaSparseDenseMatmulWithStaticBufferSize" in message
    assert "replica(s) 1 of 2 did not arrive within 2 s" in message
    assert "table '" in message
    # The failed step leaves the replicas aligned: the next step trains.
    assert len(result["next_step"]) == script.GLOBAL_BATCH


def test_a_bad_step_timeout_is_invalid_argument(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_TPU_EMB_STEP_TIMEOUT_SECONDS", "soon")
    result = run_script(tmp_path, 2, "missing")
    kind, message = result["error"]
    assert kind == "InvalidArgumentError", result["error"]
    assert "TF_TPU_EMB_STEP_TIMEOUT_SECONDS must be a number of seconds" in message
    assert result["next_step"][0] == "InvalidArgumentError"  # every step, at once


def test_an_id_past_the_table_is_invalid_argument_naming_the_table(tmp_path):
    result = run_script(tmp_path, 2, "bad_ids")
    assert result["error"] is not None
    kind, message = result["error"]
    assert kind == "InvalidArgumentError", result["error"]
    assert "(table 'user_video')" in message, message  # the stacked table of `watched`
    assert "XlaSparseDenseMatmulWithStaticBufferSize" in message, message
    assert "sorted_token_ids[" in message, message
    assert len(result["next_step"]) == script.GLOBAL_BATCH


def test_install_options_and_the_v1_default(tmp_path):
    code = """
import os
import tensorflow as tf
from tf_tpu_emb import tpu
TF_V2 = tf.tpu.experimental.embedding.TPUEmbeddingV2
system = tpu.install(replicas=2)
s = tf.distribute.TPUStrategy(tf.distribute.cluster_resolver.TPUClusterResolver(""))
f = s.extended.tpu_hardware_feature
print("v1", system.embedding, f.embedding_feature, f.num_embedding_devices_per_chip,
      hasattr(s.extended, "_tpu_devices"), tf.tpu.experimental.embedding.TPUEmbeddingV2 is TF_V2)
try:
    tpu.install(replicas=2, embedding="v2")
except RuntimeError as e:
    print("reinstall", "embedding v1" in str(e))
tpu.uninstall()
os.environ["TF_TPU_EMB_EMBEDDING"] = "v2"
system = tpu.install(replicas=2)
s = tf.distribute.TPUStrategy(tf.distribute.cluster_resolver.TPUClusterResolver(""))
f = s.extended.tpu_hardware_feature
print("v2", system.embedding, f.embedding_feature, f.num_embedding_devices_per_chip,
      s.extended._tpu_devices.shape, tf.tpu.experimental.embedding.TPUEmbeddingV2 is TF_V2,
      issubclass(tf.tpu.experimental.embedding.TPUEmbeddingV2, TF_V2))
tpu.uninstall()
print("restored", tf.tpu.experimental.embedding.TPUEmbeddingV2 is TF_V2)
try:
    tpu.install(replicas=2, embedding="v3")
except ValueError as e:
    print("bad", "v1, v2" in str(e))
"""
    proc = harness.run_python(["-c", code], timeout=300, cwd=str(tmp_path), unset=UNSET)
    assert proc.returncode == 0, harness.describe(proc)
    lines = proc.stdout.splitlines()
    assert "v1 v1 EmbeddingFeature.V1 1 False True" in lines
    assert "reinstall True" in lines
    assert "v2 v2 EmbeddingFeature.V2 4 (2, 1) False True" in lines
    assert "restored True" in lines
    assert "bad True" in lines
    prog = tmp_path / "prog.py"
    prog.write_text("import tensorflow as tf\n"
                    "s = tf.distribute.TPUStrategy(tf.distribute.cluster_resolver."
                    "TPUClusterResolver(''))\n"
                    "print('feature', s.extended.tpu_hardware_feature.embedding_feature)\n")
    proc = harness.run_python(["-m", "tf_tpu_emb.run", "--embedding=v2", str(prog)],
                              timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 0 and "feature EmbeddingFeature.V2" in proc.stdout, \
        harness.describe(proc)
    proc = harness.run_python(["-m", "tf_tpu_emb.run", str(prog)], timeout=300,
                              cwd=str(tmp_path), unset=UNSET)
    assert proc.returncode == 0 and "feature EmbeddingFeature.V1" in proc.stdout, \
        harness.describe(proc)
    proc = harness.run_python(["-m", "tf_tpu_emb.run", "--embedding", "v9", str(prog)],
                              timeout=300, cwd=str(tmp_path))
    assert proc.returncode == 2 and "--embedding must be v1 or v2" in proc.stderr
