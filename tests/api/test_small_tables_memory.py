"""Many small tables take the memory their rows need: a table or slot under
4 MiB gets plain memory, not a 2 MiB huge page of its own
(core/huge_pages.h AllocateRows; engine/table.cc).  Before, a model of 200
tables of 8 x 4 floats with Adagrad held 400 huge pages once configured:
800 MiB resident where transparent huge pages are on.

A child process configures such a model and reports its resident set before
and after; the test skips where the kernel gives no huge pages (the growth
is then small either way)."""
import json

import pytest

import harness  # tests/common: the one way to start a child process

pytestmark = pytest.mark.system

TABLES = 200
GROWTH_MIB = 100  # 400 buffers: 800 MiB as huge pages, well under 1 MiB of rows

CHILD = r"""
import json, sys
import tensorflow as tf
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
import tf_tpu_emb
from tf_tpu_emb import ops as tte_ops
tf_tpu_emb.load_library()  # the kernels under TF's core op names

def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0

tables = int(sys.argv[1])
c = pb.TPUEmbeddingConfiguration(mode=pb.TPUEmbeddingConfiguration.TRAINING,
                                 batch_size_per_tensor_core=4, num_hosts=1, num_tensor_cores=1)
for t in range(tables):
    d = c.table_descriptor.add(name="t%d" % t, vocabulary_size=8, dimension=4, num_features=1)
    d.optimization_parameters.adagrad.SetInParent()
    d.optimization_parameters.learning_rate.constant = 0.1
tf.constant([1.0]) + 1.0  # TF's own start-up before the first figure
before = rss_mib()
tf.raw_ops.ConfigureTPUEmbedding(config=c.SerializeToString())
after = rss_mib()
tte_ops.shutdown_tpu_embedding()
print(json.dumps({"before": before, "after": after}))
"""


def _huge_pages_available():
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def test_small_tables_do_not_take_a_huge_page_each():
    if not _huge_pages_available():
        pytest.skip("transparent huge pages are off here: nothing to tell apart")
    out = harness.run_python(["-c", CHILD, str(TABLES)], timeout=300)
    assert out.returncode == 0, harness.describe(out)
    rss = json.loads(out.stdout.strip().splitlines()[-1])
    assert rss["after"] - rss["before"] < GROWTH_MIB, rss
