"""Build specverify's Cython kernels.

Flags: -O3 and -ffp-contract=off (every product rounded on its own, so results agree bit for bit
across x86-64 and aarch64; no -ffast-math, whose reassociation would make the summation order
compiler-dependent and blind the kernels to NaN).  CPU tuning: -march=native on x86-64,
-mcpu=native on aarch64.  SPECVERIFY_CPU overrides it (``cortex-a72`` -> -mcpu=cortex-a72 on
aarch64, ``x86-64-v3`` -> -march=x86-64-v3 on x86-64; ``none`` drops the flag), because cross
builds and emulators need an explicit target.

SPECVERIFY_BUILD chooses the kind of build (our flags come after CFLAGS, so this is the switch
that sets the optimization level):

- ``release`` (default): -O3;
- ``debug``: -O0 -g, with every computed index checked (SV_CHECK_INDEX in ``_primitives.pxd``
  aborts on a miss) and Cython's bounds/wraparound checks on;
- ``asan``: -O1 -g with AddressSanitizer and UndefinedBehaviorSanitizer, and the same checks
  (tools/sanitize.sh builds it into a scratch copy; Python needs libasan preloaded).

SPECVERIFY_BOUNDSCHECK=1 adds the index checks to any of them (e.g. a checked -O3 build).
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


BUILDS = {
    "release": (["-O3"], []),
    "debug": (["-O0", "-g"], []),
    "asan": (["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined"],
             ["-fsanitize=address,undefined"]),
}
BUILD = os.environ.get("SPECVERIFY_BUILD", "release").strip().lower() or "release"
if BUILD not in BUILDS:
    raise SystemExit(f"SPECVERIFY_BUILD must be one of {', '.join(BUILDS)}, got {BUILD!r}")
DEBUG_CHECKS = BUILD != "release" or os.environ.get("SPECVERIFY_BOUNDSCHECK", "0") == "1"
OPTIMIZATION, LINK_ARGS = BUILDS[BUILD]
COMPILE_ARGS = (OPTIMIZATION + ["-ffp-contract=off", "-fno-strict-aliasing"] + cpu_flags()
                + (["-DSV_BOUNDSCHECK"] if DEBUG_CHECKS else []))
DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG_CHECKS,
    "wraparound": DEBUG_CHECKS,
    "initializedcheck": DEBUG_CHECKS,
    "cdivision": True,
    "embedsignature": True,
}

# Every specverify/kernels/*.pyx is an extension (today one, _kernels.pyx, which includes one .pxi
# per op family; see its docstring for why they share a module).
HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = os.path.join("specverify", "kernels")
extensions = [
    Extension(f"specverify.kernels.{name[:-len('.pyx')]}", [os.path.join(KERNELS, name)],
              extra_compile_args=COMPILE_ARGS, extra_link_args=LINK_ARGS)
    for name in sorted(os.listdir(os.path.join(HERE, KERNELS)))
    if name.endswith(".pyx")
]

setup(
    name="specverify",
    version="0.3.0",
    description="Speculative-decoding verification ops for CPUs (greedy and rejection sampling)",
    license="Apache-2.0",
    packages=find_packages(include=["specverify", "specverify.*"]),
    package_data={"specverify.integrations": ["data/*.safetensors"]},  # the learned draft's weights
    python_requires=">=3.9",
    install_requires=["numpy>=1.22"],
    ext_modules=cythonize(extensions, compiler_directives=DIRECTIVES),
    zip_safe=False,
)
