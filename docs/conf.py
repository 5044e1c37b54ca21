"""Sphinx configuration of cellbox's documentation (MyST Markdown, the PyData theme).

Built with warnings as errors by ``tests/test_docs.py``:
``sphinx-build -W -b html docs docs/_build/html``.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The reference pages read the code itself (autodoc, sphinx-argparse), installed or not.
sys.path.insert(0, str(ROOT / "kernel"))

import cellbox  # noqa: E402

project = "cellbox"
author = "the cellbox authors"
copyright = "the cellbox authors"
release = cellbox.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["attrs_block", "colon_fence", "deflist"]
# Headings become link targets (`page.md#limits`) down to the third level.
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Pages on tools people already use, listed in the index's "Integrations" toctree when their file exists, so a
# page can be added (or not yet be written) without a warning.  Add a page's name here when you write it.
INTEGRATIONS = ("nbgrader", "papermill", "gradebooks", "jupyterhub")
INTEGRATIONS_MARKER = "<integrations>"

html_theme = "pydata_sphinx_theme"
html_title = "cellbox"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
# No page needs a static folder of its own.
html_static_path: list[str] = []


def _list_integrations(app: object, docname: str, source: list[str]) -> None:
    """Put the integration pages that exist in place of the index's ``<integrations>`` line (source-read)."""
    if docname == "index":
        present = [name for name in INTEGRATIONS if (Path(__file__).parent / f"{name}.md").exists()]
        source[0] = source[0].replace(INTEGRATIONS_MARKER, "\n".join(present))


def _reread_index(app: object, env: object, added: set[str], changed: set[str], removed: set[str]) -> list[str]:
    """Read the index again when a page came or went, so its integrations toctree follows (env-get-outdated)."""
    return ["index"] if added or removed else []


def setup(app: object) -> dict[str, bool]:
    app.connect("source-read", _list_integrations)  # type: ignore[attr-defined]
    app.connect("env-get-outdated", _reread_index)  # type: ignore[attr-defined]
    return {"parallel_read_safe": True}
