"""Experiments for specverify: the analytic law of rejection sampling, observed.

Modules (run with ``python -m experiments.<name>``):

- :mod:`experiments.convergence` -- the main job: the accepted-length histogram of repeated
  ``accept`` rounds converging on the analytic law (writes ``media/hero.gif``).
- :mod:`experiments.sweep` -- the same check over a grid of K, V and draft mismatch.
- :mod:`experiments.figures` -- redraws every README figure from cached results.

Support modules: :mod:`experiments.paths` (all paths, cache keys, run metadata),
:mod:`experiments.synthetic` (target/draft families and their knobs), :mod:`experiments.simulate`
(rounds of verification and their statistics), :mod:`experiments.stats` (the tests),
:mod:`experiments.plots` (figure code; reads results, never computes them).
"""
