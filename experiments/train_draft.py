"""Old-style short name of :mod:`experiments.end_to_end.train_draft`: ``python -m experiments.train_draft`` runs it."""
from ._alias import alias

alias(__name__, "experiments.end_to_end.train_draft")
