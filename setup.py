"""Build specverify's Cython kernels.

Flags: -O3 and -ffp-contract=off (every product rounded on its own, so results agree bit for bit
across x86-64 and aarch64; no -ffast-math, whose reassociation would make the summation order
compiler-dependent and blind the kernels to NaN).  CPU tuning: -march=native on x86-64,
-mcpu=native on aarch64.  SPECVERIFY_CPU overrides it (``cortex-a72`` -> -mcpu=cortex-a72 on
aarch64, ``x86-64-v3`` -> -march=x86-64-v3 on x86-64; ``none`` drops the flag), because cross
builds and emulators need an explicit target.  SPECVERIFY_BOUNDSCHECK=1 turns Cython's bounds and
wraparound checks back on for debugging.
"""
import os
import platform

from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup


def cpu_flags(machine=None):
    machine = (machine or platform.machine()).lower()
    cpu = os.environ.get("SPECVERIFY_CPU", "native").strip()
    if cpu.lower() == "none":
        return []
    if machine in ("aarch64", "arm64"):
        return [f"-mcpu={cpu}"]
    if machine in ("x86_64", "amd64", "i686", "i386"):
        return [f"-march={cpu}"]
    return []


COMPILE_ARGS = ["-O3", "-ffp-contract=off", "-fno-strict-aliasing"] + cpu_flags()
DEBUG_CHECKS = os.environ.get("SPECVERIFY_BOUNDSCHECK", "0") == "1"
DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG_CHECKS,
    "wraparound": DEBUG_CHECKS,
    "initializedcheck": DEBUG_CHECKS,
    "cdivision": True,
    "embedsignature": True,
}

# Every specverify/*.pyx is an extension (today one, _kernels.pyx, which includes one .pxi per
# op family; see its docstring for why they share a module).
HERE = os.path.dirname(os.path.abspath(__file__))
extensions = [
    Extension(f"specverify.{name[:-len('.pyx')]}", [f"specverify/{name}"],
              extra_compile_args=COMPILE_ARGS)
    for name in sorted(os.listdir(os.path.join(HERE, "specverify")))
    if name.endswith(".pyx")
]

setup(
    name="specverify",
    version="0.1.0",
    description="Speculative-decoding verification ops for CPUs (greedy and rejection sampling)",
    license="Apache-2.0",
    packages=find_packages(include=["specverify", "specverify.*"]),
    python_requires=">=3.9",
    install_requires=["numpy>=1.22"],
    ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES),
    zip_safe=False,
)
