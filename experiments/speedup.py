"""Old name of :mod:`experiments.end_to_end.speedup`: ``python -m experiments.speedup`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.end_to_end.speedup")
