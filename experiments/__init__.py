"""Experiments for specverify: the analytic law of rejection sampling, observed; the ops timed
against the memory-read floor; real models end to end.  A folder per job:

- :mod:`experiments.law` -- synthetic targets and drafts (``synthetic``), rounds of verification
  (``simulate``), the main job ``convergence`` (the accepted-length histogram converging on the
  law, ``media/hero.gif``), ``sweep`` (the same check over a grid) and ``block`` (block
  verification against token-wise).
- :mod:`experiments.benchmarks` -- ``ops`` (``python -m experiments.bench``: every op against the
  floor), ``batch``, ``tree``, ``linear``, the comparison implementations ``impls`` and the shared
  ``harness`` (machine description, timing loop, settings, tables).
- :mod:`experiments.end_to_end` -- SmolLM2 through transformers: ``real_model``, ``choose_k``,
  ``k_replay``, ``lookup_bound``, ``coupled``, ``speedup``.

Shared by all: :mod:`experiments.paths` (all paths, cache keys, run metadata),
:mod:`experiments.stats` (the tests), :mod:`experiments.plots` (figure code; reads results, never
computes them) and :mod:`experiments.figures` (redraws every README figure from cached results).

The flat names of before (``python -m experiments.convergence``, ``experiments.bench_batch``, ...)
are aliases of the new modules (``_alias.py``): the same commands, options and objects.
"""
