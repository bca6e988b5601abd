"""Keras 3 (TensorFlow backend) integration of tf_tpu_emb.

* :class:`TPUEmbeddingLayer` -- the engine-backed mid-level API as a Keras
  layer: tables trained by the engine's optimizer inside an unmodified
  ``model.fit`` (``MirroredStrategy`` included), ``predict``/``evaluate``
  without bookkeeping, ``get_config``/``from_config``, ``model.save`` /
  ``keras.models.load_model``, ``get_weights``/``set_weights``.
* :func:`export_serving` -- a SavedModel of the whole Keras model made of stock
  ops (the layer becomes ``serving_embedding_lookup`` of its tables).
* :func:`release_engine` / :func:`engine_owner` -- each layer holds an engine of its own.
* :func:`fix_distributed_fit` -- lets ``fit``/``evaluate``/``predict`` under a
  ``tf.distribute`` strategy take SparseTensor/RaggedTensor inputs (a Keras 3
  workaround, from :mod:`tf_tpu_emb.keras.distributed_fit`; both layers apply it to
  the models containing them by themselves).
* :class:`TPUEmbeddingV0Layer` / :func:`export_serving_v0` -- the plain-variable
  (``TPUEmbeddingV0``) layer, trained by the model's Keras optimizer (see
  :mod:`tf_tpu_emb.keras.v0_layers`); importing this package registers both
  layers for ``keras.models.load_model``.

Example:
    ```python
    import keras, tensorflow as tf
    import tf_tpu_emb.keras

    E = tf.tpu.experimental.embedding
    table = E.TableConfig(1000, 16, name="video")
    layer = tf_tpu_emb.keras.TPUEmbeddingLayer(
        {"watched": E.FeatureConfig(table), "liked": E.FeatureConfig(table)},
        E.Adagrad(0.1), batch_size=64)           # the engine trains the table
    inputs = {"watched": keras.Input(shape=(None,), dtype="int64", sparse=True,
                                     name="watched"),
              "liked": keras.Input(shape=(), dtype="int64", name="liked")}
    act = layer(inputs)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([act["watched"], act["liked"]]))
    model = keras.Model(inputs, out)
    model.compile("adam", keras.losses.BinaryCrossentropy(from_logits=True))
    model.fit(dataset, epochs=2)   # ({"watched": SparseTensor, "liked": ids}, labels)
    model.save("model.keras")
    tf_tpu_emb.keras.export_serving("serving/", model)   # stock ops only
    layer.release()                # frees its engine now (not only at gc)
    loaded = keras.models.load_model("model.keras")
    ```

Importing this module imports Keras; ``import tf_tpu_emb`` alone does not.
"""
from tf_tpu_emb.keras import config
from tf_tpu_emb.keras.config import deserialize_feature_config, serialize_feature_config
from tf_tpu_emb.keras.export import export_serving, input_signature_of, serving_module
from tf_tpu_emb.keras.layers import (TPUEmbeddingLayer, engine_owner, release_engine,
                                     stock_lookup)
from tf_tpu_emb.keras.distributed_fit import fix_distributed_fit
from tf_tpu_emb.keras.v0_layers import TPUEmbeddingV0Layer, export_serving_v0

__all__ = ["TPUEmbeddingLayer", "export_serving", "serving_module", "input_signature_of",
           "release_engine",
           "engine_owner", "stock_lookup", "serialize_feature_config",
           "deserialize_feature_config", "config", "fix_distributed_fit",
           "TPUEmbeddingV0Layer", "export_serving_v0"]
