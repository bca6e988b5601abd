"""bfloat16 storage resumes bit-exactly from a checkpoint (issue 24 item 6).

Stochastic rounding draws its bits from (step count, table, row, element)
(core/bf16.h, engine/apply.cc), so the step count is part of the state: with a
bfloat16 table the checkpoint carries it (``stochastic_rounding_step``) and a
run resumed from it equals the uninterrupted run bit for bit.  float32
checkpoints keep TF's TPU-embedding layout exactly (no extra variable) and
both still restore into TF's ``TPUEmbeddingForServing``.
"""
import gc

import numpy as np
import pytest
import tensorflow as tf

import tf_tpu_emb
from tf_tpu_emb import mid_level

E = tf.tpu.experimental.embedding
B, VOCAB, DIM, STEPS, CUT = 8, 6, 5, 10, 4
KEY = "embedding/%s/.ATTRIBUTES/VARIABLE_VALUE"


@pytest.fixture(autouse=True)
def cleanup(lib):
    del lib
    yield
    gc.collect()


def _initial(shape, dtype=tf.float32):
    rng = np.random.default_rng(5)
    return tf.constant(rng.standard_normal(shape) * 0.3, dtype)


def _feature_config():
    table = E.TableConfig(VOCAB, DIM, name="t", combiner="sum", initializer=_initial)
    return {"f": E.FeatureConfig(table)}


def make():
    return tf_tpu_emb.TPUEmbedding(_feature_config(), E.Adagrad(0.37))


def train(emb, steps):
    for s in steps:
        ids = np.random.default_rng(s).integers(0, VOCAB, B)
        emb.enqueue({"f": tf.constant(ids, tf.int64)})
        act = emb.dequeue()["f"]
        # A gradient that does not round to bfloat16 exactly.
        emb.apply_gradients({"f": act * 0.731 + 0.0123 * (s + 1)})


def tables(emb):
    table = emb.tables[0]
    return [v.numpy() for v in emb.retrieve_table(table)]


def _uninterrupted_and_checkpoint(tmp_path):
    """(the tables after STEPS steps, a checkpoint after CUT of them)."""
    whole = make()
    whole.build(B)
    train(whole, range(STEPS))
    want = tables(whole)
    whole.shutdown()
    first = make()
    first.build(B)
    train(first, range(CUT))
    path = tf.train.Checkpoint(embedding=first).save(str(tmp_path / "ckpt"))
    train(first, range(CUT, CUT + 2))  # work after the save: lost
    first.shutdown()
    return want, path


def test_bf16_resume_equals_the_uninterrupted_run(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_TPU_EMB_STORAGE", "bf16")
    want, path = _uninterrupted_and_checkpoint(tmp_path)
    reader = tf.train.load_checkpoint(path)
    assert reader.get_tensor(KEY % mid_level.STEP_VARIABLE) == CUT

    for restore_first in (True, False):  # a deferred restore, and into a built object
        resumed = make()
        if restore_first:
            tf.train.Checkpoint(embedding=resumed).restore(path)
            resumed.build(B)
        else:
            resumed.build(B)
            train(resumed, range(3))  # steps of its own, undone by the restore
            tf.train.Checkpoint(embedding=resumed).restore(path)
        train(resumed, range(CUT, STEPS))
        got = tables(resumed)
        resumed.shutdown()
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_without_the_step_count_the_resume_would_differ(monkeypatch, tmp_path):
    """The test above can fail: restarting the count at 0 rounds differently."""
    monkeypatch.setenv("TF_TPU_EMB_STORAGE", "bf16")
    want, path = _uninterrupted_and_checkpoint(tmp_path)
    resumed = make()
    resumed.build(B)
    tf.train.Checkpoint(embedding=resumed).restore(path)
    resumed._backend.load_step_count(0)  # pylint: disable=protected-access
    train(resumed, range(CUT, STEPS))
    got = tables(resumed)
    resumed.shutdown()
    assert not all(np.array_equal(g, w) for g, w in zip(got, want))


def test_fp32_checkpoint_is_tfs_layout_and_bf16_one_restores_into_serving(monkeypatch,
                                                                          tmp_path):
    for storage in ("", "bf16"):
        monkeypatch.setenv("TF_TPU_EMB_STORAGE", storage)
        emb = make()
        emb.build(B)
        train(emb, range(3))
        path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / ("c" + storage)))
        saved = tables(emb)[0]
        emb.shutdown()
        keys = {k for k, _ in tf.train.list_variables(path) if k.startswith("embedding/")}
        tf_keys = {KEY % "t", KEY % "t.Saccumulators"}  # "/" is escaped as ".S"
        assert keys == (tf_keys | {KEY % mid_level.STEP_VARIABLE} if storage else tf_keys)
        serving = E.TPUEmbeddingForServing(_feature_config(), E.Adagrad(0.37))
        tf.train.Checkpoint(embedding=serving).restore(path).expect_partial()
        np.testing.assert_array_equal(serving.embedding_tables[
            next(iter(serving.embedding_tables))].numpy(), saved)
