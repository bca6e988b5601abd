"""The in-place gradient ops (ours, "...InPlace": docs/sparsecore_semantics.md
§10) on a variable large enough to move into huge pages the first time it is
updated (kernels/sparsecore/huge_page_allocator.h): the update is exact against a numpy
formula, a tensor read before the update keeps the old values (TF's
copy-on-write rule), and later updates write the moved buffer."""
import numpy as np
import pytest
import tensorflow as tf

import sparsecore_reference as ref
from tf_tpu_emb import ops as tte_ops

pytestmark = [pytest.mark.usefixtures("lib")]

ROWS, WIDTH = 32768, 64  # 8 MiB: above the allocator's 4 MiB threshold
N = 8  # ids, padded: sample 0 -> row 0, sample 1 -> rows 2 and 5


def _csr():
    return dict(row_pointers=np.array([3] + [N] * 7, np.int32),
                sorted_sample_ids=np.array([0, 1, 1] + [ref.PAD] * 5, np.int32),
                sorted_token_ids=np.array([0, 2, 5] + [ref.PAD] * 5, np.int32),
                sorted_gains=np.array([1.0, 0.5, 2.0] + [0.0] * 5, np.float32),
                num_minibatches_per_physical_sparse_core=np.int32(1),
                num_sparsecores_per_device=1)


def _sgd_in_place(table, grads, lr):
    op = tte_ops.raw_op("XlaSparseDenseMatmulGradWithSgdAndCsrInputInPlace")
    op(embedding_table=table.handle, activation_gradients=grads, learning_rate=np.float32(lr),
       clip_weight_min=-np.inf, clip_weight_max=np.inf, table_name="big", **_csr())


def _expected(before, grads, lr):
    out = before.copy()
    out[0] -= lr * 1.0 * grads[0]
    out[2] -= lr * 0.5 * grads[1]
    out[5] -= lr * 2.0 * grads[1]
    return out


def test_a_large_table_moves_once_and_updates_exactly():
    rng = np.random.default_rng(7)
    start = rng.standard_normal((ROWS, WIDTH)).astype(np.float32)
    table = tf.Variable(start)
    snapshot = table.read_value()  # alive across the update: must not change
    grads = rng.standard_normal((2, WIDTH)).astype(np.float32)
    _sgd_in_place(table, grads, 0.25)
    first = _expected(start, grads, 0.25)
    np.testing.assert_array_equal(table.numpy(), first)
    np.testing.assert_array_equal(snapshot.numpy(), start)
    _sgd_in_place(table, grads, 0.5)  # the moved buffer, updated where it is
    np.testing.assert_array_equal(table.numpy(), _expected(first, grads, 0.5))
    table.assign(start)  # an assign replaces the buffer: moved again at the next update
    _sgd_in_place(table, grads, 0.25)
    np.testing.assert_array_equal(table.numpy(), first)
