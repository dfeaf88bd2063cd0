"""Old name of :mod:`experiments.benchmarks.batch`: ``python -m experiments.bench_batch`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.benchmarks.batch")
