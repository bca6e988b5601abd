"""MkDocs hook (mkdocs.yml `hooks`): links between pages in a notebook.

Markdown pages link to each other by their source path (`guides/serving.md`)
and MkDocs rewrites those links to the built pages and, with --strict, fails
on one that leads nowhere.  A notebook page (docs/quickstart.ipynb, converted
by mkdocs-jupyter) gets neither: its HTML would keep `guides/serving.md`,
which the built site does not have.  This hook does both for notebook pages:
every relative `href` to a `.md` file becomes that page's URL (anchor kept),
and one to a file that is not in the site stops the build."""
import posixpath
import re

from mkdocs.exceptions import PluginError

_HREF = re.compile(r'href="(?![a-z][a-z0-9+.-]*:|/|#)([^"#]+\.md)(#[^"]*)?"')


def on_page_content(html, page, config, files, **kwargs):
    if not page.file.src_uri.endswith(".ipynb"):
        return html

    def rewrite(match):
        path, anchor = match.group(1), match.group(2) or ""
        target = files.get_file_from_path(
            posixpath.normpath(posixpath.join(posixpath.dirname(page.file.src_uri), path)))
        if target is None:
            raise PluginError("%s links to %s, which is not a page of the site"
                              % (page.file.src_uri, path))
        return 'href="%s%s"' % (target.url_relative_to(page.file), anchor)

    return _HREF.sub(rewrite, html)
