"""Old name of :mod:`experiments.end_to_end.choose_k`: ``python -m experiments.choose_k`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.end_to_end.choose_k")
