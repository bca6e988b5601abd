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


def test_parquet_section_says_what_it_needs_before_the_code():
    """The requirements (and the command that runs the example in their
    environment) come before the example, and the Makefile target exists."""
    text = README.read_text()
    section = text[text.index("### Reading Parquet with tensorflow-io"):]
    needs, code = section.index("**What it needs.**"), section.index("```python")
    assert needs < code
    assert "make tfio-build" in section[needs:code]
    assert "PYTHONPATH=build/lanes/.venv-tf216 .venv-tf216/bin/python" in section[needs:code]
    makefile = (pathlib.Path(harness.ROOT) / "Makefile").read_text()
    assert re.search(r"^tfio-build:", makefile, re.M)
