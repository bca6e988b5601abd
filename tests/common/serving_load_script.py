"""Load SavedModels written by tf_tpu_emb.serving.export_serving in a fresh process.

Imports only tensorflow and numpy (never tf_tpu_emb).  Usage:
``python serving_load_script.py cases.json``; cases.json is a list of
``{"dir", "inputs" (npz of the flat signature inputs), "output" (npz to write),
"features": [[path, "dense"|"sparse"|"ragged", weighted], ...]}``.
For each case: calls the serving signature with the flat inputs and the restored
``lookup`` tf.function with composite tensors rebuilt from the same inputs, and
writes ``sig/<output name>`` and ``lookup/<joined path>`` arrays.
"""
import json
import sys

import numpy as np
import tensorflow as tf


def arg_name(path):
    name = "".join(c if c.isalnum() else "_" for c in path)
    return name if name[:1].isalpha() else "arg_" + name


def put(tree, path, value):
    keys = path.split("/")
    for k in keys[:-1]:
        tree = tree.setdefault(k, {})
    tree[keys[-1]] = value


def flat(x, prefix=""):
    if isinstance(x, dict):
        out = []
        for k in sorted(x):
            out += flat(x[k], prefix + "/" + k if prefix else k)
        return out
    return [(prefix or "output_0", x)]


def main():
    cases = json.load(open(sys.argv[1]))
    for case in cases:
        loaded = tf.saved_model.load(case["dir"])
        data = {k: tf.constant(v) for k, v in np.load(case["inputs"]).items()}
        results = {}

        sig = loaded.signatures["serving_default"]
        for k, v in sig(**data).items():
            results["sig/" + k] = v.numpy()

        features, weights = {}, {}
        for path, kind, weighted in case["features"]:
            n = arg_name(path)
            if kind == "dense":
                put(features, path, data[n])
                continue
            if kind == "sparse":
                make = lambda vals: tf.SparseTensor(data[n + "_indices"], vals,  # noqa: E731
                                                    data[n + "_dense_shape"])
            else:
                make = lambda vals: tf.RaggedTensor.from_row_splits(  # noqa: E731
                    vals, data[n + "_row_splits"])
            put(features, path, make(data[n + "_values"]))
            if weighted:
                weights[path] = make(data[n + "_weights"])
        out = loaded.lookup(features, weights) if weights else loaded.lookup(features)
        for k, v in flat(out):
            results["lookup/" + k] = v.numpy()

        results["tables"] = np.array(sorted(loaded.tables))
        np.savez(case["output"], **results)

    assert "tf_tpu_emb" not in sys.modules, "tf_tpu_emb was imported"
    print("OK", len(cases))


if __name__ == "__main__":
    main()
