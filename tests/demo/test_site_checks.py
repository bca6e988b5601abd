"""The API reference's promises, checked without building the site:

* docs/site_checks_hook.py (which `make docs` runs on every page) finds each
  defect it is there for -- a Parameters row without a type, a Sphinx
  ``Example::`` marker, namedtuple's "Alias for field number", a ``.src.``
  path, an issue number -- and passes a clean page, CSS and scripts
  ignored;
* every parameter of what the typed API pages (the hook's TYPED_PAGES)
  document carries an annotation in the code, so their signatures and
  Parameters tables show a type.  What a page documents is read from its
  ``:::`` directives and their ``members`` options, as mkdocstrings reads
  them: a module's public members (``members: false``: none), a class's
  ``__init__`` and its documented public methods."""
import importlib
import importlib.util
import inspect
import pathlib
import re

import pytest
import harness  # tests/common: ROOT

ROOT = pathlib.Path(harness.ROOT)


def _hook():
    spec = importlib.util.spec_from_file_location(
        "site_checks_hook", ROOT / "docs" / "site_checks_hook.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = _hook()


def _table(*rows):
    """A Parameters table as mkdocstrings-python renders it."""
    body = "".join(
        '<tr class="doc-section-item"><td><code>%s</code></td><td>%s</td>'
        "<td><p>what it is</p></td><td><em>required</em></td></tr>" % row for row in rows)
    return ('<p><span class="doc-section-title">Parameters:</span></p><table><thead><tr>'
            "<th>Name</th><th>Type</th><th>Description</th><th>Default</th></tr></thead>"
            "<tbody>%s</tbody></table>" % body)


CLEAN = ("<h2>TPUEmbedding</h2><p>Example:</p><pre><code>emb.build(64)</code></pre>"
         "<style>.x { color: #880; }</style><script>var a = '#12';</script>"
         "<p>see keras.layers.Layer and section 4</p>"
         + _table(("feature_config", "<code>Union[FeatureConfig, Iterable]</code>")))


def test_a_clean_page_passes():
    assert HOOK.problems(CLEAN, typed=True) == []


def test_a_parameter_without_a_type_is_named():
    page = CLEAN + _table(("batch_size", "<code>int</code>"), ("path", "\n  \n"))
    assert HOOK.problems(page, typed=True) == ["parameter 'path' has no type"]
    assert HOOK.problems(page, typed=False) == []  # only the typed pages


def test_a_table_other_than_parameters_may_have_no_type():
    page = CLEAN + _table(("batch_size", "")).replace("Parameters:", "Raises:")
    assert HOOK.problems(page, typed=True) == []


@pytest.mark.parametrize("leak, what", [
    ("<p>Example::</p>", "Example::"),
    ("<p>Alias for field number 0</p>", "Alias for field number"),
    ("<p>Bases: <code>keras.src.layers.layer.Layer</code></p>", ".src."),
    ("<p>fixed in issue 38</p>", "issue number"),
    ("<p>(see #212)</p>", "issue number"),
])
def test_each_leak_is_found(leak, what):
    found = HOOK.problems(CLEAN + leak)
    assert len(found) == 1 and what in found[0], found


def test_doc_paths_in_running_text_become_links_to_the_site():
    pages = {"guides/parquet.md": "../guides/parquet.html", "engine.md": "../engine.html"}
    page = ('<p>Reads Parquet (docs/guides/parquet.md); see docs/engine.md "Semantics", '
            "docs/missing.md and mydocs/guides/parquet.md.</p>"
            '<p><code>docs/engine.md</code> <a href="x">docs/engine.md</a></p>'
            "<pre>docs/engine.md</pre>")
    got = HOOK.link_doc_paths(page, pages.get)
    assert got == ('<p>Reads Parquet (<a href="../guides/parquet.html">docs/guides/parquet.md</a>)'
                   '; see <a href="../engine.html">docs/engine.md</a> "Semantics", '
                   "docs/missing.md and mydocs/guides/parquet.md.</p>"
                   '<p><code>docs/engine.md</code> <a href="x">docs/engine.md</a></p>'
                   "<pre>docs/engine.md</pre>")


# ------------------------------------------------- the typed pages' code


def _directives(page):
    """[(dotted name, members option: None (all), False or [names])]."""
    out = []
    for block in re.split(r"^::: ", page.read_text(), flags=re.M)[1:]:
        name = block.split()[0]
        options = block.split("\n", 1)[1] if "\n" in block else ""
        options = options.split("\n\n")[0]
        members = None
        if re.search(r"^\s+members: false", options, re.M):
            members = False
        elif re.search(r"^\s+members:\s*$", options, re.M):
            members = re.findall(r"^\s+- (\w+)", options, re.M)
        out.append((name, members))
    return out


def _resolve(dotted):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def _callables(name, obj, members):
    """(label, function) for each signature the page shows of `obj`."""
    if inspect.ismodule(obj):
        if members is False:
            return
        names = members if members is not None else [
            n for n, v in vars(obj).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == obj.__name__
            and (inspect.isclass(v) or inspect.isfunction(v))]
        for member in names:
            yield from _callables(name + "." + member, getattr(obj, member), None)
    elif inspect.isclass(obj):
        if "__init__" in vars(obj):
            yield name, obj.__init__
        names = members if members is not None else [n for n in vars(obj)
                                                     if not n.startswith("_")]
        for member in names:
            value = inspect.getattr_static(obj, member)
            func = getattr(value, "__func__", value)
            if inspect.isfunction(func) and func.__doc__:
                yield name + "." + member, func
    elif inspect.isfunction(obj):
        yield name, obj


def test_the_typed_pages_document_annotated_signatures():
    checked, missing = 0, []
    for page in HOOK.TYPED_PAGES:
        for name, members in _directives(ROOT / "docs" / page):
            for label, func in _callables(name, _resolve(name), members):
                checked += 1
                for parameter in inspect.signature(func).parameters.values():
                    if (parameter.name not in ("self", "cls")
                            and parameter.annotation is inspect.Parameter.empty):
                        missing.append("%s(%s)" % (label, parameter.name))
    assert checked > 30, checked
    assert not missing, "parameters without a type: %s" % ", ".join(missing)
