"""What the installed TensorFlow's protos can express (README "TensorFlow
versions"): tests of a feature an older TF lacks are skipped with the reason.

tests/conftest.py skips every test parametrized with an optimizer this TF
lacks; other tests use the marks below.
"""
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as _config_pb2

from tf_tpu_emb.optimizer_specs import OPTIMIZERS
from tf_tpu_emb.optimizers import tf_has_optimizer

TF_VERSION = tuple(int(x) for x in tf.__version__.split(".")[:2])

# {proto_field: OptimizerInfo} of the optimizers this TF's protos lack.
MISSING_OPTIMIZERS = {i.proto_field: i for i in OPTIMIZERS if not tf_has_optimizer(i)}

HAS_MANUAL_PARTITIONING = ("use_manual_partitioning" in
                           _config_pb2.TPUEmbeddingConfiguration.SpmdSharding
                           .DESCRIPTOR.fields_by_name)


def missing_optimizer_reason(info):
    return ("TensorFlow %s's OptimizationParameters has no %s (%s needs TF >= %d.%d)"
            % ((tf.__version__, info.proto_field, info.class_name) + info.min_tf))


def optimizer_mark(proto_field):
    """A skip mark for tests of optimizer `proto_field` (none where TF has it)."""
    info = MISSING_OPTIMIZERS.get(proto_field)
    return pytest.mark.skipif(
        info is not None,
        reason=missing_optimizer_reason(info) if info else "this TF has " + proto_field)


needs_frequency_aware_adagrad = optimizer_mark("frequency_aware_adagrad")

needs_manual_partitioning = pytest.mark.skipif(
    not HAS_MANUAL_PARTITIONING,
    reason="TensorFlow %s's SpmdSharding has no use_manual_partitioning (TF >= 2.19)"
    % tf.__version__)


def missing_optimizer_in(text):
    """The OptimizerInfo of a missing optimizer that `text` names, or None."""
    for info in MISSING_OPTIMIZERS.values():
        if info.proto_field in text or info.class_name in text:
            return info
    return None


def import_tfio_or_skip():
    """tensorflow_io with its native ops loaded (and pyarrow, which writes the
    Parquet files), else skips the calling test module with the reason: the
    `make test-tfio` lane (TF 2.16.2 + tensorflow-io 0.37.1) has both."""
    tfio = pytest.importorskip(
        "tensorflow_io", reason="tensorflow-io is not installed (the `make test-tfio` lane "
        "has it)")
    pytest.importorskip("pyarrow", reason="pyarrow writes the Parquet files")
    try:
        from tensorflow_io.python.ops import core_ops  # noqa: F401  (loads the native ops)
    except (ImportError, NotImplementedError, tf.errors.NotFoundError) as e:
        pytest.skip("tensorflow-io's native ops do not load on TensorFlow %s: %s"
                    % (tf.__version__, str(e)[:200]), allow_module_level=True)
    return tfio
