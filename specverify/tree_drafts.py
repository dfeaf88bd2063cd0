"""Old path of :mod:`specverify.decoding.tree_drafts`, kept so that existing imports work (the same module object)."""
import sys

from .decoding import tree_drafts

sys.modules[__name__] = tree_drafts
