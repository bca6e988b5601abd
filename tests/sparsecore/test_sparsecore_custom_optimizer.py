"""XlaSparseDenseMatmulGradWithCsrInput -- the optimizer as the user's
function -- across the chips of the stand-in SparseCore TPU
(sparsecore_custom_optimizer_script.py): every replica's ids, preprocessed
by TF's own host code, update their chip's shard once per step with the
gradient summed over the global batch (docs/sparsecore_semantics.md §10),
through the user's function, against an independent numpy model of the
logical table."""
import json

import numpy as np
import pytest

import harness

pytestmark = pytest.mark.system
SCRIPT = harness.script(__file__, "sparsecore_custom_optimizer_script.py")
LR = 0.1


@pytest.mark.parametrize("replicas", [1, 2, pytest.param(4, marks=pytest.mark.slow)])
def test_user_optimizer_is_one_global_batch_step(tmp_path, replicas):
    out = tmp_path / "out.json"
    proc = harness.run_python(["-m", "tf_tpu_emb.run", "--embedding", "v2", "--replicas",
                               str(replicas), SCRIPT, str(out)], timeout=600,
                              cwd=str(tmp_path))
    assert proc.returncode == 0, harness.describe(proc)
    result = json.loads(out.read_text())
    w, acc, count = (np.array(x, np.float32) for x in result["before"])
    grad = {}
    for samples, grads in zip(result["samples"], result["grads"]):
        for s, ids in enumerate(samples):
            for i in ids:  # combiner sum, weight 1: gain 1 per id
                grad[i] = grad.get(i, np.zeros(w.shape[1], np.float32)) + np.float32(grads[s])
    assert len(grad) > 5
    want_w, want_acc, want_n = w.copy(), acc.copy(), count.copy()
    for i, g in grad.items():
        want_acc[i] = acc[i] + g * g
        want_w[i] = w[i] - np.float32(LR) * g / np.sqrt(want_acc[i])
        want_n[i] += 1
    got_w, got_acc, got_n = (np.array(x, np.float32) for x in result["after"])
    np.testing.assert_allclose(got_acc, want_acc, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got_n, want_n)  # each touched row: one update a step
