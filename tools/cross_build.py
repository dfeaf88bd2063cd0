"""Generate the kernels' C exactly as setup.py would, without touching the source tree.

    python tools/cross_build.py --repo . --out BUILD_DIR

Executes setup.py with ``cythonize`` and ``setup`` intercepted (SPECVERIFY_CPU=none, so no CPU
flag is captured; SPECVERIFY_BOUNDSCHECK and SPECVERIFY_BUILD unset, i.e. the release directives), then runs the real
``cythonize`` with the captured compiler directives into BUILD_DIR (never next to the .pyx).
Prints one tab-separated line per extension for the shell:

    <module name> <TAB> <generated .c> <TAB> <.pyx> <TAB> <extra compile args, space separated>
"""
from __future__ import annotations

import argparse
import os
import runpy
import shlex
import sys


def capture_setup(repo: str):
    import setuptools
    import Cython.Build

    captured = {}

    def fake_cythonize(module_list, *args, **kwargs):
        captured["extensions"] = module_list
        captured["kwargs"] = kwargs
        return []

    def fake_setup(**kwargs):
        captured["setup"] = kwargs

    saved = (Cython.Build.cythonize, setuptools.setup, os.getcwd(), list(sys.argv), dict(os.environ))
    try:
        Cython.Build.cythonize = fake_cythonize
        setuptools.setup = fake_setup
        os.environ["SPECVERIFY_CPU"] = "none"
        os.environ.pop("SPECVERIFY_BOUNDSCHECK", None)
        os.environ.pop("SPECVERIFY_BUILD", None)
        os.chdir(repo)
        sys.argv = ["setup.py", "--name"]
        runpy.run_path("setup.py", run_name="__main__")
    finally:
        Cython.Build.cythonize, setuptools.setup = saved[0], saved[1]
        os.chdir(saved[2])
        sys.argv = saved[3]
        os.environ.clear()
        os.environ.update(saved[4])
    if "extensions" not in captured:
        raise SystemExit("cross_build: setup.py did not call Cython.Build.cythonize(...)")
    return captured["extensions"], captured["kwargs"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    repo, out = os.path.abspath(a.repo), os.path.abspath(a.out)
    exts, kwargs = capture_setup(repo)
    from Cython.Build import cythonize

    os.makedirs(out, exist_ok=True)
    kwargs = dict(kwargs)
    kwargs.pop("build_dir", None)
    kwargs["build_dir"] = out
    kwargs["force"] = True
    kwargs["quiet"] = True
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        built = cythonize(exts, **kwargs)
    finally:
        os.chdir(cwd)
    for ext in built:
        c_files = [s for s in ext.sources if s.endswith((".c", ".cpp"))]
        pyx = [s for s in ext.sources if s.endswith(".pyx")]
        if len(c_files) != 1:
            raise SystemExit(f"cross_build: expected one generated C file for {ext.name}, got {ext.sources}")
        c = c_files[0] if os.path.isabs(c_files[0]) else os.path.join(repo, c_files[0])
        if not os.path.abspath(c).startswith(out + os.sep):
            raise SystemExit(f"cross_build: {c} was generated outside {out}")
        src = os.path.join(repo, pyx[0]) if pyx else ""
        if not src:
            base = os.path.relpath(c, out)
            src = os.path.join(repo, os.path.splitext(base)[0] + ".pyx")
        args = list(ext.extra_compile_args or [])
        args += [f"-D{k}" if v is None else f"-D{k}={v}" for k, v in (ext.define_macros or [])]
        args += [f"-I{d if os.path.isabs(d) else os.path.join(repo, d)}" for d in (ext.include_dirs or [])
                 if "numpy" not in d]   # target numpy headers are added by the caller
        print("\t".join([ext.name, c, src, " ".join(shlex.quote(x) for x in args)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
