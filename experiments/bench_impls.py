"""Old name of :mod:`experiments.benchmarks.impls`: ``python -m experiments.bench_impls`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.benchmarks.impls")
