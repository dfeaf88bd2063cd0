"""tools/check_vectorization: the kernels' hot loops vectorize on x86-64, and the check itself
notices a loop that does not (a synthetic extension compiled in a temporary directory)."""

import platform
import shutil
import textwrap

import pytest

pytest.importorskip("Cython")
from tools import check_vectorization as cv  # noqa: E402

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")

SYNTHETIC_PYX = textwrap.dedent("""\
    # cython: language_level=3
    def scale(float[::1] out, const float[::1] x):
        cdef float* o = &out[0]
        cdef const float* p = &x[0]
        cdef Py_ssize_t i, n = x.shape[0]
        o[0] = 0
        # hot loop: elementwise scale
        for i in range(n):
            o[i] = p[i] * p[i]
        return n


    def chase(const long[::1] nxt):
        cdef Py_ssize_t i = 0, n = 0
        # hot loop: pointer chase
        while i >= 0 and n < nxt.shape[0]:
            i = nxt[i]
            n += 1
        return n
    """)

SYNTHETIC_SETUP = textwrap.dedent("""\
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    setup(name="synthetic", ext_modules=cythonize(
        [Extension("pkg.k", ["pkg/k.pyx"], extra_compile_args=["-O3", "-march=native"])],
        compiler_directives={"boundscheck": False, "wraparound": False}))
    """)


def run(argv):
    lines = []
    return cv.check(cv.parse_args(argv), out=lines.append), "\n".join(lines)


def test_find_hot_loops_spans_the_loop_body(tmp_path):
    pyx = tmp_path / "k.pyx"
    pyx.write_text(SYNTHETIC_PYX)
    loops = cv.find_hot_loops(pyx)
    assert [(l.label, l.start, l.stop) for l in loops] == [
        ("elementwise scale", 8, 9), ("pointer chase", 16, 18)]


def test_marker_without_loop_is_an_error(tmp_path):
    pyx = tmp_path / "k.pyx"
    pyx.write_text("# hot loop: nothing\nx = 1\n")
    with pytest.raises(ValueError, match="not followed by a for/while loop"):
        cv.find_hot_loops(pyx)


@needs_gcc
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason="x86-64 check; aarch64 has its own in tools/aarch64*")
def test_kernel_hot_loops_are_vectorized():
    rc, out = run([])
    assert rc == 0, out
    assert "all" in out and "hot loops vectorized" in out
    assert "byte vectors" in out


@needs_gcc
def test_check_reports_unvectorized_hot_loop(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "k.pyx").write_text(SYNTHETIC_PYX)
    (tmp_path / "setup.py").write_text(SYNTHETIC_SETUP)
    rc, out = run(["--setup", str(tmp_path / "setup.py")])
    assert rc == 1, out
    assert "ok    pkg/k.pyx:8-9" in out
    assert "FAIL  pkg/k.pyx:16-18" in out
    assert "1 of 2 hot loops not vectorized: pkg/k.pyx:16 (pointer chase)" in out
