"""Old path of :mod:`specverify.decoding.adaptive`, kept so that existing imports work (the same module object)."""
import sys

from .decoding import adaptive

sys.modules[__name__] = adaptive
