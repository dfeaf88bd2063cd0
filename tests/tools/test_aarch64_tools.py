"""Host-side tests of the aarch64 proof's helpers (tools/neon_report.py, tools/cross_agreement.py).

The proof itself (cross builds, qemu) is tools/aarch64_check.sh; these tests only pin the parsing
and comparison logic it relies on, with synthetic inputs.  Torch-free, a second or two.
"""
import importlib.util
import os
import sys
import textwrap

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_sv_tools_{name}", os.path.join(ROOT, "tools", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


neon = _load("neon_report")
agree = _load("cross_agreement")

PYX = textwrap.dedent("""\
    cdef double f(const float* x, Py_ssize_t n) noexcept nogil:
        cdef double acc[16]
        while start < n:
            # hot loop: row mass
            for s in range(16):
                for l in range(16):
                    acc[l] += x[s * 16 + l]
            tail = 0
        return 0.0


    # hot loop
    cdef int g(int n) noexcept nogil:
        for i in range(n):
            pass
        return 0
    """)

# A C file shaped like Cython's output: source comments, module code, utility code.
C = textwrap.dedent("""\
    static double __pyx_f_f(float const *x) {
      /* "pkg/k.pyx":5
     *         for s in range(16):
     */
      for (s = 0; s < 16; s++) {
        /* "pkg/k.pyx":7
     *                 acc[l] += x[s * 16 + l]
     */
        acc[l] += x[l];
      }
      /* "pkg/k.pyx":8
     */
      tail = 0;
    }
    static int __Pyx_Utility(void) {
      for (i = 0; i < n; i++) u[i] = v[i];
    }
    static int __pyx_f_g(int n) {
      /* "pkg/k.pyx":14
     */
      for (i = 0; i < n; i++) {}
    }
    """)


def test_hot_regions_are_the_loop_or_function_after_the_marker():
    regions = neon.find_hot_regions(PYX)
    assert [(r.name, r.function, r.first, r.last) for r in regions] == [
        ("row mass", "f", 5, 7),
        ("g", "g", 13, 16),
    ]


def test_marker_before_other_code_is_an_error():
    with pytest.raises(ValueError):
        neon.find_hot_regions("# hot loop\nx = 1\n")


def test_c_lines_map_to_pyx_lines_only_inside_cython_functions():
    cmap = neon.c_to_pyx_map(C, "pkg/k.pyx")
    lines = C.splitlines()
    loop = next(i for i, s in enumerate(lines, 1) if "for (s = 0" in s)
    body = next(i for i, s in enumerate(lines, 1) if "acc[l] += x[l]" in s)
    util = next(i for i, s in enumerate(lines, 1) if "u[i] = v[i]" in s)
    assert cmap[loop] == 5 and cmap[body] == 7
    assert util not in cmap  # utility code never inherits a .pyx line


def _run(tmp_path, optinfo, objdump):
    paths = {}
    for name, text in (("k.pyx", PYX), ("k.c", C), ("opt.txt", optinfo), ("od.txt", objdump)):
        paths[name] = tmp_path / name
        paths[name].write_text(text)
    regions, _ = neon.analyse([str(paths["k.pyx"])], str(paths["k.c"]), str(paths["opt.txt"]),
                              str(paths["od.txt"]))
    return {r.name: r for r in regions}


def _c_line(snippet):
    return next(i for i, s in enumerate(C.splitlines(), 1) if snippet in s)


def test_vectorized_16_byte_loops_and_simd_instructions_are_attributed(tmp_path):
    loop, g_loop, util = _c_line("for (s = 0"), _c_line("for (i = 0; i < n; i++) {}"), _c_line("u[i] = v[i]")
    optinfo = "\n".join([
        f"/build/pkg/k.c:{loop}:7: optimized: loop vectorized using 16 byte vectors",
        f"/build/pkg/k.c:{g_loop}:7: optimized: loop vectorized using 8 byte vectors",
        f"/build/pkg/k.c:{util}:7: optimized: loop vectorized using 16 byte vectors",
    ])
    body = _c_line("acc[l] += x[l]")
    objdump = textwrap.dedent(f"""\
        0000000000001000 <__pyx_pw_k_mass>:
        /build/pkg/k.c:{body}
            1000:\tldr\tq0, [x1]
            1004:\tfcvtl\tv1.2d, v0.2s
            1008:\tfadd\tv2.2d, v2.2d, v1.2d
        /build/pkg/k.c:{util}
            100c:\tfadd\tv3.2d, v3.2d, v1.2d
        /build/pkg/k.c:{g_loop} (discriminator 2)
            1010:\tmov\tv4.16b, v5.16b
        """)
    r = _run(tmp_path, optinfo, objdump)
    assert r["row mass"].vectorized16 and r["row mass"].has_simd
    assert r["row mass"].simd_insns == {"fcvtl v.2d": 1, "fadd v.2d": 1}
    assert r["row mass"].simd_symbols == {"__pyx_pw_k_mass"}
    # 8-byte vectors do not count, and a vector move is not arithmetic
    assert not r["g"].vectorized16 and not r["g"].has_simd


def test_cli_fails_when_a_hot_loop_is_not_vectorized(tmp_path, capsys):
    loop = _c_line("for (s = 0")
    for name, text in (("k.pyx", PYX), ("k.c", C), ("od.txt", ""),
                       ("opt.txt", f"k.c:{loop}:1: optimized: loop vectorized using 16 byte vectors\n")):
        (tmp_path / name).write_text(text)
    rc = neon.main(["--pyx", str(tmp_path / "k.pyx"), "--c", str(tmp_path / "k.c"),
                    "--optinfo", str(tmp_path / "opt.txt"), "--objdump", str(tmp_path / "od.txt"),
                    "--label", "cortex-a72"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL row mass" in out and "NO SIMD arithmetic" in out
    assert "FAIL g" in out and "NOT reported vectorized" in out


def test_agreement_cases_are_deterministic_and_valid():
    a, b = agree.generate(12, big=0), agree.generate(12, big=0)
    assert len(a) == 12
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["target"], y["target"])
        np.testing.assert_array_equal(x["uniforms"], y["uniforms"])
        k = len(x["tokens"])
        assert x["target"].shape[0] == k + 1 and x["draft"].shape[0] == k
        assert x["uniforms"].shape == (k + 1,)
        assert ((0 <= x["uniforms"]) & (x["uniforms"] < 1)).all()
        assert ((0 <= x["tokens"]) & (x["tokens"] < x["target"].shape[1])).all()


def test_agreement_compare_requires_exact_equality(tmp_path, capsys):
    res = np.arange(12, dtype=np.int64).reshape(2, 3, 2)
    err = np.zeros((2, 3), dtype="U40")
    np.savez(tmp_path / "x86.npz", results=res, errors=err)
    np.savez(tmp_path / "same.npz", results=res.copy(), errors=err.copy())
    assert agree.compare(tmp_path / "x86.npz", tmp_path / "same.npz") == 0
    assert "agreement: 6/6" in capsys.readouterr().out
    other = res.copy()
    other[1, 2, 1] += 1
    np.savez(tmp_path / "other.npz", results=other, errors=err)
    assert agree.compare(tmp_path / "x86.npz", tmp_path / "other.npz") == 1
    out = capsys.readouterr().out
    assert "agreement: 5/6" in out and "MISMATCH case 1 op accept_none" in out


def test_agreement_compare_rejects_a_vacuous_reference(tmp_path, capsys):
    res = np.full((2, 3, 2), -1, dtype=np.int64)
    err = np.full((2, 3), "AttributeError", dtype="U40")
    np.savez(tmp_path / "x86.npz", results=res, errors=err)
    assert agree.compare(tmp_path / "x86.npz", tmp_path / "x86.npz") == 1
    assert "vacuous" in capsys.readouterr().out
