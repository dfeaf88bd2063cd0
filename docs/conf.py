"""Sphinx configuration for specverify's documentation.

Build (from the repository root, after the install command of the README):

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

The notebooks in ``notebooks/`` are committed without outputs; the build copies them into
``docs/notebooks/`` and executes them (myst-nb, cached by jupyter-cache in ``docs/_build/.jupyter_cache``,
so a rebuild re-runs only the notebooks that changed). ``SPECVERIFY_DOCS_EXECUTE=off`` renders them
without running them, for a quick look at the prose.
"""

import os
import re
import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

import specverify  # noqa: E402  (after the path: the checkout's package, not an installed one)

# -- The notebooks: copied in (Sphinx reads sources under docs/ only), executed with outputs ------
NOTEBOOK_COPY = DOCS / "notebooks"
NOTEBOOK_COPY.mkdir(exist_ok=True)
for stale in NOTEBOOK_COPY.glob("*.ipynb"):
    if not (ROOT / "notebooks" / stale.name).exists():
        stale.unlink()
for source in sorted((ROOT / "notebooks").glob("*.ipynb")):
    target = NOTEBOOK_COPY / source.name
    # Copy only when the text changed, so the cache and Sphinx's own change detection stay valid.
    if not target.exists() or target.read_bytes() != source.read_bytes():
        shutil.copyfile(source, target)

# The kernels that execute the notebooks inherit this environment: the checkout's root on the path
# (for ``experiments``), the notebooks' results and figures under the build directory (never in the
# repository), no network, and matplotlib's inline backend (an MPLBACKEND of Agg would hide plots).
BUILD_SCRATCH = DOCS / "_build" / "notebook_outputs"
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
os.environ["SPECVERIFY_RESULTS"] = str(BUILD_SCRATCH / "results")
os.environ["SPECVERIFY_MEDIA"] = str(BUILD_SCRATCH / "media")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("MPLBACKEND", None)

# -- Project --------------------------------------------------------------------------------------
project = "specverify"
author = "the specverify authors"
copyright = "2026, the specverify authors"
release = specverify.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_nb",                    # MyST markdown pages and executed notebooks (includes myst_parser)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",        # Google-style docstrings
    "sphinx.ext.mathjax",
    "sphinx.ext.doctest",
]

# .rst first: autosummary writes its generated stubs (reST) with the first suffix.
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "**.ipynb_checkpoints", "Thumbs.db", ".DS_Store"]
root_doc = "index"

# -- MyST -----------------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
myst_footnote_transition = False

# -- Notebook execution (myst-nb) -----------------------------------------------------------------
nb_execution_mode = os.environ.get("SPECVERIFY_DOCS_EXECUTE", "cache")
nb_execution_cache_path = str(DOCS / "_build" / ".jupyter_cache")
nb_execution_timeout = 600                     # per cell, as the notebooks test allows a long cell
nb_execution_raise_on_error = True             # a failing cell fails the build
nb_execution_show_tb = True
nb_execution_excludepatterns = []
nb_merge_streams = True
nb_kernel_rgx_aliases = {".*": "python3"}

# -- autodoc / autosummary / napoleon -------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True

# No network during the build (CI reaches package registries only), so no intersphinx: names of
# other libraries in signatures and docstrings stay plain text instead of failing nitpicky mode.
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|numpy|np|transformers|scipy|pandas|matplotlib|kernels|gguf|collections|typing|concurrent|pathlib|os|argparse)(\..*)?"),
    (r"py:.*", r"(Tensor|ndarray|Generator|ArrayLike|NDArray|Callable|Optional|Sequence|Iterable|Tuple|List|Path|PathLike|Module|PreTrainedModel|PreTrainedTokenizerBase|DynamicCache|Cache|Executor|dtype|array_like|callable|optional|sequence|iterable|tuple|list|dict|int|float|bool|str|bytes|None|object)"),
    (r"py:class", r".*\[.*"),   # subscripted annotations as napoleon writes them, e.g. "list[int]"
    (r"py:.*", r"(.*\.)?_[A-Za-z].*"),   # private helpers named in annotations (not documented)
    (r"py:class", r"(DraftStep|TargetStep)"),   # the decoder's callback type aliases, in signatures
]

# -- HTML -----------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"specverify {release}"
html_static_path = []
templates_path = ["_templates"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "header_links_before_dropdown": 4,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars = {"**": ["sidebar-nav-bs"], "index": []}
html_last_updated_fmt = None
html_copy_source = False

# The README's figures and the bench's tables live in media/; pages include them from there.
html_extra_path = []

# -- doctest --------------------------------------------------------------------------------------
doctest_global_setup = """
import numpy as np
import torch
import specverify as sv
"""


def _strip_private(app, what, name, obj, skip, options):
    """Document only public names (no leading underscore), whatever a module's ``__all__`` says."""
    short = name.rsplit(".", 1)[-1]
    if re.match(r"^_[^_]", short):
        return True
    return skip


def setup(app):
    app.connect("autodoc-skip-member", _strip_private)
