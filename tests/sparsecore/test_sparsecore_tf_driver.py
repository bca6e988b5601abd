"""TF's own TPUEmbeddingV2 preprocessing code run on our kernels.

TF 2.21's wheel ships no tests of the SparseCore ops (``find
site-packages/tensorflow -name '*_test.py'`` finds none; the
tensorflow_cpu-2.21.0 RECORD lists no ``*_test.py``), so TF's own tests
cannot be run.  What it does ship is the code that drives the preprocessing
ops on a TPU host's CPU: ``TPUEmbeddingV2._preprocess_features``
(tensorflow/python/tpu/tpu_embedding_v3.py), which calls
ConvertToListOfSparseCoreCooTensors, SortListOfSparseCoreCooTensors and
ConvertToSparseCoreCsrWrappedCooTensor by TF's names, i.e. on the kernels
this library registers under them.  Here that code preprocesses ragged,
sparse and dense features of one or two stacked tables; the CSR buffers it
returns go to the CSR lookup, and the activations must be the plain
embedding bag of each feature, at the rows semantics §1 places them."""
import types

import numpy as np
import pytest
import tensorflow as tf

import sparsecore_reference as ref

pytestmark = [pytest.mark.usefixtures("lib")]


def _tf_preprocess(**kwargs):
    from tensorflow.python.tpu import tpu_embedding_v3 as v3

    if not hasattr(v3.TPUEmbeddingV2, "_preprocess_features"):
        pytest.skip("this TensorFlow's TPUEmbeddingV2 has no _preprocess_features")
    # An instance without __init__ (which needs a TPU strategy): only what
    # _preprocess_features and the two methods it calls read.
    emb = v3.TPUEmbeddingV2.__new__(v3.TPUEmbeddingV2)
    emb._table_to_max_ids_per_sparse_core = {"stack": 1024}
    emb._table_to_max_unique_ids_per_sparse_core = {"stack": 1024}
    emb._sparse_core_embedding_config = types.SimpleNamespace(allow_id_dropping=False)
    return emb._preprocess_features(**kwargs)


def _bag(table, ids_per_sample, weights_per_sample, combiner):
    out = np.zeros((len(ids_per_sample), table.shape[1]))
    for s, (ids, w) in enumerate(zip(ids_per_sample, weights_per_sample)):
        w = np.asarray(w, np.float64)
        if not len(ids):
            continue
        scale = {"sum": 1.0, "mean": 1 / w.sum(), "sqrtn": 1 / np.sqrt((w * w).sum())}[combiner]
        out[s] = (w[:, None] * table[ids].astype(np.float64)).sum(0) * scale
    return out


def _feature_input(rng, form, batch, vocab):
    """(TF input, per-sample ids): `form` is ragged, sparse or dense."""
    if form == "dense":
        ids = rng.integers(0, vocab, batch)
        return tf.constant(ids, tf.int32), [[int(i)] for i in ids]
    lens = rng.integers(0, 4, batch)
    per_sample = [list(rng.integers(0, vocab, n)) for n in lens]
    flat = np.array([i for s in per_sample for i in s], np.int64)
    if form == "ragged":
        return tf.RaggedTensor.from_row_lengths(flat, lens), per_sample
    indices = [[s, k] for s, n in enumerate(lens) for k in range(n)]
    return tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2), flat,
                           [batch, max(3, int(lens.max(initial=0)))]), per_sample


@pytest.mark.parametrize("num_sc", [1, 2, 4])
@pytest.mark.parametrize("form,combiner", [("ragged", "mean"), ("sparse", "sum"),
                                           ("dense", "sqrtn")])
def test_tf_preprocessing_then_lookup_is_an_embedding_bag(num_sc, form, combiner):
    """Two features on two tables stacked into one (col_offset = the first
    table's vocabulary), num_sc_shards = num_sc (one replica)."""
    rng = np.random.default_rng(num_sc * 7 + len(form))
    batch, width, vocabs = 8, 3, (16, 8)
    tables = [tf.tpu.experimental.embedding.TableConfig(
        vocabulary_size=v, dim=width, combiner=combiner, name="t%d" % i)
        for i, v in enumerate(vocabs)]
    features = [tf.tpu.experimental.embedding.FeatureConfig(
        table=t, output_shape=[batch], name="f%d" % i) for i, t in enumerate(tables)]
    inputs, expected_ids = zip(*[_feature_input(rng, form, batch, v) for v in vocabs])
    stacked = {"stack": tables}
    out = _tf_preprocess(
        num_replicas_in_sync=1, max_ids_per_chip_per_sample=16, max_minibatches_per_sc=1,
        num_sc_per_chip=num_sc, num_sc_shards=num_sc, stacked_table_to_tables=stacked,
        table_to_stacked_table_offset={"t0": ("stack", 0, 0), "t1": ("stack", vocabs[0], 0)},
        table_to_sample_count={"stack": 2 * batch},
        feature_to_sample_offset={"f0": 0, "f1": batch},
        flat_features=[("f0", features[0]), ("f1", features[1])], flat_inputs=list(inputs),
        flat_weights=[None, None])
    csr = out["stack"][0]
    logical = rng.normal(size=(sum(vocabs), width)).astype(np.float32)
    (act,) = ref.run_op(
        "XlaSparseDenseMatmulWithCsrInput", row_pointers=csr.row_pointers.numpy(),
        sorted_sample_ids=csr.sorted_sample_ids.numpy(),
        sorted_token_ids=csr.sorted_token_ids.numpy(), sorted_gains=csr.sorted_gains.numpy(),
        embedding_table=ref.sc_layout(logical, num_sc),
        num_minibatches_per_physical_sparse_core=csr.num_minibatches_per_physical_sparse_core,
        input_size=2 * batch, num_sparsecores_per_device=num_sc, quantization_config_low=0.0,
        quantization_config_high=0.0, quantization_config_num_buckets=0, table_name="stack")
    # Semantics §1: sample r of a feature with row_offset o lands on row
    # r % S + o / num_sc + (stacked_sample_count / num_sc) * (r // S).
    per_sc = batch // num_sc
    for f, (offset, ids) in enumerate(zip((0, vocabs[0]), expected_ids)):
        want = _bag(logical[offset:offset + vocabs[f]], ids, [[1.0] * len(s) for s in ids],
                    combiner)
        rows = [r % per_sc + f * batch // num_sc + (2 * batch // num_sc) * (r // per_sc)
                for r in range(batch)]
        np.testing.assert_allclose(act[rows], want, rtol=1e-5, atol=1e-6, err_msg="f%d" % f)
