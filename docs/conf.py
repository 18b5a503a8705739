"""Sphinx configuration of gae_xp's docs site: the guides (docs/*.md, MyST) and the API reference (docs/api/),
built from the numpydoc docstrings.

    pip install -e ".[docs]" && python -m sphinx -W --keep-going -b html docs docs/_build/html

The API pages list every public function by themselves (docs/_ext/gae_xp_docs.py reads each module's
``__all__``), and the CLI page prints the argparse help of ``gae-xp`` and its commands.
"""

from __future__ import annotations

import pathlib
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # the docs extra's Python 3.10
    import tomli as tomllib

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]  # the clone's gae_xp (no install needed), the local extension

import gae_xp  # noqa: E402

URLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]  # the project's homes, once

project = "gae_xp"
author = "The gae_xp developers"
copyright = "2026, the gae_xp developers"
release = version = gae_xp.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "gae_xp_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# docs/asv/ is asv's published site, copied as it is; docs/gpu_runs/ holds the GPU check's raw files
exclude_patterns = ["_build", "asv", "_ext", "gpu_runs"]

myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath"]

autosummary_generate = False  # the API pages document each function in place (gae_xp_docs' public-api)
autodoc_typehints = "none"  # numpydoc's Parameters say the types in words
autodoc_default_options = {"member-order": "bysource"}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

html_theme = "alabaster"
html_title = f"gae_xp {release}"
html_static_path: list[str] = []
html_theme_options = {
    "description": "Fast, exact GAE on any array library",
    "extra_nav_links": {"Repository": URLS["Repository"], "Issues": URLS["Issues"], "Changelog": URLS["Changelog"]},
}
