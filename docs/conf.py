"""Sphinx configuration: one site for the three packages (``nox -s docs`` builds it with -W)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Import the packages from their folders when they are not installed (a checkout without nox).
for package in ("iris-device", "iris-runtime", "iris-collectives"):
    src = os.path.join(ROOT, "packages", package, "src")
    if src not in sys.path:
        sys.path.append(src)
sys.path.insert(0, os.path.join(HERE, "_ext"))

# The cpu backend: the docs build needs no GPU. Set before anything imports iris.runtime (it
# decides whether Triton's interpreter is on at import); the API pages read the same either way.
os.environ.setdefault("IRIS_BACKEND", "cpu")

project = "Iris for NVIDIA"
author = "Iris for NVIDIA contributors"
copyright = "2026, Iris for NVIDIA contributors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "iris_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**/README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
# Result files shown on the benchmarks page bring headings of their own, at levels we do not control.
suppress_warnings = ["myst.header"]

autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # kernels take Triton values; the docstrings say what each is
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# pydata-sphinx-theme: made for API references with long code (NumPy's, pandas', and the base of
# NVIDIA's own theme); with the page contents moved to the left column, the article is wide enough
# for 100-120 character code lines at 1366 px (tools/check_docs_layout.py checks it).
html_theme = "pydata_sphinx_theme"
html_static_path = ["_static"]
html_css_files = ["layout.css"]
html_title = "Iris for NVIDIA"
html_theme_options = {
    "navbar_align": "left",
    "secondary_sidebar_items": [],  # no right-hand column: its width goes to the code
    "show_prev_next": True,
    "navigation_with_keys": False,
}
# The page's own contents under the site navigation, where the right-hand column had them.
html_sidebars = {"**": ["sidebar-nav-bs", "page-toc"]}
