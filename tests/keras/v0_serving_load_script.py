"""Loads a SavedModel written by tf_tpu_emb.keras.export_serving_v0 in a
process that never imports tf_tpu_emb (run by tests/keras/test_keras_v0_layer.py).

argv: the SavedModel directory and an .npz of the ``serving_default``
signature's input tensors plus ``__expected__`` (the Keras model's
predictions).  Exit code 0 and a last line "OK" = pass.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main():
    path, npz = sys.argv[1], sys.argv[2]
    loaded = tf.saved_model.load(path)
    assert "tf_tpu_emb" not in sys.modules
    arrays = dict(np.load(npz))
    expected = arrays.pop("__expected__")
    signature = loaded.signatures["serving_default"]
    outputs = signature(**{k: tf.constant(v) for k, v in arrays.items()})
    assert len(outputs) == 1, outputs
    got = next(iter(outputs.values())).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert "tf_tpu_emb" not in sys.modules
    print("OK")


if __name__ == "__main__":
    main()
