"""MkDocs hook (mkdocs.yml `hooks`): the site shows the package's version.

The one version is ``tf_tpu_emb.__version__``; like setup.py, this reads it
from ``tf_tpu_emb/__init__.py`` (not imported: that would need TensorFlow)
and puts it in the site's name (the header and every page title) and its
footer."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def version():
    with open(os.path.join(ROOT, "tf_tpu_emb", "__init__.py"), encoding="utf-8") as f:
        match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if match is None:
        raise ValueError("tf_tpu_emb/__init__.py has no __version__ line")
    return match.group(1)


def on_config(config, **kwargs):
    name = "%s %s" % (config["site_name"], version())
    config["site_name"] = name
    config["copyright"] = "%s · Apache-2.0" % name
    return config
