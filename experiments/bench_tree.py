"""Old name of :mod:`experiments.benchmarks.tree`: ``python -m experiments.bench_tree`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.benchmarks.tree")
