"""The one mechanism behind the old flat module names (``experiments.bench``, ...).

Each old name is a three-line module calling :func:`alias`: run as ``python -m experiments.X`` it
runs the new module as ``__main__`` (same options, same output); imported, it *is* the new module
(``sys.modules`` holds the same object, private names and monkeypatching included).
"""

import importlib
import runpy
import sys


def alias(name: str, target: str) -> None:
    if name == "__main__":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.modules[name] = importlib.import_module(target)
