"""Old path of :mod:`specverify.reference.warp`, kept so that existing imports work (the same module object)."""
import sys

from .reference import warp

sys.modules[__name__] = warp
