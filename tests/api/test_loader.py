"""The lazy loader: importing the package is cheap, loading is explicit or on
first use, a library built for another TensorFlow minor version is refused with
a rebuild hint, and once loaded the kernels serve both TF's op names and ours."""
import os

import numpy as np
import pytest
import tensorflow as tf

import tf_tpu_emb
from tf_tpu_emb import _loader
from tf_tpu_emb import ops as tte_ops
import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.tf_version


@pytest.mark.system
def test_import_does_not_load_library():
    code = (
        "import tf_tpu_emb, tf_tpu_emb.ops, tf_tpu_emb.optimizers\n"
        "from tf_tpu_emb import _loader\n"
        "assert _loader._module is None, _loader._module\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert %r not in maps, 'op library mapped after import'\n"
        "print('OK')\n" % os.path.basename(_loader.library_path()))
    proc = harness.run_python(["-c", code], timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK", proc.stderr[-2000:]


@pytest.mark.parametrize("running,built", [
    ("2.22.0", "2.21.0"),
    ("2.20.1", "2.21.0"),
    ("3.21.0", "2.21.0"),
    ("2.2.0", "2.21.0"),
])
def test_check_version_refuses_other_minor(running, built):
    with pytest.raises(ImportError) as excinfo:
        _loader.check_version(running, built)
    message = str(excinfo.value)
    assert running in message and built in message
    assert "pip install --no-build-isolation" in message


@pytest.mark.parametrize("running,built", [
    ("2.21.0", "2.21.0"),
    ("2.21.3", "2.21.0"),
    ("2.21.0rc1", "2.21.1"),
])
def test_check_version_accepts_same_minor(running, built):
    _loader.check_version(running, built)  # no exception


def test_library_path_is_inside_package():
    path = _loader.library_path()
    assert os.path.isabs(path) and os.path.exists(path)
    assert os.path.dirname(path) == os.path.dirname(os.path.abspath(tf_tpu_emb.__file__))


def test_load_library_is_idempotent(lib):
    assert tf_tpu_emb.load_library() is lib
    assert tf_tpu_emb.load_library() is lib
    assert tf_tpu_emb.register_all() is lib
    assert _loader._module is lib
    # The module carries the generated wrappers of the prefixed ops.
    assert callable(lib.tf_tpu_emb_tpu_embedding_activations)


def test_core_op_runs_eagerly_on_cpu(lib):
    x = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    with tf.device("/CPU:0"):
        out = tf.raw_ops.TPUEmbeddingActivations(
            embedding_variable=tf.zeros([5, 4]), sliced_activations=x, table_id=0,
            lookup_id=1)
    assert out.dtype == tf.float32
    np.testing.assert_array_equal(out.numpy(), x.numpy())


def test_prefixed_op_runs_eagerly(lib):
    x = tf.constant([[1.5, -2.0], [3.0, 4.25]])
    out = tte_ops.tpu_embedding_activations(tf.zeros([7, 2]), x, table_id=2, lookup_id=0)
    np.testing.assert_array_equal(out.numpy(), x.numpy())


@pytest.mark.parametrize("spec_shape,value_shape", [
    ([None, 4], (3, 4)),
    ([3, 4], (3, 4)),
    ([None, None, 2], (2, 3, 2)),
    (None, (5,)),
])
def test_prefixed_op_in_tf_function(lib, spec_shape, value_shape):
    @tf.function(input_signature=[tf.TensorSpec(spec_shape, tf.float32)])
    def fn(act):
        return tte_ops.tpu_embedding_activations(tf.zeros([1, 1]), act, table_id=0,
                                                 lookup_id=3)

    concrete = fn.get_concrete_function()
    static = concrete.structured_outputs.shape
    if spec_shape is None:
        assert static.rank is None
    else:
        assert static.as_list() == spec_shape
    op_types = {op.type for op in concrete.graph.get_operations()}
    assert tte_ops.TPU_EMBEDDING_ACTIVATIONS in op_types
    value = np.arange(np.prod(value_shape), dtype=np.float32).reshape(value_shape)
    np.testing.assert_array_equal(fn(tf.constant(value)).numpy(), value)
