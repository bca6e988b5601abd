"""Griffe extensions for `make docs` (mkdocs.yml loads them by path).

The package's docstrings cite other names with Sphinx roles
(:func:`tf_tpu_emb.load_library`, :class:`TPUEmbeddingLayer`, :mod:`...`),
which Markdown would print literally.  The generated API reference shows the
name as code instead, linked to the name's API page where it has one; the
docstrings themselves stay as they are.  Module
constants found by inspection (the reference imports the modules: the
optimizer classes and op wrappers are generated) would show the docstring of
their type (``dict(**kwargs) -> new dictionary ...``); those are dropped.
"""
import ast
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
        obj.docstring.value = _ROLE.sub(lambda m: _link(obj, m), obj.docstring.value)


def _identifier(obj, name):
    """The full path of `name` as a docstring of `obj` cites it: as written
    when it starts with the package, else looked up in the enclosing class
    and module (``:class:`TPUEmbeddingLayer``` in tf_tpu_emb.keras.layers)."""
    if name.startswith("tf_tpu_emb."):
        return name
    head = name.split(".")[0]
    scope = obj if obj.is_class or obj.is_module else obj.parent
    while scope is not None:
        if head in scope.members:
            return scope.path + "." + name
        scope = scope.parent
    return name


def _link(obj, match):
    """A cited name as code, linked to its API page where it has one
    (autorefs' optional reference: no link, and no warning, where it has
    none).  ``~a.b.c`` shows ``c``."""
    written = match.group(0).split("`")[1]
    name = match.group(1)
    title = name.rsplit(".", 1)[-1] if written.startswith("~") else name
    return ('<autoref optional identifier="{}"><code>{}</code></autoref>'
            .format(_identifier(obj, name), title))


_FORWARD_REF = re.compile(r"ForwardRef\((['\"]?)(.*?)\1\)")


def _unwrap_forward_refs(annotation, parent):
    """``Optional[ForwardRef('keras.Model')]`` (what inspection finds for a
    string inside a typing construct) -> ``Optional[keras.Model]``; the
    ``NoneType`` of ``Optional[Union[...]]`` -> ``None``."""
    text = str(annotation)
    if annotation is None or ("ForwardRef(" not in text and "NoneType" not in text):
        return annotation
    text = re.sub(r"\bNoneType\b", "None", _FORWARD_REF.sub(r"\2", text))
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return text
    return griffe.safe_get_annotation(node, parent) or text


def _public_base(base):
    """The public name of a base class that only its private module names
    (Keras 3's ``keras.src.layers.layer.Layer`` -> ``keras.layers.Layer``,
    from the names Keras exports it under), or None."""
    if ".src." not in getattr(base, "__module__", ""):
        return None
    names = getattr(base, "_api_export_path", None)
    if isinstance(names, str):
        names = [names]
    return max(names, key=len) if names else None


class TypesAsWritten(griffe.Extension):
    """Annotations and base classes as the reader would write them: string
    annotations inside ``Optional[...]``/``Union[...]`` without their
    ``ForwardRef(...)`` wrapper, and a base class from a library's private
    ``.src.`` module under its public name."""

    def on_function_instance(self, *, func, **kwargs):  # pylint: disable=unused-argument
        for parameter in func.parameters:
            parameter.annotation = _unwrap_forward_refs(parameter.annotation, func.parent)
        func.returns = _unwrap_forward_refs(func.returns, func.parent)

    def on_class_instance(self, *, node, cls, **kwargs):  # pylint: disable=unused-argument
        runtime = getattr(node, "obj", None)
        runtime_bases = getattr(runtime, "__bases__", ())
        if len(runtime_bases) != len(cls.bases):
            return
        cls.bases = [_public_base(b) or old for b, old in zip(runtime_bases, cls.bases)]
