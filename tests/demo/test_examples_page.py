"""The site's Examples page (docs/examples.md) shows every program of
examples/, included from the file (pymdownx.snippets), not copied, and names
the command that runs each Python one."""
import pathlib
import re

import harness  # tests/common: ROOT

ROOT = pathlib.Path(harness.ROOT)
PAGE = (ROOT / "docs" / "examples.md").read_text()


def _examples():
    return sorted(str(path.relative_to(ROOT)) for path in (ROOT / "examples").rglob("*")
                  if path.suffix in (".py", ".c"))


def test_every_example_is_included_from_its_file():
    included = re.findall(r'^--8<-- "([^"]+)"$', PAGE, re.M)
    assert included == sorted(set(included), key=included.index)  # each once
    assert sorted(included) == _examples()


def test_every_python_example_has_its_command():
    for example in _examples():
        if example.endswith(".py"):
            assert re.search(r"^    (\S*/)?python .*%s" % re.escape(example), PAGE, re.M), example
