"""Old name of :mod:`experiments.law.synthetic`: ``python -m experiments.synthetic`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.law.synthetic")
