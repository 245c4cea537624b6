"""mkdocs hooks of the docs site (``mkdocs.yml``): the pages stay readable on GitHub as they are, the site gets

- the repository's ``README.md``, ``CONTRIBUTING.md`` and ``CHANGELOG.md`` as the pages ``overview.md``,
  ``contributing.md`` and ``changelog.md`` (their ``docs/X.md`` links become ``X.md``);
- the repository files the pages link to outside ``docs/`` (figures, scripts) copied under ``repo/``, and the
  links rewritten to them, so that ``--strict`` still fails on a link to a file that does not exist;
- Sphinx roles of the docstrings (``:func:`~mmpos.x.f```) shown as plain code (mkdocstrings renders Markdown).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
ROOT_PAGES = {"README.md": "overview.md", "CONTRIBUTING.md": "contributing.md", "CHANGELOG.md": "changelog.md"}
REPO = "repo"  # where the linked repository files appear in the site
LINK = re.compile(r"(\]\()(?!https?:|mailto:|#)([^)\s#]+)(#[^)\s]*)?(\))")
ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|const):<code>~?\.?")


def _site_target(target: str, page_dir: Path) -> str | None:
    """The site path (from the docs root) a relative link of a page in ``page_dir`` points to; None: a link
    mkdocs checks as it is (e.g. to a file that does not exist)."""
    path = (page_dir / target).resolve()
    if path.parent == ROOT and path.name in ROOT_PAGES:
        return ROOT_PAGES[path.name]
    if path.is_relative_to(DOCS):
        return path.relative_to(DOCS).as_posix()
    if path.is_relative_to(ROOT) and path.is_file():
        return f"{REPO}/{path.relative_to(ROOT).as_posix()}"
    return None


def _rewrite(markdown: str, page_dir: Path, site_dir: str, linked: set[str]) -> str:
    """Links of a page read from ``page_dir`` and shown at ``site_dir`` (from the docs root), pointed at the site."""

    def replace(match: re.Match) -> str:
        target = _site_target(match[2], page_dir)
        if target is None:
            return match[0]
        if target.startswith(f"{REPO}/"):
            linked.add(target[len(REPO) + 1 :])
        relative = posixpath.relpath(target, site_dir or ".")
        return f"{match[1]}{relative}{match[3] or ''}{match[4]}"

    return LINK.sub(replace, markdown)


def _pages() -> list[tuple[Path, Path]]:
    """(markdown file, the folder its links are relative to) of every page."""
    return [(ROOT / name, ROOT) for name in ROOT_PAGES] + [(page, page.parent) for page in sorted(DOCS.rglob("*.md"))]


def on_files(files: Files, config: Any) -> Files:
    linked: set[str] = set()
    for page, folder in _pages():
        _rewrite(page.read_text(), folder, "", linked)
    for name, page in ROOT_PAGES.items():
        files.append(File.generated(config, page, content=(ROOT / name).read_text()))
    for path in sorted(linked):
        files.append(File.generated(config, f"{REPO}/{path}", abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    site_dir = posixpath.dirname(page.file.src_uri)
    folder = ROOT if page.file.src_uri in ROOT_PAGES.values() else DOCS / site_dir
    return _rewrite(markdown, folder, site_dir, set())


def on_page_content(html: str, page: Any, config: Any, files: Files) -> str:
    return ROLE.sub("<code>", html)
