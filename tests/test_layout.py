"""The house's shape: a folder per job, imports in one direction, one name per module.

The import graph is read statically (``ast``) from every module of ``specverify`` and
``experiments``, lazy imports inside functions included: any cycle between two modules, or between
two folders of ``specverify``, fails.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# specverify's folders, lowest first: a folder may import only from folders before it.
LAYERS = ["law", "reference", "kernels", "verify", "stats", "decoding", "integrations", "testing"]


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path):
    """Absolute names of the project modules ``path`` imports (``from . import x`` resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def graph():
    files = [p for top in ("specverify", "experiments") for p in (ROOT / top).rglob("*.py")
             if "__pycache__" not in p.parts]
    modules = {module_name(p): p for p in files}
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


def test_test_basenames_are_unique():
    # every test folder is on pythonpath (pyproject.toml): a basename must name one file
    names = [p.name for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
