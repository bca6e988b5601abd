"""tf_tpu_emb.serving.export_serving: SavedModels made of stock ops only.

TF's ``TPUEmbeddingForServing`` (works on CPU) stands in for the trained
embedding object.  All exports are loaded in ONE fresh subprocess
(tests/common/serving_load_script.py: tensorflow + numpy only, asserts tf_tpu_emb was
never imported) that calls the serving signature (flat tensors) and the
restored ``lookup`` tf.function (composite tensors); the results are compared
with a numpy reference and with the in-process ``module.lookup``.
"""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_tpu_emb.serving import (NonStockOpError, assert_stock_ops, export_serving,
                                find_non_stock_ops)
import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.tf_version

E = tf.tpu.experimental.embedding
B = 4
SEQ_SPARSE_L = 3
SEQ_RAGGED_L = 2


def make_embedding():
    ta = E.TableConfig(8, 4, combiner="mean", name="ta")
    tb = E.TableConfig(6, 3, combiner="sum", name="tb")
    tc = E.TableConfig(5, 2, combiner="sqrtn", name="tc")
    fc = {
        "sp": E.FeatureConfig(ta, name="sp"),
        "wsp": E.FeatureConfig(tb, name="wsp"),
        "rg": E.FeatureConfig(ta, name="rg"),
        "wrg": E.FeatureConfig(tc, name="wrg"),
        "dn": E.FeatureConfig(tb, name="dn"),
        "seq": {"sp": E.FeatureConfig(ta, max_sequence_length=SEQ_SPARSE_L, name="seq_sp"),
                "rg": E.FeatureConfig(tc, max_sequence_length=SEQ_RAGGED_L, name="seq_rg")},
    }
    emb = E.TPUEmbeddingForServing(fc, None)
    values = {}
    for i, (table, var) in enumerate(emb.embedding_tables.items()):
        v = (np.arange(np.prod(var.shape), dtype=np.float32).reshape(var.shape) / 10
             + i - 1).astype(np.float32)
        var.assign(v)
        values[table.name] = v
    return emb, values


SIGNATURE = {
    "sp": tf.SparseTensorSpec([None, None], tf.int64),
    "wsp": tf.SparseTensorSpec([None, None], tf.int64),
    "rg": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1),
    "wrg": tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1),
    "dn": tf.TensorSpec([None], tf.int32),
    "seq": {"sp": tf.SparseTensorSpec([None, None], tf.int64),
            "rg": tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)},
}
WEIGHTED = ["wsp", "wrg"]
KINDS = {"sp": "sparse", "wsp": "sparse", "rg": "ragged", "wrg": "ragged", "dn": "dense",
         "seq/sp": "sparse", "seq/rg": "ragged"}
TABLE_OF = {"sp": "ta", "wsp": "tb", "rg": "ta", "wrg": "tc", "dn": "tb",
            "seq/sp": "ta", "seq/rg": "tc"}
COMBINER = {"ta": "mean", "tb": "sum", "tc": "sqrtn"}

# Per feature: list of B rows of ids (sparse rows: (position, id) pairs), and weights.
ROWS = {
    "sp": [[(0, 1), (1, 3)], [], [(0, 7)], [(0, 2), (2, 2), (3, 5)]],  # empty row -> 0
    "wsp": [[(0, 0), (1, 5)], [(0, 4)], [], [(1, 1), (2, 2)]],
    "rg": [[1, 2, 3], [0], [], [7, 7]],
    "wrg": [[4], [0, 1], [2, 3, 4], []],
    "seq/sp": [[(0, 1), (2, 6)], [], [(1, 0), (4, 3)], [(0, 7), (1, 7), (2, 7)]],  # pos 4 cut
    "seq/rg": [[1, 2, 3], [4], [], [0, 0]],  # row 0 truncated to 2, row 1 padded
}
WEIGHTS = {
    "wsp": [[0.5, 2.0], [3.0], [], [1.5, 0.25]],
    "wrg": [[2.0], [1.0, 3.0], [0.5, 1.0, 2.0], []],
}
DENSE_IDS = np.array([5, 0, 3, 3], np.int32)


def flat_inputs():
    """The flat serving-signature inputs (numpy), named as export_serving names them."""
    data = {"dn": DENSE_IDS}
    for path, rows in ROWS.items():
        n = path.replace("/", "_")
        dtype = SIGNATURE_FLAT_DTYPE[path]
        if KINDS[path] == "sparse":
            idx = [(b, p) for b, r in enumerate(rows) for p, _ in r]
            data[n + "_indices"] = np.array(idx, np.int64).reshape(-1, 2)
            data[n + "_values"] = np.array([i for r in rows for _, i in r], dtype)
            width = max([p + 1 for r in rows for p, _ in r] + [1])
            data[n + "_dense_shape"] = np.array([B, width], np.int64)
        else:
            data[n + "_values"] = np.array([i for r in rows for i in r], dtype)
            data[n + "_row_splits"] = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
        if path in WEIGHTS:
            data[n + "_weights"] = np.array([w for r in WEIGHTS[path] for w in r], np.float32)
    return data


SIGNATURE_FLAT_DTYPE = {"sp": np.int64, "wsp": np.int64, "rg": np.int64, "wrg": np.int32,
                        "seq/sp": np.int64, "seq/rg": np.int64}


def composite_inputs(data):
    """(features, weights) as composite tensors built from the flat inputs."""
    features, weights = {"seq": {}}, {}
    for path, kind in KINDS.items():
        n = path.replace("/", "_")
        if kind == "dense":
            make = None
            value = tf.constant(data[n])
        elif kind == "sparse":
            def make(v, n=n):
                return tf.SparseTensor(data[n + "_indices"], v, data[n + "_dense_shape"])
            value = make(data[n + "_values"])
        else:
            def make(v, n=n):
                return tf.RaggedTensor.from_row_splits(v, data[n + "_row_splits"])
            value = make(data[n + "_values"])
        if "/" in path:
            features["seq"][path.split("/")[1]] = value
        else:
            features[path] = value
        if path in WEIGHTS:
            weights[path] = make(data[n + "_weights"])
    return features, weights


def reference_activations(tables):
    """numpy activations, keyed by joined path."""
    out = {"dn": tables["tb"][DENSE_IDS]}
    for path, rows in ROWS.items():
        table = tables[TABLE_OF[path]]
        dim = table.shape[1]
        if path.startswith("seq/"):
            length = SEQ_SPARSE_L if path == "seq/sp" else SEQ_RAGGED_L
            act = np.zeros([B, length, dim], np.float32)
            for b, r in enumerate(rows):
                pairs = r if KINDS[path] == "sparse" else list(enumerate(r))
                for p, i in pairs:
                    if p < length:
                        act[b, p] = table[i]
            out[path] = act
            continue
        combiner = COMBINER[TABLE_OF[path]]
        act = np.zeros([B, dim], np.float32)
        for b, r in enumerate(rows):
            ids = [i for _, i in r] if KINDS[path] == "sparse" else r
            if not ids:
                continue
            w = np.array(WEIGHTS[path][b] if path in WEIGHTS else [1.0] * len(ids), np.float32)
            s = (w[:, None] * table[ids]).sum(0)
            if combiner == "mean":
                s = s / w.sum()
            elif combiner == "sqrtn":
                s = s / np.sqrt((w * w).sum())
            act[b] = s
        out[path] = act
    return out


def _flatten(x, prefix=""):
    if isinstance(x, dict):
        out = {}
        for k in x:
            out.update(_flatten(x[k], prefix + "/" + k if prefix else k))
        return out
    return {prefix or "output_0": np.asarray(x)}


# ------------------------------------------------------------------ exports

class Exported:
    """Exports run once; one subprocess loads all of them."""

    def __init__(self, tmp):
        self.emb, self.tables = make_embedding()
        self.data = flat_inputs()
        self.ref = reference_activations(self.tables)
        self.modules, self.loaded, self.dirs, cases = {}, {}, {}, []

        # Keras model on top of the pooled activations.
        self.dense = tf.keras.layers.Dense(2, kernel_initializer="glorot_uniform",
                                           bias_initializer="ones")
        self.dense.build((None, 4 + 3 + 4 + 2 + 3))

        def keras_fn(act):
            x = tf.concat([act["sp"], act["wsp"], act["rg"], act["wrg"], act["dn"]], axis=1)
            seq = (tf.reduce_sum(act["seq"]["sp"], axis=[1, 2])
                   + tf.reduce_sum(act["seq"]["rg"], axis=[1, 2]))
            return {"logits": self.dense(x), "seq_total": seq}

        # Plain function capturing a tf.Variable (tracked automatically).
        self.scale = tf.Variable([2.0, -1.0, 0.5], name="scale")

        def plain_fn(act):
            return tf.reduce_sum(act["dn"] * self.scale, axis=1) + tf.reduce_sum(act["sp"], 1)

        specs = {"acts": None, "keras": keras_fn, "plain": plain_fn}
        for name, model_fn in specs.items():
            d = self.dirs[name] = os.path.join(tmp, name)
            self.modules[name] = export_serving(d, self.emb, SIGNATURE, model_fn,
                                                weighted_features=WEIGHTED)
            np.savez(os.path.join(tmp, name + "_in.npz"), **self.data)
            cases.append({"dir": d, "inputs": os.path.join(tmp, name + "_in.npz"),
                          "output": os.path.join(tmp, name + "_out.npz"),
                          "features": [[p, k, p in WEIGHTS] for p, k in KINDS.items()]})
        with open(os.path.join(tmp, "cases.json"), "w") as f:
            json.dump(cases, f)
        proc = harness.run_python([harness.common_script("serving_load_script.py"),
                                   os.path.join(tmp, "cases.json")], timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        for case, name in zip(cases, specs):
            with np.load(case["output"]) as z:
                self.loaded[name] = dict(z.items())

    def in_process(self, name):
        features, weights = composite_inputs(self.data)
        return _flatten(self.modules[name].lookup(features, weights))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return Exported(str(tmp_path_factory.mktemp("serving")))


def test_activations_match_numpy_reference(exported):
    got = exported.loaded["acts"]
    inproc = exported.in_process("acts")
    assert sorted(inproc) == sorted(exported.ref)
    for path, ref in exported.ref.items():
        np.testing.assert_allclose(got["sig/" + path], ref, rtol=1e-6, atol=1e-6, err_msg=path)
        np.testing.assert_allclose(got["lookup/" + path], ref, rtol=1e-6, atol=1e-6,
                                   err_msg=path)
        np.testing.assert_array_equal(got["sig/" + path], inproc[path])
    # Shapes per TF's serving rules: pooled [B, D], sequence [B, L, D].
    assert got["sig/sp"].shape == (B, 4)
    assert got["sig/seq/sp"].shape == (B, SEQ_SPARSE_L, 4)
    assert got["sig/seq/rg"].shape == (B, SEQ_RAGGED_L, 2)
    assert sorted(got["tables"]) == ["ta", "tb", "tc"]


def test_serving_signature_inputs_are_flat_and_named(exported):
    cf = exported.modules["acts"].serve.get_concrete_function()
    spec = cf.structured_input_signature[0][0]
    assert set(spec) == set(exported.data)
    assert spec["sp_indices"].shape.as_list() == [None, 2]
    assert spec["sp_indices"].dtype == tf.int64
    assert spec["sp_dense_shape"].shape.as_list() == [2]
    assert spec["wsp_weights"].dtype == tf.float32
    assert spec["wrg_values"].dtype == tf.int32
    assert spec["seq_rg_row_splits"].dtype == tf.int64
    assert spec["dn"].dtype == tf.int32
    assert "sp_weights" not in spec and "rg_weights" not in spec


def test_keras_model_fn(exported):
    got = exported.loaded["keras"]
    kernel, bias = [v.numpy() for v in exported.dense.weights]
    ref = exported.ref
    x = np.concatenate([ref["sp"], ref["wsp"], ref["rg"], ref["wrg"], ref["dn"]], axis=1)
    logits = x @ kernel + bias
    seq = ref["seq/sp"].sum((1, 2)) + ref["seq/rg"].sum((1, 2))
    inproc = exported.in_process("keras")
    for prefix in ("sig/", "lookup/"):
        np.testing.assert_allclose(got[prefix + "logits"], logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[prefix + "seq_total"], seq, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["sig/logits"], inproc["logits"])
    assert len(exported.modules["keras"].model_variables) == 2


def test_plain_function_model_fn(exported):
    got = exported.loaded["plain"]
    ref = exported.ref
    want = (ref["dn"] * np.array([2.0, -1.0, 0.5], np.float32)).sum(1) + ref["sp"].sum(1)
    np.testing.assert_allclose(got["sig/output_0"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["lookup/output_0"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["sig/output_0"], exported.in_process("plain")["output_0"])
    assert [v.name for v in exported.modules["plain"].model_variables] == ["scale:0"]


def test_export_copies_the_tables(exported):
    for table, var in exported.emb.embedding_tables.items():
        copy = exported.modules["acts"].tables[table.name]
        assert copy is not var
        np.testing.assert_array_equal(copy.numpy(), exported.tables[table.name])


def test_saved_models_contain_only_stock_ops(exported):
    for d in exported.dirs.values():
        assert find_non_stock_ops(d) == []  # the written saved_model.pb
    for module in exported.modules.values():
        assert find_non_stock_ops(module.lookup) == []
        assert find_non_stock_ops(module.serve) == []


# ------------------------------------------------------------------ refusals

def test_refuses_a_model_fn_with_our_ops(lib, tmp_path):
    import tf_tpu_emb

    emb, _ = make_embedding()
    dummy = tf.Variable(0.0, name="dummy")

    def model_fn(act):
        return tf_tpu_emb.ops.tpu_embedding_activations(dummy, act["sp"], table_id=0,
                                                        lookup_id=0)

    path = tmp_path / "bad"
    with pytest.raises(NonStockOpError, match=r"TfTpuEmb>TPUEmbeddingActivations"):
        export_serving(path, emb, {"sp": SIGNATURE["sp"]}, model_fn)
    assert not (path / "saved_model.pb").exists()


def test_stock_op_check_walks_library_functions():
    @tf.function
    def inner():
        return tf.raw_ops.IsTPUEmbeddingInitialized()

    @tf.function(input_signature=[])
    def outer():
        return inner()

    bad = find_non_stock_ops(outer.get_concrete_function())
    assert [t for _, t in bad] == ["IsTPUEmbeddingInitialized"]
    with pytest.raises(NonStockOpError, match="IsTPUEmbeddingInitialized"):
        assert_stock_ops(outer)


def test_bad_arguments(tmp_path):
    emb, _ = make_embedding()
    with pytest.raises(ValueError, match="dense"):
        export_serving(tmp_path / "a", emb, {"dn": SIGNATURE["dn"]}, weighted_features=["dn"])
    with pytest.raises(ValueError, match="sequence"):
        export_serving(tmp_path / "b", emb, {"seq": {"sp": SIGNATURE["seq"]["sp"]}},
                       weighted_features=["seq/sp"])
    with pytest.raises(ValueError, match="not a feature"):
        export_serving(tmp_path / "c", emb, {"nope": SIGNATURE["dn"]})
    with pytest.raises(ValueError, match="not paths of input_signature"):
        export_serving(tmp_path / "d", emb, {"sp": SIGNATURE["sp"]}, weighted_features=["wsp"])
    with pytest.raises(ValueError, match="rank 2"):
        export_serving(tmp_path / "e", emb,
                       {"rg": tf.RaggedTensorSpec([None, None, None], tf.int64)})
