"""Old path of :mod:`specverify.verify.batch`, kept so that existing imports work (the same module object)."""
import sys

from .verify import batch

sys.modules[__name__] = batch
