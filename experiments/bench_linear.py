"""Old name of :mod:`experiments.benchmarks.linear`: ``python -m experiments.bench_linear`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.benchmarks.linear")
