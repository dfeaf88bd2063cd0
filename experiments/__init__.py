"""Experiments for specverify: the analytic law of rejection sampling, observed; the ops timed
against the memory-read floor; real models end to end.  A folder per job:

- :mod:`experiments.convergence` -- the main job (``python -m experiments.convergence``): the
  accepted-length histogram converging on the law, ``media/hero.gif``.
- :mod:`experiments.law` -- synthetic targets and drafts (``synthetic``), rounds of verification
  (``simulate``), ``sweep`` (the convergence check over a grid) and ``block`` (block verification
  against token-wise).
- :mod:`experiments.benchmarks` -- ``ops`` (``python -m experiments.benchmarks.ops``: every op against the
  floor), ``batch``, ``tree``, ``linear``, the comparison implementations ``impls`` and the shared
  ``harness`` (machine description, timing loop, settings, tables).
- :mod:`experiments.end_to_end` -- SmolLM2 through transformers: ``real_model`` (its pieces
  ``real_model_configs``, ``real_model_timing``, ``real_model_tables``, ``real_model_figures``),
  ``train_draft`` (``draft_prompts``, ``draft_data``, ``draft_training``), ``draft_eval``,
  ``choose_k``, ``k_replay``, ``lookup_bound``, ``coupled``, ``speedup``; the prompt sets they
  decode in ``prompt_sets``.

Shared by all: :mod:`experiments.paths` (all paths, cache keys, run metadata),
:mod:`experiments.stats` (the tests), :mod:`experiments.plots` (figure code; reads results, never
computes them) and :mod:`experiments.figures` (redraws every README figure from cached results).

Each module has one name, its file's path: ``python -m experiments.law.sweep``,
``python -m experiments.benchmarks.ops``, ``python -m experiments.end_to_end.real_model``, ...
"""
