"""MkDocs hook (mkdocs.yml `hooks`): what a built page must not show.

`make docs` builds with --strict, which catches broken links and docstring
warnings but not a page that renders and reads wrong.  This hook stops the
build on those, naming the page:

* on every page, text that belongs to the source and not to the reader:
  a Sphinx ``Example::`` marker (the docstrings are Google style:
  ``Example:`` and an indented block), namedtuple's generated "Alias for
  field number" docstrings, a library's private ``.src.`` module path (Keras
  3 defines its classes in ``keras.src``; the reference shows their public
  names: docs/griffe_sphinx_roles.py), and an issue number (the tracker is
  not part of the documentation, and pages and code cite documents in the
  repository instead);
* on the API pages of the main classes and functions (TYPED_PAGES): a row
  of a Parameters table with an empty Type column (the public API is
  annotated; tests/demo/test_site_checks.py checks the signatures of what
  those pages document).

It also makes the documents the docstrings cite links: a path such as
docs/guides/parquet.md in a page's running text (the docstrings cite the
repository's documents by path, which reads right in the source and in
help()) becomes a link to that page of the site when the site has it
(`link_doc_paths`).

It also checks that the scripts the site serves itself (mkdocs.yml
`extra_javascript`: the pinned mermaid.js that draws the diagrams, which
`make docs` fetches) are there, so a build without them fails instead of
drawing no diagram.

`problems` is the check itself, importable without MkDocs
(tests/demo/test_site_checks.py)."""
import html
import re

TYPED_PAGES = ("api/mid_level.md", "api/v0.md", "api/keras.md", "api/serving.md",
               "api/cluster.md")

LEAKS = (
    ("a Sphinx 'Example::' marker", re.compile(r"Example::")),
    ("a namedtuple 'Alias for field number' docstring", re.compile(r"Alias for field number")),
    ("a private '.src.' module path", re.compile(r"\w\.src\.\w")),
    ("an issue number", re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w&/#])#\d+\b")),
)

_NOT_TEXT = re.compile(r"<(style|script)\b.*?</\1>", re.S | re.I)
_TAG = re.compile(r"<[^>]+>")
_SECTION = re.compile(r'<span class="doc-section-title">(.*?)</span>(.*?)</table>', re.S)
_ROW = re.compile(r'<tr class="doc-section-item">\s*<td>(.*?)</td>\s*<td>(.*?)</td>', re.S)


def _text(fragment):
    return html.unescape(_TAG.sub("", fragment)).strip()


def problems(page_html, typed=False):
    """What is wrong with one page's content (its HTML as MkDocs renders
    it, before the theme), as sentences; [] for a clean page.  `typed`:
    also every Parameters table row must carry a type."""
    found = []
    text = _text(_NOT_TEXT.sub("", page_html))
    for what, pattern in LEAKS:
        match = pattern.search(text)
        if match:
            context = text[max(0, match.start() - 40):match.end() + 40]
            found.append("%s: ...%s..." % (what, " ".join(context.split())))
    if typed:
        for title, table in _SECTION.findall(page_html):
            if not _text(title).startswith("Parameters"):
                continue
            for name, type_cell in _ROW.findall(table):
                name, type_text = _text(name), _text(type_cell)
                if not type_text:
                    found.append("parameter '%s' has no type" % name)
    return found


_DOC_PATH = re.compile(r"(?<![\w/.-])docs/([\w/.-]+\.md)\b")
_PIECE = re.compile(r"(<[^>]+>)")
_OPENS = re.compile(r"<(a|code|pre)\b", re.I)
_CLOSES = re.compile(r"</(a|code|pre)\s*>", re.I)


def link_doc_paths(page_html, resolve):
    """`page_html` with each docs/<path>.md in its running text (not in a
    tag, a link, code or a code block) made a link to
    ``resolve("<path>.md")``, the page's address of that document, or left
    as it is where ``resolve`` gives None (a document the site lacks)."""
    out, inside = [], 0
    for piece in _PIECE.split(page_html):
        if piece.startswith("<"):
            if _OPENS.match(piece):
                inside += 1
            elif _CLOSES.match(piece):
                inside = max(0, inside - 1)
            out.append(piece)
        elif inside or "docs/" not in piece:
            out.append(piece)
        else:
            def link(match):
                url = resolve(match.group(1))
                return match.group(0) if url is None else '<a href="%s">%s</a>' % (
                    html.escape(url, quote=True), match.group(0))
            out.append(_DOC_PATH.sub(link, piece))
    return "".join(out)


def on_page_content(html_text, page, config, files, **kwargs):  # pylint: disable=unused-argument
    from mkdocs.exceptions import PluginError  # pylint: disable=import-outside-toplevel

    found = problems(html_text, page.file.src_uri in TYPED_PAGES)
    if found:
        raise PluginError("%s shows %s" % (page.file.src_uri, "; ".join(found)))

    def resolve(path):
        target = files.get_file_from_path(path)
        return None if target is None else target.url_relative_to(page.file)
    return link_doc_paths(html_text, resolve)


def on_files(files, config, **kwargs):  # pylint: disable=unused-argument
    from mkdocs.exceptions import PluginError  # pylint: disable=import-outside-toplevel

    for script in config["extra_javascript"]:
        path = str(script)
        if "://" not in path and files.get_file_from_path(path) is None:
            raise PluginError("mkdocs.yml extra_javascript: docs/%s is missing (`make docs` "
                              "fetches it: Makefile MERMAID_VERSION)" % path)
    return files
