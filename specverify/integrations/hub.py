"""Write a Hugging Face ``kernels`` repository from the installed (compiled) specverify package.

    python -m specverify.integrations.hub build [--out DIR] [--arch]

so that the seed's call works offline against the local build::

    LOCAL_KERNELS="phanerozoic/spec-verify=DIR" HF_HUB_OFFLINE=1 python -c '
    from kernels import get_kernel
    sv = get_kernel("phanerozoic/spec-verify", version=1, trust_remote_code=True)'

or ``kernels.get_local_kernel(Path(DIR))``. Layout written (``DIR`` defaults to ``build/hub``)::

    DIR/build/torch-cpu/metadata.json
    DIR/build/torch-cpu/spec_verify/__init__.py, verify/, law/, ..., kernels/_kernels.<abi-tag>.so
    DIR/build/torch-universal/...                     same files, own metadata id
    DIR/build/torch<XY>-cxx11-cpu-<machine>-linux/... only with --arch

How ``kernels`` 0.17 reads this (kernels/resolver.py, variants.py, importer.py):

- a variant directory is ``build/<variant>/`` holding ``metadata.json`` and the package
  ``<name with '-' -> '_'>/__init__.py``; ``torch-cpu`` (noarch) is accepted when the torch
  backend is CPU, ``torch-universal`` (legacy noarch) on every backend, so a CUDA build of torch
  still finds the kernel; ``torch<XY>[-cxx11]-cpu-<machine>-<os>`` (arch) pins the torch minor
  version, CPU and OS and is preferred over both when it matches.
- the package is imported with ``spec_from_file_location(metadata["id"], .../__init__.py)`` and
  registered as ``sys.modules[id]``: every import inside the package must be relative (an
  absolute ``import specverify`` would silently reach an installed copy, or fail without one),
  and ``id`` must change with the content, or two builds loaded in one process share stale
  submodules (``<id>.ops`` stays in ``sys.modules``). The id here is
  ``spec_verify_<sha256 of the package files, 12 hex>_<variant>``.
- ``metadata.json`` needs ``id``, ``name``, ``version`` (int; ``get_kernel(..., version=1)``
  selects the release branch on the Hub, a ``LOCAL_KERNELS`` path is taken as is),
  ``license``, ``python-depends`` (an allow-list of names; ``[]``) and ``backend``.

The compiled extension is copied as built (``pip install -e . --no-build-isolation``): it is
specific to this CPU family, OS and Python ABI unless the extension was built abi3, so a
build made here is for machines like this one.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.machinery
import json
import platform
import shutil
import sys
from pathlib import Path
from typing import List, Sequence, Tuple

__all__ = [
    "KERNEL_NAME",
    "HUB_REPO_ID",
    "HUB_VERSION",
    "NOARCH_VARIANTS",
    "HubBuildError",
    "package_files",
    "absolute_self_imports",
    "content_hash",
    "arch_variant",
    "metadata",
    "build",
    "main",
]

KERNEL_NAME = "spec-verify"  # the Hub repository's name; the package directory is spec_verify/
HUB_REPO_ID = "phanerozoic/spec-verify"  # the seed's repository id (for LOCAL_KERNELS)
HUB_VERSION = 1  # the seed's get_kernel(..., version=1)
LICENSE = "apache-2.0"
NOARCH_VARIANTS = ("torch-cpu", "torch-universal")
DEFAULT_OUT = Path("build") / "hub"

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_PACKAGE = _PACKAGE_DIR.name  # "specverify"
_EXCLUDED = {"integrations/hub.py"}  # the build tool is not part of the kernel
_EXCLUDED_DIRS = {"testing"}  # the validation harness is a tool for tests, not part of the kernel


class HubBuildError(RuntimeError):
    """The package cannot be turned into a loadable kernel repository (reason in the message)."""


def _python_name(name: str) -> str:
    return name.replace("-", "_")


def package_files(package_dir: Path = _PACKAGE_DIR) -> List[Path]:
    """Files of the kernel package, relative to ``package_dir``, sorted.

    Every ``*.py`` (sub-packages included, this build tool excluded) and every compiled
    extension loadable by this interpreter (``importlib.machinery.EXTENSION_SUFFIXES``).
    Sources of the extension (``.pyx``, ``.c``), caches and bytecode are left out.
    """
    package_dir = Path(package_dir)
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    out = []
    for path in package_dir.rglob("*"):
        rel = path.relative_to(package_dir)
        if not path.is_file() or "__pycache__" in rel.parts or any(p.startswith(".") for p in rel.parts):
            continue
        if rel.as_posix() in _EXCLUDED or rel.parts[0] in _EXCLUDED_DIRS:
            continue
        if path.suffix == ".py" or path.name.endswith(suffixes):
            out.append(rel)
    return sorted(out, key=lambda p: p.as_posix())


def absolute_self_imports(package_dir: Path = _PACKAGE_DIR, files: Sequence[Path] = None,
                          package: str = _PACKAGE) -> List[Tuple[str, int, str]]:
    """``(file, line, statement)`` for every ``import <package>...`` / ``from <package>... import``.

    Parsed with ``ast``, so examples in docstrings do not count; imports inside functions do.
    """
    package_dir = Path(package_dir)
    files = package_files(package_dir) if files is None else files
    found = []
    for rel in files:
        if rel.suffix != ".py":
            continue
        source = (package_dir / rel).read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source, filename=str(rel))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(n == package or n.startswith(package + ".") for n in names):
                found.append((rel.as_posix(), node.lineno, ast.get_source_segment(source, node) or ""))
    return found


def content_hash(package_dir: Path = _PACKAGE_DIR, files: Sequence[Path] = None) -> str:
    """SHA-256 (hex) over the sorted relative paths and bytes of the kernel package files."""
    package_dir = Path(package_dir)
    files = package_files(package_dir) if files is None else files
    h = hashlib.sha256()
    for rel in sorted(files, key=lambda p: p.as_posix()):
        h.update(rel.as_posix().encode() + b"\0")
        data = (package_dir / rel).read_bytes()
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def arch_variant() -> str:
    """The arch variant of this environment, e.g. ``torch213-cxx11-cpu-x86_64-linux``."""
    import torch  # only the arch variant depends on torch

    version = torch.__version__.split("+")[0].split(".")
    system = platform.system().lower()
    abi = ""
    if system == "linux":
        abi = "-cxx11" if torch.compiled_with_cxx11_abi() else "-cxx98"
    machine = platform.machine()
    machine = {"arm64": "aarch64", "AMD64": "x86_64"}.get(machine, machine)
    return f"torch{version[0]}{version[1]}{abi}-cpu-{machine}-{system}"


def metadata(variant: str, digest: str) -> dict:
    """``metadata.json`` of one variant; ``digest`` is :func:`content_hash`'s hex string."""
    return {
        "id": f"{_python_name(KERNEL_NAME)}_{digest[:12]}_{variant.replace('-', '_')}",
        "name": KERNEL_NAME,
        "version": HUB_VERSION,
        "license": LICENSE,
        "python-depends": [],
        "backend": {"type": "cpu"},
    }


def build(out: Path = DEFAULT_OUT, *, arch: bool = False, package_dir: Path = _PACKAGE_DIR) -> Path:
    """Write the kernel repository into ``out`` and return ``out``.

    Each variant directory this writes is replaced as a whole (nothing else under ``out`` is
    touched). Raises :class:`HubBuildError` if the compiled extension is missing or the package
    imports itself by absolute name.
    """
    out = Path(out)
    package_dir = Path(package_dir)
    files = package_files(package_dir)
    if not any(rel.name.startswith("_kernels.") and rel.suffix != ".py" for rel in files):
        raise HubBuildError(
            f"no compiled _kernels extension for this Python in {package_dir} "
            f"(suffixes {importlib.machinery.EXTENSION_SUFFIXES}); build it first with "
            "`pip install -e . --no-build-isolation`")
    bad = absolute_self_imports(package_dir, files)
    if bad:
        lines = "\n".join(f"  {f}:{n}: {s}" for f, n, s in bad)
        raise HubBuildError(
            "the kernel package is registered under its metadata id, so it must import itself "
            f"relatively (`from . import verify`), found absolute imports of {_PACKAGE!r}:\n{lines}")

    digest = content_hash(package_dir, files)
    variants = list(NOARCH_VARIANTS) + ([arch_variant()] if arch else [])
    for variant in variants:
        vdir = out / "build" / variant
        if vdir.exists():
            shutil.rmtree(vdir)
        pkg = vdir / _python_name(KERNEL_NAME)
        for rel in files:
            (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(package_dir / rel, pkg / rel)
        (vdir / "metadata.json").write_text(json.dumps(metadata(variant, digest), indent=2) + "\n")
    return out


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specverify.integrations.hub", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="write a kernels repository (build/<variant>/...) into --out")
    b.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    b.add_argument("--arch", action="store_true",
                   help="also write the torch-version/CPU/OS-pinned variant of this environment")
    args = parser.parse_args(argv)
    try:
        out = build(args.out, arch=args.arch)
    except HubBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for meta in sorted((out / "build").glob("*/metadata.json")):
        print(f"{meta.parent}  id={json.loads(meta.read_text())['id']}")
    print(f'LOCAL_KERNELS="{HUB_REPO_ID}={out.resolve()}" makes '
          f'get_kernel("{HUB_REPO_ID}", version={HUB_VERSION}, trust_remote_code=True) load it')
    return 0


if __name__ == "__main__":
    sys.exit(main())
