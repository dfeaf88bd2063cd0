"""Old path of :mod:`specverify.decoding.decoder`, kept so that existing imports work (the same module object)."""
import sys

from .decoding import decoder

sys.modules[__name__] = decoder
