"""Old name of :mod:`experiments.law.convergence`: ``python -m experiments.convergence`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.law.convergence")
