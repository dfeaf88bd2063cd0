"""Old name of :mod:`experiments.law.sweep`: ``python -m experiments.sweep`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.law.sweep")
