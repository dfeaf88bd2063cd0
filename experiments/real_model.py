"""Old name of :mod:`experiments.end_to_end.real_model`: ``python -m experiments.real_model`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.end_to_end.real_model")
