"""Old name of :mod:`experiments.law.block`: ``python -m experiments.block`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.law.block")
