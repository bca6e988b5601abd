"""The demo's Parquet flags (`make test-tfio` lane): `--write-parquet` writes
the generated training log, `--parquet` trains from it through tensorflow-io
and tf.data, then exports and serves as the plain run does."""
import json

import numpy as np
import pytest

import harness  # tests/common: the one way to start a child process
import tf_features

pytestmark = [pytest.mark.tf_version, pytest.mark.system]  # child processes

tf_features.import_tfio_or_skip()
pytest.importorskip("matplotlib")

STEPS, BATCH = 80, 256  # the demo's --quick sizes


@pytest.fixture(scope="module")
def parquet_log(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_parquet")
    path = out / "log.parquet"
    result = harness.run_python(["-m", "tf_tpu_emb.demo", "--quick", "--out", str(out),
                                 "--write-parquet", str(path)], timeout=300)
    assert result.returncode == 0, harness.describe(result)
    return path


def test_write_parquet_holds_the_generated_log(parquet_log):
    import pyarrow.parquet as pq

    from tf_tpu_emb.demo import dlrm

    table = pq.read_table(str(parquet_log))
    assert table.num_rows == STEPS * BATCH
    assert table.column_names == (["label"] + ["dense_%d" % k for k in range(dlrm.NUM_DENSE)]
                                  + dlrm.FEATURES)
    # The first batch is the generator's first training batch (seed 0, stream 1).
    vocab = [min(v, 2000) for v in dlrm.CRITEO_VOCAB]  # --quick's --max-vocab
    gen = dlrm.ClickGenerator(vocab, seed=0)
    dense, ids, labels, _ = gen.batch(BATCH, np.random.default_rng([0, 1]))
    first = table.slice(0, BATCH).to_pydict()
    np.testing.assert_array_equal(np.asarray(first["label"], np.float32), labels)
    np.testing.assert_array_equal(np.asarray(first["dense_0"], np.float32), dense[:, 0])
    for f, v, hot in zip(dlrm.FEATURES, ids, dlrm.MULTI_HOT):
        got = [[int(x) for x in s.split()] for s in first[f]]
        assert got == v.reshape(BATCH, hot).tolist(), f


def test_train_from_parquet(parquet_log, tmp_path):
    result = harness.run_python(["-m", "tf_tpu_emb.demo", "--quick", "--out", str(tmp_path),
                                 "--parquet", str(parquet_log)], timeout=600)
    assert result.returncode == 0, harness.describe(result)
    assert "training from %s" % parquet_log in result.stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["config"]["parquet"] == str(parquet_log)
    assert metrics["final"]["examples"] == STEPS * BATCH
    assert metrics["final"]["eval_auc"] > 0.55
    assert metrics["serving_scores"]["matches_in_process"]
