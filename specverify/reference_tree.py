"""Old path of :mod:`specverify.reference.tree`, kept so that existing imports work (the same module object)."""
import sys

from .reference import tree

sys.modules[__name__] = tree
