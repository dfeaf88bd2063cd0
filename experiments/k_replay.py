"""Old name of :mod:`experiments.end_to_end.k_replay`: ``python -m experiments.k_replay`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.end_to_end.k_replay")
