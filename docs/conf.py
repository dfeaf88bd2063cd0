"""Sphinx configuration for specverify's documentation.

Build (from the repository root, after the install command of the README):

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

The notebooks in ``notebooks/`` are committed without outputs; the build copies them into
``docs/notebooks/`` and executes them (myst-nb, cached by jupyter-cache in ``docs/_build/.jupyter_cache``,
so a rebuild re-runs only the notebooks that changed). ``SPECVERIFY_DOCS_EXECUTE=off`` renders them
without running them, for a quick look at the prose.
"""

import ast
import importlib
import inspect
import os
import pkgutil
import re
import shutil
import sys
import types
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))

from sphinx.util.docutils import SphinxDirective  # noqa: E402

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
napoleon_use_ivar = True          # a dataclass's Attributes section and its fields: one entry each

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


# Packages whose page documents the names they export (``__all__``): a submodule's page does not
# repeat those (its docstring gets a line linking to them instead), so a function added to one of
# these packages' ``__all__`` appears on the package page with no page edit.
PACKAGE_PAGES = ("specverify", "specverify.law", "specverify.testing", "specverify.integrations.transformers",
                 "specverify.integrations.learned_draft")
_current_module = [None]   # the module autodoc is documenting (its docstring comes before its members)


def _public_names(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, v in vars(module).items() if not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
    return [n for n in names if not n.startswith("_")]


def _exported_above(modname, name, obj):
    """The package (of PACKAGE_PAGES, above ``modname``) whose page documents ``obj`` as ``name``."""
    if not hasattr(obj, "__qualname__"):   # data: documented where defined (its #: comment is there)
        return None
    for package in PACKAGE_PAGES:
        if modname != package and modname.startswith(package + "."):
            module = sys.modules.get(package) or importlib.import_module(package)
            if name in getattr(module, "__all__", ()) and getattr(module, name, None) is obj:
                return package
    return None


def _note_module(app, what, name, obj, options, lines):
    """Record the module being documented; on a submodule's page, link the names documented above."""
    if what != "module":
        return
    _current_module[0] = name
    moved = {}
    for member in _public_names(obj):
        package = _exported_above(name, member, getattr(obj, member, None))
        if package:
            moved.setdefault(package, []).append(member)
    for package, members in moved.items():
        links = ", ".join(f":py:obj:`~{package}.{m}`" for m in members)
        lines.extend(["", f"Documented with :py:mod:`{package}`: {links}.", ""])
    # autodoc documents a module's constants only when they carry a ``#:`` comment (Sphinx #1063):
    # the public ones assigned here get an entry anyway.
    # (py:data, not autodata: autodata would show the docstring of the value's type.)
    for member in _public_data(obj):
        value = getattr(obj, member)
        lines.extend(["", f".. py:data:: {member}", f"   :module: {name}", f"   :type: {_type_name(value)}"]
                     + ([f"   :value: {value!r}"] if len(repr(value)) <= 100 else []) + [""])


def _type_name(value):
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _public_data(module):
    """Public constants assigned at the module's top level and not documented by a ``#:`` comment."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return []
    from sphinx.pycode import ModuleAnalyzer

    documented = {attr for (_, attr) in ModuleAnalyzer.for_string(source, module.__name__).find_attr_docs()}
    assigned = []
    for statement in ast.parse(source).body:
        targets = statement.targets if isinstance(statement, ast.Assign) else [getattr(statement, "target", None)]
        assigned += [t.id for t in targets if isinstance(t, ast.Name)]
    exported = getattr(module, "__all__", None)
    names = [n for n in dict.fromkeys(assigned) if not n.startswith("_") and n not in documented
             and (exported is None or n in exported) and hasattr(module, n)]
    return [n for n in names if not (callable(getattr(module, n)) or isinstance(getattr(module, n), types.ModuleType))]


def _skip_member(app, what, name, obj, skip, options):
    """Document only public names (no leading underscore), whatever a module's ``__all__`` says,
    and each name once: on its package's page when a package of PACKAGE_PAGES exports it."""
    short = name.rsplit(".", 1)[-1]
    if re.match(r"^_[^_]", short):
        return True
    if what == "module" and _current_module[0] and _exported_above(_current_module[0], short, obj):
        return True
    return skip


# Docstrings name objects the way Python reaches them from where the docstring is written
# (``specverify.reference.row_mass``, re-exported from ``reference.primitives``; ``DecodeStats``
# inside the decoder's module, whose class is documented as ``specverify.SpeculativeDecoder``). A
# cross-reference that names no documented entry resolves to the entry of the same Python object
# when exactly one exists (a bare name: the one documented entry of that name); an object of a
# private module (not documented, by the policy above) is shown as plain code; anything else stays
# an error under -n.
_PRIMITIVE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset)


def _lookup(dotted):
    """The object Python reaches by ``dotted`` (attributes first, submodules imported as needed)."""
    parts = dotted.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except ImportError:
        return None
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:i + 1]))
        except ImportError:
            return None
    return obj


def _home(obj):
    return obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None) or ""


def _scopes(node):
    """Where the name is looked up: the page's module and class, then the docstring's own."""
    scopes = [".".join(filter(None, [node.get("py:module"), node.get("py:class")])), node.get("py:module") or ""]
    owner = re.search(r"docstring of ([\w.]+)", str(node.source or ""))
    if owner:
        owner_obj = _lookup(owner.group(1))
        module = _home(owner_obj) if owner_obj is not None else ""
        if module:
            qualname = getattr(owner_obj, "__qualname__", "")
            scopes += [f"{module}.{qualname.rsplit('.', 1)[0]}" if "." in qualname else "",
                       f"{module}.{qualname}" if isinstance(owner_obj, type) else "", module]
    return list(dict.fromkeys([*filter(None, scopes), ""]))


def _same_object(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    py = env.domains.python_domain
    # Entries of a kind the role can name (``:attr:`stats``` never lands on the module ``stats``).
    kinds = set(py.objtypes_for_role(node["reftype"]) or ())
    everything = set(py.objects) | set(py.modules)
    documented = {name for name, entry in py.objects.items() if entry.objtype in kinds}
    documented |= {name for name in py.modules if "module" in kinds}

    def resolve(name):
        new = node.deepcopy()
        new["reftarget"] = name
        return py.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], name, new, contnode)

    for scope in _scopes(node):
        parts = (f"{scope}.{target}" if scope else target).split(".")
        for cut in range(len(parts), 0, -1):
            obj = _lookup(".".join(parts[:cut]))
            if obj is None or isinstance(obj, _PRIMITIVE):
                continue
            rest, short = parts[cut:], parts[cut - 1]
            entries = [name for name in everything
                       if (name == short or name.endswith("." + short)) and _lookup(name) is obj]
            entries = [n for n in (".".join([name, *rest]) for name in entries) if n in documented]
            if len(entries) > 1:   # documented twice: the entry in its defining module wins
                entries = [n for n in entries if n.rsplit(".", 1)[0] == _home(obj)] or sorted(entries)[:1]
            if entries:
                return resolve(entries[0])
            if any(part.startswith("_") for part in _home(obj).split(".")) and not rest:
                return contnode   # defined in a private module: not documented, shown as code
            break
    if "." not in target:
        entries = [name for name in documented if name.endswith("." + target)]
        if len(entries) == 1:
            return resolve(entries[0])
    return None


class OtherSubmodules(SphinxDirective):
    """``.. other-submodules:: package``: an entry (``automodule``) for each public submodule of
    ``package`` that the page does not document itself, so a module added to the package appears
    with no page edit. Found from the files (``pkgutil``), so ``__main__`` is never imported."""

    required_arguments = 1

    def run(self):
        package = importlib.import_module(self.arguments[0])
        source = Path(self.env.doc2path(self.env.docname)).read_text()
        listed = set(re.findall(r"automodule::\s*(\S+)", source))
        lines = []
        for info in pkgutil.iter_modules(package.__path__):
            name = f"{package.__name__}.{info.name}"
            if not info.name.startswith("_") and name not in listed:
                lines += [f".. automodule:: {name}", ""]
        return self.parse_text_to_nodes("\n".join(lines)) if lines else []


def setup(app):
    app.add_directive("other-submodules", OtherSubmodules)
    app.connect("autodoc-process-docstring", _note_module)
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("missing-reference", _same_object)
