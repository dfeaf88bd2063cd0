"""The compiled kernels and the argument validation in front of them.

- ``_kernels.pyx``: the one extension module (``_primitives.pxd``, the numeric contract stated
  once, and one ``_<family>.pxi`` per op family included into it; its docstring says why they
  share one module);
- ``_inputs.py``: validation and conversion of op arguments off the kernels' fast path (every
  message names the argument).

Nothing here is public API: ``specverify.verify`` holds the validated entry points.
"""
