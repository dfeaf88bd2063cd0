"""Old name of :mod:`experiments.end_to_end.lookup_bound`: ``python -m experiments.lookup_bound`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.end_to_end.lookup_bound")
