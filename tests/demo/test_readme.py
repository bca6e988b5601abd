"""Every ```python snippet of the README runs, as written, in a fresh process."""
import pathlib
import re

import pytest
import harness  # tests/common: the one way to start a child process

README = pathlib.Path(harness.ROOT) / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 2


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(index, tmp_path):
    script = tmp_path / ("snippet_%d.py" % index)
    script.write_text(SNIPPETS[index])
    result = harness.run_python([str(script)], timeout=300)
    assert result.returncode == 0, "README snippet %d failed:\n%s\n%s" % (
        index, SNIPPETS[index], result.stderr[-3000:])
