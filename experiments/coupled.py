"""Old name of :mod:`experiments.end_to_end.coupled`: ``python -m experiments.coupled`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.end_to_end.coupled")
