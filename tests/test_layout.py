"""The house's shape: a folder per job, imports in one direction, one name per module.

The import graph is read statically (``ast``) from every module of ``specverify`` and
``experiments``, lazy imports inside functions included: any cycle between two modules, or between
two folders of ``specverify``, fails.  No module outside ``reference/`` and ``testing/`` imports
``specverify.reference``, and no module is only a re-export of another (one name per thing).
Each check has a test of its own on planted examples, so that it can fail.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# specverify's folders, lowest first: a folder may import only from folders before it.
LAYERS = ["_math", "law", "reference", "kernels", "verify", "stats", "decoding", "integrations", "testing"]


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path):
    """Absolute names of the project modules ``path`` imports (``from . import x`` resolved)."""
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_in(source, name, is_package=False):
    """Absolute names of the project modules the source of module ``name`` imports."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {n for n in found if n.split(".")[0] in ("specverify", "experiments")}


def project_files():
    return [p for top in ("specverify", "experiments") for p in (ROOT / top).rglob("*.py")
            if "__pycache__" not in p.parts]


def graph():
    modules = {module_name(p): p for p in project_files()}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports_of(path):
            while imported and imported not in modules:  # a name inside a module -> the module
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):
                targets.add(imported)
        edges[name] = targets
    return edges


def find_cycle(edges):
    state, stack = {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                cycle = visit(m)
                if cycle:
                    return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state:
            cycle = visit(n)
            if cycle:
                return cycle
    return None


def test_no_import_cycles_between_modules():
    edges = graph()
    # package __init__ files re-export their own submodules: an edge parent -> child is not a cycle
    edges = {n: {m for m in t if not m.startswith(n + ".")} for n, t in edges.items()}
    assert find_cycle(edges) is None, f"import cycle: {' -> '.join(find_cycle(edges))}"


def test_cycle_finder_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def folder(name):
    parts = name.split(".")
    return parts[1] if parts[0] == "specverify" and len(parts) > 1 else None


def test_specverify_folders_import_downwards_only():
    bad = []
    for name, targets in graph().items():
        here = folder(name)
        if here is None or here not in LAYERS:
            continue
        for t in targets:
            there = folder(t)
            if there in LAYERS and there != here and LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{name} -> {t}")
    assert not bad, "a lower folder imports a higher one:\n" + "\n".join(sorted(bad))


# -- Production reads nothing of the references ------------------------------------------------------
# specverify.reference is the slow statement of what the kernels compute, for the tests to compare
# against. It may be imported by itself and by specverify.testing (whose harness checks any verifier
# against the standard rule, and the standard rule is the reference); by nothing else in specverify:
# math that both a reference and an entry point need lives below both (specverify/_math.py). The
# package root reaches ``sv.reference`` lazily (on first attribute access), so ``import specverify``
# loads none of it either.
REFERENCE_READERS = ("specverify.reference", "specverify.testing")


def reference_importers(sources):
    """Modules of ``sources`` (``{name: (source, is_package)}``) that import specverify.reference
    and may not, sorted."""
    def within(name, packages):
        return any(name == p or name.startswith(p + ".") for p in packages)

    return sorted(name for name, (source, is_package) in sources.items()
                  if within(name, ("specverify",)) and not within(name, REFERENCE_READERS)
                  and any(within(i, ("specverify.reference",)) for i in imports_in(source, name, is_package)))


def project_sources():
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in project_files()}


def test_production_imports_nothing_from_reference():
    bad = reference_importers(project_sources())
    assert not bad, "imports specverify.reference outside reference/ and testing/: " + ", ".join(bad)


def test_reference_check_catches_a_planted_import():
    sources = {
        "specverify.verify.logits": ("from ..reference.warp import min_p_threshold\n", False),
        "specverify.verify.batch": ("def f():\n    from .. import reference\n", False),
        "specverify.decoding.decoder": ("import specverify.reference.tree as rt\n", False),
        "specverify.integrations.x": ("from specverify import reference\n", False),
        "specverify.verify": ("from .._math import temperature_scale\nfrom . import batch\n", True),
        "specverify.reference.warp": ("from .._math import temperature_scale\nfrom .primitives import row_mass\n", False),
        "specverify.testing.exact": ("from specverify.reference import tree\n", False),
    }
    assert reference_importers(sources) == ["specverify.decoding.decoder", "specverify.integrations.x",
                                            "specverify.verify.batch", "specverify.verify.logits"]


# -- One name per thing: no module is only another module under a second name ------------------------
# A module whose body (docstring aside) only imports, sets ``__all__``, puts a module into
# ``sys.modules`` or calls something (``alias(__name__, ...)``, ``sys.exit(other.main())`` under
# ``if __name__ == "__main__"``) defines nothing: it is a second name of what it imports. Package
# ``__init__.py`` files (they state a package's public API) and ``__main__.py`` files (the
# package's ``python -m`` command) are the exceptions.
def is_reexport_only(source):
    """True when the module defines nothing: no def, class or assignment other than ``__all__``."""
    def defines_nothing(statements):
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.Pass)):
                continue
            if isinstance(node, ast.Expr):   # a docstring or a call: neither defines a name
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if all(_is_all_or_sys_modules(t) for t in targets):
                    continue
                return False
            if isinstance(node, ast.If):
                if defines_nothing(node.body) and defines_nothing(node.orelse):
                    continue
                return False
            if isinstance(node, ast.Try):
                if all(defines_nothing(part) for part in (node.body, node.orelse, node.finalbody,
                                                          *(h.body for h in node.handlers))):
                    continue
                return False
            return False
        return True

    tree = ast.parse(source)
    imports = any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree))
    return imports and defines_nothing(tree.body)


def _is_all_or_sys_modules(target):
    if isinstance(target, ast.Name):
        return target.id == "__all__"
    return (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
            and target.value.attr == "modules" and isinstance(target.value.value, ast.Name)
            and target.value.value.id == "sys")


def test_no_module_is_only_a_reexport():
    files = [p for top in ("specverify", "experiments", "tools") for p in (ROOT / top).rglob("*.py")
             if "__pycache__" not in p.parts and p.name not in ("__init__.py", "__main__.py")]
    bad = sorted(str(p.relative_to(ROOT)) for p in files if is_reexport_only(p.read_text()))
    assert not bad, "modules that only re-export another (give the thing one name): " + ", ".join(bad)


def test_reexport_check_catches_the_old_aliases():
    old_ops = '"""Old path of specverify.verify."""\nimport sys\n\nfrom . import verify\n\nsys.modules[__name__] = verify\n'
    old_hub = ('import sys\n\nfrom .integrations import hub\n\nif __name__ == "__main__":\n    sys.exit(hub.main())\n'
               'sys.modules[__name__] = hub\n')
    old_experiment = '"""Old name."""\nfrom ._alias import alias\n\nalias(__name__, "experiments.law.sweep")\n'
    star = 'from .block import *  # noqa\nfrom .chain import accept\n__all__ = ["accept"]\n'
    for source in (old_ops, old_hub, old_experiment, star):
        assert is_reexport_only(source), source
    for source in ('"""Docstring only."""\n', "import numpy as np\n\nSCALE = np.float32(2.0)\n",
                   "from .chain import accept\n\n\ndef f():\n    return accept\n",
                   "import sys\n\ntry:\n    import torch\nexcept ImportError:\n    torch = None\n",
                   "from .x import y\n\n\nclass A(y):\n    pass\n"):
        assert not is_reexport_only(source), source


@pytest.mark.parametrize("name, extra", [("transformers", ["use_grouped_attention", "GroupedAttention"]),
                                         ("learned_draft", [])])
def test_integration_packages_keep_their_names(name, extra):
    # specverify.integrations.transformers and .learned_draft are packages of one module per job;
    # every name each exported as one module is still there, defined in one of its submodules
    pytest.importorskip("torch")
    import importlib

    package = importlib.import_module(f"specverify.integrations.{name}")
    for attr in list(package.__all__) + extra:
        obj = getattr(package, attr)
        if not callable(obj):  # a constant (a path, the gates, the combine modes): no module of its own
            continue
        assert obj.__module__.startswith(package.__name__ + "."), (attr, obj.__module__)


def test_test_basenames_are_unique():
    # every test folder is on pythonpath (pyproject.toml): a basename must name one file
    names = [p.name for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
