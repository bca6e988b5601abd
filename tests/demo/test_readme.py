"""Every ```python snippet of the README runs, as written, in a fresh process."""
import pathlib
import re

import pytest
import harness  # tests/common: the one way to start a child process
import tf_features

pytestmark = pytest.mark.system  # child processes, servers or compilers

README = pathlib.Path(harness.ROOT) / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, tmp_path):
    if "tf_tpu_emb.data import parquet" in SNIPPETS[index]:
        tf_features.import_tfio_or_skip()  # the tensorflow-io lane's example
    script = tmp_path / ("snippet_%d.py" % index)
    script.write_text(SNIPPETS[index])
    result = harness.run_python([str(script)], timeout=300, cwd=str(tmp_path))
    assert result.returncode == 0, "README snippet %d failed:\n%s\n%s" % (
        index, SNIPPETS[index], result.stderr[-3000:])
