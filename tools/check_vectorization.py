"""Check that every hot loop of the Cython kernels is vectorized by the C compiler.

    python -m tools.check_vectorization                    # flags as setup.py builds on this machine
    python -m tools.check_vectorization --cpu x86-64-v3    # AVX2 target (SPECVERIFY_CPU semantics)
    python -m tools.check_vectorization --cc clang --opt-info -Rpass=loop-vectorize   # other compilers

A hot loop is the first ``for``/``while`` statement after a line holding a ``# hot loop`` comment in
``specverify/*.pyx`` or in the ``.pxd``/``.pxi`` files beside them (inline primitives, included op
families); it spans that statement and its indented body. The tool

1. reads the extensions, their compile flags and Cython directives from ``setup.py`` (executed with
   ``setuptools.setup`` and ``Cython.Build.cythonize`` stubbed out, so nothing is built or written
   in the tree; ``SPECVERIFY_CPU`` is honoured, or set with ``--cpu``);
2. cythonizes each ``.pyx`` into a temporary directory with those directives;
3. compiles the C like setuptools does (``CC CFLAGS CCSHARED -I<python> <extra_compile_args>``, from
   ``sysconfig`` unless ``--cc``/``--base-flags`` say otherwise) plus ``-fopt-info-vec-optimized``
   and ``-DSV_PORTABLE_LOOPS``, which compiles out the hand-written vector paths (C vector types,
   SIMD by construction, e.g. the AVX-512 block sum) so that the portable loops they replace on
   some CPUs are the ones checked;
4. maps each reported C line back to its ``.pyx`` line through Cython's ``/* "file.pyx":LINE``
   source comments, and marks a hot loop vectorized when some report falls inside it: a loop
   vectorization ("loop vectorized using N byte vectors") or, unless ``--loops-only``, straight-line
   SLP vectorization of its (fully unrolled) body ("basic block part vectorized"). gcc sometimes
   files the SLP report of a loop whose accumulator arrays it turned into registers under the
   first statement after the loop, so an SLP report on that one line counts too.

It prints one line per hot loop with the kind of vectorization and the vector widths, and exits 1
listing the hot loops that were not vectorized (2 if the compiler or Cython fails, or if no hot
loop is marked).
"""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
HOT_MARK = re.compile(r"#\s*hot loop\b", re.IGNORECASE)
PORTABLE_LOOPS = ["-DSV_PORTABLE_LOOPS"]  # the portable loops, not the hand-written vector paths
LOOP_START = re.compile(r"^\s*(for|while)\b")
CYTHON_SOURCE = re.compile(r'/\*\s*"([^"]+\.(?:pyx|pxd|pxi))":(\d+)')
# gcc: "file.c:123:45: optimized: loop vectorized using 64 byte vectors"
REPORT = re.compile(r"^(?P<file>[^:\s]+\.c):(?P<line>\d+):(?:\d+:)?\s*(?P<kind>optimized|missed|remark):\s*(?P<msg>.*)$")
WIDTH = re.compile(r"using (\d+) byte vectors")             # gcc
CLANG_WIDTH = re.compile(r"vectorization width: (\d+)")      # clang -Rpass=loop-vectorize (elements)
VECTORIZED = re.compile(r"(loop vectorized|basic block part vectorized|vectorized loop|"
                        r"SLP vectorized|vectorized \w+ loop)", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# What setup.py builds
# ---------------------------------------------------------------------------------------------

@dataclass
class Build:
    sources: list            # .pyx paths (absolute)
    extra_compile_args: list
    include_dirs: list
    directives: dict


def builds_from_setup(setup_py, cpu=None):
    """Extensions of setup.py, read by running it with setup() and cythonize() stubbed."""
    captured = {}

    def fake_cythonize(module_list, compiler_directives=None, **kwargs):
        captured.setdefault("extensions", []).extend(
            module_list if isinstance(module_list, (list, tuple)) else [module_list])
        captured["directives"] = dict(compiler_directives or {})
        return list(captured["extensions"])

    env = dict(os.environ)
    if cpu is not None:
        env["SPECVERIFY_CPU"] = cpu
    cwd = os.getcwd()
    try:
        os.chdir(setup_py.parent)
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch("Cython.Build.cythonize", fake_cythonize), \
                mock.patch("setuptools.setup", lambda **kw: captured.setdefault("setup", kw)):
            runpy.run_path(str(setup_py), run_name="__main__")
    finally:
        os.chdir(cwd)
    builds = []
    for ext in captured.get("extensions", []):
        pyx = [str((setup_py.parent / s).resolve()) for s in ext.sources if s.endswith(".pyx")]
        if pyx:
            builds.append(Build(pyx, list(ext.extra_compile_args or []),
                                [str((setup_py.parent / d).resolve()) for d in ext.include_dirs or []],
                                captured.get("directives", {})))
    return builds


def default_compiler_command():
    """CC CFLAGS CCSHARED as distutils/setuptools' customize_compiler builds them."""
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cflags = sysconfig.get_config_var("CFLAGS") or ""
    if os.environ.get("CFLAGS"):
        cflags += " " + os.environ["CFLAGS"]
    return shlex.split(cc), shlex.split(cflags) + shlex.split(sysconfig.get_config_var("CCSHARED") or "")


# ---------------------------------------------------------------------------------------------
# Hot loops in the .pyx and the C -> .pyx line map
# ---------------------------------------------------------------------------------------------

@dataclass
class HotLoop:
    pyx: str          # path as given to Cython (absolute)
    label: str        # text after "# hot loop"
    start: int        # 1-based line of the for/while statement
    stop: int         # last line of its body
    after: int = 0    # first statement after the loop (where gcc may file the body's SLP report)
    reports: list = field(default_factory=list)
    missed: list = field(default_factory=list)

    def kinds(self):
        return sorted({"loop" if "loop vectorized" in m or "vectorized loop" in m else "SLP"
                       for m in self.reports if VECTORIZED.search(m)})

    def widths(self):
        """Vector widths reported: 'N byte' (gcc) or 'N elements' (clang)."""
        sizes = sorted({int(w) for m in self.reports for w in WIDTH.findall(m)}, reverse=True)
        elems = sorted({int(w) for m in self.reports for w in CLANG_WIDTH.findall(m)}, reverse=True)
        return [f"{w} byte" for w in sizes] + [f"{w} element" for w in elems]


def find_hot_loops(pyx):
    lines = Path(pyx).read_text().splitlines()
    loops = []
    for i, text in enumerate(lines):
        mark = HOT_MARK.search(text)
        if not mark:
            continue
        label = text[mark.end():].strip(" :-") or f"line {i + 1}"
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or lines[j].strip().startswith("#")):
            j += 1
        if j == len(lines) or not LOOP_START.match(lines[j]):
            raise ValueError(f"{pyx}:{i + 1}: '# hot loop' is not followed by a for/while loop")
        indent = len(lines[j]) - len(lines[j].lstrip())
        stop = j
        for m in range(j + 1, len(lines)):
            if not lines[m].strip():
                continue
            if len(lines[m]) - len(lines[m].lstrip()) <= indent:
                break
            stop = m
        after = next((m + 1 for m in range(stop + 1, len(lines))
                      if lines[m].strip() and not lines[m].strip().startswith("#")), 0)
        loops.append(HotLoop(str(pyx), label, j + 1, stop + 1, after))
    return loops


def c_to_pyx_lines(c_file):
    """{C line: (pyx name as written by Cython, pyx line)} from Cython's source comments."""
    mapping, current = {}, None
    for n, text in enumerate(Path(c_file).read_text().splitlines(), start=1):
        m = CYTHON_SOURCE.search(text)
        if m:
            current = (m.group(1), int(m.group(2)))
        if current is not None:
            mapping[n] = current
    return mapping


# ---------------------------------------------------------------------------------------------
# Run
# ---------------------------------------------------------------------------------------------

def cythonize_to(pyx, out_c, directives, include_dirs, root):
    cmd = [sys.executable, "-m", "cython", "-3", "-o", str(out_c)]
    for key, value in directives.items():
        if key == "language_level":
            continue
        cmd += ["-X", f"{key}={value}"]
    for d in include_dirs:
        cmd += ["-I", d]
    cmd.append(os.path.relpath(pyx, root))   # Cython's source comments then name it relative to root
    return subprocess.run(cmd, capture_output=True, text=True, cwd=root)


def compile_report(c_file, cc, base_flags, flags, include_dirs, opt_info):
    includes = [sysconfig.get_paths()["include"]] + list(include_dirs)
    try:
        import numpy
        includes.append(numpy.get_include())
    except ImportError:
        pass
    cmd = cc + base_flags + [f"-I{d}" for d in includes] + flags + opt_info + \
        ["-c", str(c_file), "-o", str(Path(c_file).with_suffix(".o"))]
    return cmd, subprocess.run(cmd, capture_output=True, text=True, cwd=Path(c_file).parent)


def _same_source(name, target, root):
    """Does Cython's source name (relative to the package root it found) denote `target`?"""
    name = os.path.normpath(name)
    return os.path.realpath(Path(root) / name) == target or target.endswith(os.sep + name)


def hot_sources(pyx):
    """The .pyx and the .pxd/.pxi files beside it (inline primitives, included op families)."""
    folder = Path(pyx).parent
    return [str(pyx)] + sorted(str(p) for p in folder.glob("*.pxd")) + \
        sorted(str(p) for p in folder.glob("*.pxi"))


def _reports_in_loops(result, line_map, loops, root):
    """(loop, message) for every compiler report whose C line maps into one of `loops`."""
    for text in (result.stderr + result.stdout).splitlines():
        m = REPORT.match(text.strip())
        if not m:
            continue
        src = line_map.get(int(m.group("line")))
        if src is None:
            continue
        for loop in loops:
            if not _same_source(src[0], os.path.realpath(loop.pyx), root):
                continue
            slp_after = src[1] == loop.after and "basic block part vectorized" in m.group("msg")
            if loop.start <= src[1] <= loop.stop or slp_after:
                yield loop, (f"{m.group('msg')} [pyx line {src[1]}]" if m.group("kind") == "missed"
                             else m.group("msg"))


def check(args, out=print):
    setup_py = Path(args.setup).resolve()
    root = setup_py.parent
    builds = builds_from_setup(setup_py, cpu=args.cpu)
    if not builds:
        out(f"error: no Cython extension found in {setup_py}")
        return 2
    cc, base = default_compiler_command()
    if args.cc:
        cc = shlex.split(args.cc)
    if args.base_flags is not None:
        base = shlex.split(args.base_flags)
    opt_info = shlex.split(args.opt_info)
    all_loops, failed = [], []
    with tempfile.TemporaryDirectory(prefix="check_vec_") as tmp:
        for build in builds:
            flags = shlex.split(args.flags) if args.flags is not None else build.extra_compile_args
            flags = flags + PORTABLE_LOOPS + shlex.split(args.extra_flags or "")
            for pyx in build.sources:
                loops = [loop for source in hot_sources(pyx) for loop in find_hot_loops(source)]
                c_file = Path(tmp) / (Path(pyx).stem + ".c")
                res = cythonize_to(pyx, c_file, build.directives, build.include_dirs, root)
                if res.returncode != 0:
                    out(f"error: cython failed on {pyx}:\n{res.stderr}")
                    return 2
                cmd, res = compile_report(c_file, cc, base, flags, build.include_dirs, opt_info)
                out(f"{os.path.relpath(pyx, root)}: {' '.join(shlex.quote(c) for c in cmd)}")
                if res.returncode != 0:
                    out(f"error: compiler failed ({res.returncode}):\n{res.stderr[-4000:]}")
                    return 2
                line_map = c_to_pyx_lines(c_file)
                for loop, msg in _reports_in_loops(res, line_map, loops, root):
                    if VECTORIZED.search(msg) and "[pyx line" not in msg:
                        loop.reports.append(msg)
                missing = [l for l in loops if not l.kinds()]
                if missing and args.explain:
                    # Recompile asking why: the compiler's "missed" notes inside each failing loop.
                    _, res = compile_report(c_file, cc, base, flags, build.include_dirs,
                                            shlex.split(args.explain))
                    for loop, msg in _reports_in_loops(res, line_map, missing, root):
                        if msg not in loop.missed:
                            loop.missed.append(msg)
                all_loops += loops
    if not all_loops:
        out("error: no '# hot loop' markers found")
        return 2
    for loop in all_loops:
        kinds = loop.kinds()
        ok = ("loop" in kinds) if args.loops_only else bool(kinds)
        where = f"{os.path.relpath(loop.pyx, root)}:{loop.start}-{loop.stop}"
        if ok:
            widths = ", ".join(loop.widths()) or "? byte"
            out(f"  ok    {where:34s} {loop.label}: vectorized ({'+'.join(kinds)}) "
                f"using {widths} vectors")
        else:
            failed.append(loop)
            out(f"  FAIL  {where:34s} {loop.label}: not vectorized"
                + (f" (only {'+'.join(kinds)})" if kinds else ""))
            for msg in loop.missed[:args.max_notes]:
                out(f"          compiler: {msg}")
    if failed:
        out(f"{len(failed)} of {len(all_loops)} hot loops not vectorized: "
            + "; ".join(f"{os.path.relpath(l.pyx, root)}:{l.start} ({l.label})" for l in failed))
        return 1
    out(f"all {len(all_loops)} hot loops vectorized")
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.check_vectorization",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--setup", default=str(ROOT / "setup.py"), help="setup.py to read extensions from")
    ap.add_argument("--cpu", default=None, help="SPECVERIFY_CPU for setup.py (e.g. x86-64-v3, none)")
    ap.add_argument("--cc", default=None, help="compiler command (default: sysconfig CC, or $CC)")
    ap.add_argument("--base-flags", default=None,
                    help="replace sysconfig's CFLAGS + CCSHARED (default: as setuptools)")
    ap.add_argument("--flags", default=None, help="replace setup.py's extra_compile_args")
    ap.add_argument("--extra-flags", default="", help="append to the compile flags")
    ap.add_argument("--opt-info", default="-fopt-info-vec-optimized",
                    help="flag that makes the compiler report vectorized loops (default: gcc's)")
    ap.add_argument("--explain", default="-fopt-info-vec-missed",
                    help="flag for a second compile that reports why a failing hot loop was not "
                         "vectorized ('' to skip)")
    ap.add_argument("--max-notes", type=int, default=4, help="compiler notes shown per failing loop")
    ap.add_argument("--loops-only", action="store_true",
                    help="require loop vectorization; SLP of an unrolled body does not count")
    return ap.parse_args(argv)


def main(argv=None):
    return check(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
