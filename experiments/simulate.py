"""Old name of :mod:`experiments.law.simulate`: ``python -m experiments.simulate`` runs it, imports get it."""
from ._alias import alias

alias(__name__, "experiments.law.simulate")
