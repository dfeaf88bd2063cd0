"""Old name of :mod:`experiments.benchmarks.ops`: ``python -m experiments.bench`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.benchmarks.ops")
