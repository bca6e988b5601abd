"""The harness under which TensorFlow's own SparseCore tests run on this
library (tools/run_tf_tests.py copies TF's test files beside this file).

* The op library is loaded, so TF's op names have their CPU kernels.
* With ``TF_TPU_EMB_TF_TESTS_REPLICAS=N`` (N > 0) the stand-in SparseCore TPU
  of N chips is installed (``tf_tpu_emb.tpu.install(embedding="v2")``).  The
  stand-in rebinds TensorFlow's *public* TPU names only, never its
  implementation modules (tf_tpu_emb/tpu/install.py); TF's tests import the
  implementation modules themselves (``tpu_cluster_resolver``,
  ``tpu_strategy``, ``remote``, ``tpu_embedding_v3``), so for each test the
  module's references to those are pointed at views whose TPU names are the
  public ones -- the stand-in's -- and whose other names are TF's.
* absltest parses flags in its ``main``; under pytest they are marked parsed.
"""
import os
import types

import pytest
import tensorflow as tf

import tf_tpu_emb

tf_tpu_emb.load_library()
REPLICAS = int(os.environ.get("TF_TPU_EMB_TF_TESTS_REPLICAS", "0"))
if REPLICAS:
    import tf_tpu_emb.tpu
    tf_tpu_emb.tpu.install(replicas=REPLICAS, embedding="v2")


class _View(types.ModuleType):
    """A module's names, some of them replaced."""

    def __init__(self, real, **names):
        super().__init__(real.__name__)
        self._real = real
        self.__dict__.update(names)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _views():
    from tensorflow.python.distribute import tpu_strategy
    from tensorflow.python.distribute.cluster_resolver import tpu_cluster_resolver
    from tensorflow.python.eager import remote
    from tensorflow.python.tpu import tpu_embedding_v3
    return {
        "tpu_cluster_resolver": _View(
            tpu_cluster_resolver,
            TPUClusterResolver=tf.distribute.cluster_resolver.TPUClusterResolver,
            initialize_tpu_system=tf.tpu.experimental.initialize_tpu_system,
            shutdown_tpu_system=tf.tpu.experimental.shutdown_tpu_system),
        "tpu_strategy": _View(tpu_strategy, TPUStrategy=tf.distribute.TPUStrategy,
                              TPUStrategyV2=tf.distribute.TPUStrategy),
        "remote": _View(remote, connect_to_cluster=tf.config.experimental_connect_to_cluster),
        "tpu_embedding_v3": _View(tpu_embedding_v3,
                                  TPUEmbeddingV2=tf.tpu.experimental.embedding.TPUEmbeddingV2),
    }


@pytest.fixture(autouse=True)
def _stand_in_names(request):
    from absl import flags
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    if not REPLICAS:
        yield
        return
    module = request.module
    views = _views()
    saved = {name: getattr(module, name) for name in views if hasattr(module, name)}
    for name in saved:
        setattr(module, name, views[name])
    yield
    for name, value in saved.items():
        setattr(module, name, value)
