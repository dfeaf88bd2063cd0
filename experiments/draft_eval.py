"""Short name of :mod:`experiments.end_to_end.draft_eval`: ``python -m experiments.draft_eval`` runs it."""
from ._alias import alias

alias(__name__, "experiments.end_to_end.draft_eval")
