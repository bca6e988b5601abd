"""Every ```python snippet of the README and of the documentation pages
(docs/, the site `make docs` builds) runs, as written, in a fresh process."""
import pathlib
import re

import pytest
import harness  # tests/common: the one way to start a child process
import tf_features

pytestmark = pytest.mark.system  # child processes, servers or compilers

ROOT = pathlib.Path(harness.ROOT)
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").rglob("*.md"))
SNIPPETS = [(page, i, code) for page in PAGES for i, code in
            enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S))]


def _id(snippet):
    page, index, _ = snippet
    return "%s:%d" % (page.relative_to(ROOT), index)


def test_readme_and_docs_have_snippets():
    pages = {page.name for page, _, _ in SNIPPETS}
    assert "README.md" in pages and len(SNIPPETS) >= 5, sorted(pages)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[_id(s) for s in SNIPPETS])
def test_snippet_runs(snippet, tmp_path):
    page, index, code = snippet
    if "tf_tpu_emb.data import parquet" in code:
        tf_features.import_tfio_or_skip()  # the tensorflow-io lane's example
    script = tmp_path / ("snippet_%d.py" % index)
    script.write_text(code)
    result = harness.run_python([str(script)], timeout=300, cwd=str(tmp_path))
    assert result.returncode == 0, "%s snippet %d failed:\n%s\n%s" % (
        page.relative_to(ROOT), index, code, result.stderr[-3000:])


def test_parquet_section_says_what_it_needs_before_the_code():
    """The requirements (and the command that runs the example in their
    environment) come before the example, and the Makefile target exists."""
    section = (ROOT / "docs" / "guides" / "parquet.md").read_text()
    needs, code = section.index("**What it needs.**"), section.index("```python")
    assert needs < code
    assert "make tfio-build" in section[needs:code]
    assert "PYTHONPATH=build/lanes/.venv-tf216 .venv-tf216/bin/python" in section[needs:code]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^tfio-build:", makefile, re.M)


def test_readme_links_into_the_docs_resolve():
    """The README's relative links (docs/..., benchmarks/...) name files that
    exist, so they work on GitHub; `make docs --strict` checks the pages'."""
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text())
    assert any(link.startswith("docs/") for link in links)
    assert [link for link in links if not (ROOT / link).exists()] == []
