"""Old path of :mod:`specverify.verify`, kept so that existing imports work (the same module object)."""
import sys

from . import verify

sys.modules[__name__] = verify
