"""The draft/verify loop above the ops.

- :mod:`~specverify.decoding.decoder`: :class:`SpeculativeDecoder` (chain, block and tree rounds,
  greedy or sampling, any draft and target given as callbacks);
- :mod:`~specverify.decoding.adaptive`: draft-length policies (:class:`FixedK`, :class:`AdaptiveK`);
- :mod:`~specverify.decoding.planner`: :class:`Planner`, each round's choice among candidate drafts
  (and lengths, trees, or nothing) by expected tokens per unit of measured cost;
- :mod:`~specverify.decoding.tree_drafts`: draft trees (:class:`DraftTree`, tries, tree masks).
"""

from .adaptive import AdaptiveK, FixedK, RoundRecord
from .decoder import SpeculativeDecoder
from .planner import Candidate, Planner
from .tree_drafts import DraftTree

__all__ = ["SpeculativeDecoder", "FixedK", "AdaptiveK", "RoundRecord", "DraftTree", "Planner", "Candidate"]
