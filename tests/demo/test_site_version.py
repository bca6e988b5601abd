"""One version: tf_tpu_emb.__version__ is what the documentation site shows
(docs/version_hook.py) and what CHANGELOG.md's first section is about
(setup.py reads the same line; tests/packaging checks the installed
metadata against it)."""
import importlib.util
import pathlib
import re

import harness  # tests/common: ROOT

import tf_tpu_emb

ROOT = pathlib.Path(harness.ROOT)


def _hook():
    spec = importlib.util.spec_from_file_location("version_hook", ROOT / "docs" / "version_hook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_shows_the_package_version():
    hook = _hook()
    assert hook.version() == tf_tpu_emb.__version__
    config = hook.on_config({"site_name": "tf_tpu_emb", "copyright": None})
    assert config["site_name"] == "tf_tpu_emb " + tf_tpu_emb.__version__
    assert tf_tpu_emb.__version__ in config["copyright"]


def test_the_changelog_starts_with_the_package_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\S+)", text, re.M)
    assert releases and releases[0] == tf_tpu_emb.__version__, releases
    assert len(set(releases)) == len(releases), "a version with two sections"


def test_the_site_includes_the_changelog():
    page = (ROOT / "docs" / "changelog.md").read_text()
    assert '--8<-- "CHANGELOG.md"' in page
    assert "changelog.md" in (ROOT / "mkdocs.yml").read_text()
