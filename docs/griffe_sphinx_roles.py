"""A griffe extension for `make docs` (mkdocs.yml loads it by path).

The package's docstrings cite other names with Sphinx roles
(:func:`tf_tpu_emb.load_library`, :class:`TPUEmbeddingLayer`, :mod:`...`),
which Markdown would print literally.  The generated API reference shows the
name as code instead; the docstrings themselves stay as they are.  Module
constants found by inspection (the reference imports the modules: the
optimizer classes and op wrappers are generated) would show the docstring of
their type (``dict(**kwargs) -> new dictionary ...``); those are dropped.
"""
import inspect
import re

import griffe

_TYPE_DOCS = {inspect.cleandoc(t.__doc__) for t in
              (dict, list, tuple, set, frozenset, str, bytes, int, float, bool)}
_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj):`~?([^`]+)`")


class SphinxRolesAsCode(griffe.Extension):
    """:role:`name` -> `name` in every docstring of the loaded objects."""

    def on_object(self, *, obj, **kwargs):  # pylint: disable=unused-argument
        if obj.docstring is None:
            return
        if obj.is_attribute and inspect.cleandoc(obj.docstring.value) in _TYPE_DOCS:
            obj.docstring = None
            return
        obj.docstring.value = _ROLE.sub(r"`\1`", obj.docstring.value)
