"""Prove that every hot loop of a Cython kernel was vectorized with NEON.

Used by tools/aarch64_check.sh; runs on the build host (any Python 3.8+, stdlib only).

Inputs
  * the Cython sources (``--pyx``, repeated: the .pyx and the .pxd/.pxi files it includes or
    cimports inline code from): hot regions are marked by a ``# hot loop`` comment on the line
    before a ``def``/``cdef``/``cpdef`` function (region = the whole function) or
    before a ``for``/``while`` statement (region = that loop);
  * the C file Cython generated from the .pyx (WITHOUT --line-directives), whose
    ``/* "path/to/file.pyx":N`` comments map C lines back to source lines;
  * the file written by ``gcc -fopt-info-vec-optimized=FILE``;
  * ``objdump -d -l`` of the shared object built with ``-g`` from that C file.

Checks, per hot region
  1. gcc reports at least one loop in the region "vectorized using 16 byte vectors";
  2. the disassembly contains at least one SIMD arithmetic instruction on a
     ``vN.<arrangement>`` register whose debug line maps into the region.

Exit status 0 when every region passes both checks, 1 otherwise.  A JSON
summary is written with --json.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass, field

HOT_MARK = re.compile(r"^\s*#\s*hot loop\b[\s:,.-]*(.*?)\s*$", re.IGNORECASE)
FUNC_RE = re.compile(r"^(\s*)(?:cpdef|cdef|def)\b[^=]*?\b(\w+)\s*\(")
LOOP_RE = re.compile(r"^(\s*)(for|while)\b")
MARKER_RE = re.compile(r'^\s*/\* "([^"]+)":(\d+)\s*$')
OPTINFO_RE = re.compile(r"^(.*?):(\d+):(\d+): optimized: (.*)$")
VEC16_RE = re.compile(r"loop vectorized using 16 byte vectors")
VEC_ANY_RE = re.compile(r"(?:loop|basic block part) vectorized using (\d+) byte vectors")
# objdump -d -l output
OBJ_FUNC_RE = re.compile(r"^[0-9a-f]+ <([^>]+)>:\s*$")
OBJ_LINE_RE = re.compile(r"^(/?[^\s:]+\.c):(\d+)(?: \(discriminator \d+\))?\s*$")
OBJ_INSN_RE = re.compile(r"^\s*[0-9a-f]+:\s+(?:[0-9a-f]{8}\s+)?([a-z][a-z0-9.]*)\s*(.*)$")
VREG_RE = re.compile(r"\bv\d+\.(\d*)(b|h|s|d)\b")
# Vector instructions that only move data; they do not prove the loop computes in SIMD.
NON_ARITH = re.compile(
    r"^(ld[1-4]r?|ld[np]?[rp]?|ldr|ldur|ldp|ldnp|st[1-4]|str|stur|stp|stnp|mov|movi|mvni|dup|ins|umov|smov|"
    r"ext|zip[12]|uzp[12]|trn[12]|tbl|tbx|rev\d*|fmov)$"
)


@dataclass
class Region:
    name: str            # text after "# hot loop:", else the function name / "function@line"
    function: str        # enclosing function name
    first: int           # first .pyx line (the def/for/while line), 1-based
    last: int            # last .pyx line of the block
    after: int = 0       # first statement after a loop: gcc may file the SLP report of a loop
                         # body whose accumulator arrays became registers there
    vec_lines: dict = field(default_factory=dict)   # pyx line -> set of vector byte sizes
    simd_insns: dict = field(default_factory=dict)  # "mnemonic .arr" -> count
    simd_symbols: set = field(default_factory=set)
    source: str = ""     # the source file's name

    def contains(self, line: int) -> bool:
        return self.first <= line <= self.last

    @property
    def vectorized16(self) -> bool:
        return any(16 in sizes for sizes in self.vec_lines.values())

    @property
    def has_simd(self) -> bool:
        return bool(self.simd_insns)


def _indent(s: str) -> int:
    return len(s) - len(s.lstrip(" \t"))


def _block_end(lines: list[str], start: int) -> int:
    """Index (0-based) of the last line of the indented block whose header is lines[start]."""
    base = _indent(lines[start])
    # a header may span several lines (open parenthesis); find the line ending with ':'
    i = start
    depth = 0
    while i < len(lines):
        code = lines[i].split("#", 1)[0]
        depth += code.count("(") + code.count("[") - code.count(")") - code.count("]")
        if depth <= 0 and code.rstrip().endswith(":"):
            break
        i += 1
    last = i
    for j in range(i + 1, len(lines)):
        s = lines[j]
        if not s.strip() or s.lstrip().startswith("#"):
            continue
        if _indent(s) <= base:
            break
        last = j
    return last


def find_hot_regions(pyx_text: str) -> list[Region]:
    lines = pyx_text.splitlines()
    regions: list[Region] = []
    for i, s in enumerate(lines):
        mark = HOT_MARK.match(s)
        if not mark:
            continue
        label = mark.group(1)
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or lines[j].lstrip().startswith(("#", "@"))):
            j += 1
        if j >= len(lines):
            raise ValueError(f"'# hot loop' on line {i + 1} is not followed by code")
        head = lines[j]
        last = _block_end(lines, j)
        m = FUNC_RE.match(head)
        if m:
            regions.append(Region(label or m.group(2), m.group(2), j + 1, last + 1))
            continue
        m = LOOP_RE.match(head)
        if not m:
            raise ValueError(
                f"'# hot loop' on line {i + 1} must precede a def/cdef/cpdef or a for/while "
                f"statement, found: {head.strip()!r}")
        func = "<module>"
        for k in range(j - 1, -1, -1):
            f = FUNC_RE.match(lines[k])
            if f and _indent(lines[k]) < _indent(head):
                func = f.group(2)
                break
        after = next((k + 1 for k in range(last + 1, len(lines))
                      if lines[k].strip() and not lines[k].lstrip().startswith("#")), 0)
        regions.append(Region(label or f"{func}@{j + 1}", func, j + 1, last + 1, after=after))
    return regions


def c_to_pyx_map(c_text: str, pyx_name: str) -> dict[int, int]:
    """Map each C line (1-based) inside Cython-generated functions to its .pyx line.

    The current position is the last ``/* "file":N`` marker; it is forgotten at every
    column-0 ``}`` (end of a C function) so that Cython's utility code, which has no
    markers, never inherits a .pyx line.
    """
    out: dict[int, int] = {}
    cur = None
    for n, s in enumerate(c_text.splitlines(), 1):
        m = MARKER_RE.match(s)
        if m:
            f, ln = m.group(1), int(m.group(2))
            cur = ln if (f == pyx_name or f.endswith("/" + pyx_name) or pyx_name.endswith("/" + f)
                         or os.path.basename(f) == os.path.basename(pyx_name)) else None
            continue
        if s.startswith("}"):
            cur = None
            continue
        if cur is not None:
            out[n] = cur
    return out


def apply_optinfo(regions: list[Region], optinfo_text: str, cmap: dict[int, int], c_name: str) -> list[str]:
    """Attach vectorization reports to regions; returns the unattributed loop reports in the .pyx."""
    stray = []
    cbase = os.path.basename(c_name)
    for s in optinfo_text.splitlines():
        m = OPTINFO_RE.match(s.strip())
        if not m or os.path.basename(m.group(1)) != cbase:
            continue
        v = VEC_ANY_RE.search(m.group(4))
        if not v:
            continue
        pyx_line = cmap.get(int(m.group(2)))
        if pyx_line is None:
            continue
        hit = False
        for r in regions:
            slp_after = pyx_line == r.after and "basic block part vectorized" in m.group(4)
            if r.contains(pyx_line) or slp_after:
                r.vec_lines.setdefault(pyx_line, set()).add(int(v.group(1)))
                hit = True
        if not hit:
            stray.append(f"pyx:{pyx_line} {m.group(4)}")
    return stray


def apply_objdump(regions: list[Region], objdump_text: str, cmap: dict[int, int], c_name: str) -> None:
    cbase = os.path.basename(c_name)
    sym = None
    pyx_line = None
    for s in objdump_text.splitlines():
        m = OBJ_FUNC_RE.match(s)
        if m:
            sym, pyx_line = m.group(1), None
            continue
        m = OBJ_LINE_RE.match(s)
        if m:
            pyx_line = cmap.get(int(m.group(2))) if os.path.basename(m.group(1)) == cbase else None
            continue
        if pyx_line is None:
            continue
        m = OBJ_INSN_RE.match(s)
        if not m:
            continue
        mnem, ops = m.group(1), m.group(2)
        regs = VREG_RE.findall(ops)
        if not regs or NON_ARITH.match(mnem):
            continue
        arr = regs[0][0] + regs[0][1]
        for r in regions:
            if r.contains(pyx_line):
                key = f"{mnem} v.{arr}"
                r.simd_insns[key] = r.simd_insns.get(key, 0) + 1
                r.simd_symbols.add(sym)


def analyse_source(src_path: str, c_text: str, optinfo_text: str, objdump_text: str, c_path: str):
    """Regions of one Cython source file, with the reports whose C lines map into it."""
    with open(src_path) as f:
        regions = find_hot_regions(f.read())
    # Cython writes the path relative to the package root, e.g. "specverify/kernels/_kernels.pyx"
    names = {m.group(1) for m in map(MARKER_RE.match, c_text.splitlines()) if m}
    base = os.path.basename(src_path)
    cands = [n for n in names if os.path.basename(n) == base]
    cmap = c_to_pyx_map(c_text, cands[0] if cands else base)
    stray = apply_optinfo(regions, optinfo_text, cmap, c_path)
    apply_objdump(regions, objdump_text, cmap, c_path)
    return regions, stray


def analyse(src_paths, c_path: str, optinfo_path: str, objdump_path: str):
    """Regions of every source (a path or a list of paths) and the unattributed reports."""
    if isinstance(src_paths, str):
        src_paths = [src_paths]
    with open(c_path) as f:
        c_text = f.read()
    with open(optinfo_path) as f:
        optinfo_text = f.read()
    with open(objdump_path) as f:
        objdump_text = f.read()
    regions, stray = [], []
    for src in src_paths:
        base = os.path.basename(src)
        found, unattributed = analyse_source(src, c_text, optinfo_text, objdump_text, c_path)
        for region in found:
            region.source = base
        regions += found
        stray += [f"{base}:{x}" for x in unattributed]
    return regions, stray


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pyx", required=True, action="append",
                    help="a Cython source with '# hot loop' markers (repeat for .pxd/.pxi files)")
    ap.add_argument("--c", required=True, help="C file generated by cython (no --line-directives)")
    ap.add_argument("--optinfo", required=True, help="output of -fopt-info-vec-optimized=FILE")
    ap.add_argument("--objdump", required=True, help="output of objdump -d -l on the -g build")
    ap.add_argument("--label", default="", help="e.g. the CPU name, used in messages")
    ap.add_argument("--json", help="write a JSON summary here")
    a = ap.parse_args(argv)

    try:
        regions, stray = analyse(a.pyx, a.c, a.optinfo, a.objdump)
    except ValueError as e:
        print(f"neon_report: {e}", file=sys.stderr)
        return 1
    tag = f"[{a.label}] " if a.label else ""
    ok = True
    if not regions:
        print(f"{tag}FAIL: no '# hot loop' markers found in {', '.join(a.pyx)}")
        ok = False
    summary = []
    for r in regions:
        lines16 = sorted(ln for ln, sz in r.vec_lines.items() if 16 in sz)
        other = sorted(ln for ln, sz in r.vec_lines.items() if 16 not in sz)
        insns = sorted(r.simd_insns, key=lambda k: -r.simd_insns[k])
        good = r.vectorized16 and r.has_simd
        ok &= good
        status = "ok  " if good else "FAIL"
        vec_txt = (f"16-byte loops at pyx line(s) {','.join(map(str, lines16))}" if lines16
                   else "NOT reported vectorized with 16-byte vectors")
        if other:
            vec_txt += f" (narrower only at {','.join(map(str, other))})"
        simd_txt = (f"{sum(r.simd_insns.values())} SIMD ops, e.g. {', '.join(insns[:6])}" if insns
                    else "NO SIMD arithmetic in objdump")
        print(f"{tag}{status} {r.name} ({r.source} {r.first}-{r.last}): {vec_txt}; {simd_txt}")
        summary.append({
            "region": r.name, "function": r.function, "source": r.source,
            "pyx_lines": [r.first, r.last],
            "vectorized_16byte_lines": lines16, "other_vectorized_lines": other,
            "simd_instructions": r.simd_insns, "symbols": sorted(r.simd_symbols), "ok": good,
        })
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"label": a.label, "ok": ok, "regions": summary, "unmarked_vectorized": stray}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
