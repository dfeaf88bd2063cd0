"""Draft-length policies for :class:`specverify.SpeculativeDecoder`: fixed, adaptive, and a
draft-side confidence stop. Why they keep verification exact.

A policy decides, before each round, how many tokens ``K`` to ask the draft for
(:meth:`AdaptiveK.draft_length`), optionally cuts the proposal short while it is being drafted
(``stop``, a rule of the draft's confidence in each token it drew), and learns from each
finished round (:meth:`AdaptiveK.observe`). The decoder calls nothing else::

    policy.begin()                                      # optional: a new sequence starts
    K = policy.draft_length(limit[, context=c])         # 0 <= K <= limit, before drafting
    stop(i, confidence) -> bool                         # after draft token i: draft another?
    policy.observe(RoundRecord(...))                    # after verification (with, after a K = 0
                                                        # round, whether the draft's first_token was right)

:class:`FixedK` asks for the same K every round. :class:`AdaptiveK` estimates, online and with
a prior, the per-position acceptance rates, the probability that the draft proposes each
position (prompt lookup may find nothing; a stop rule cuts), the draft's cost as a function of
the K asked and the target pass's cost as a function of the tokens it scores (from the
decoder's own timings, or a given cost model), and asks each round for the K that maximizes
the model's speed-up :func:`specverify.law.speedup_curve`. A draft with a ``context(prefix)``
method (prompt lookup: the order of the n-gram match it would copy from, and whether later text
contradicted it) tells a policy whose ``draft_length`` takes a ``context`` keyword, before each
round, what kind of proposal is coming; :class:`AdaptiveK` then estimates the first position's
rates per context, and learns them in hindsight in rounds that draft nothing from a draft with a
``first_token(prefix)`` method. :class:`ConfidenceStop` is
transformers' ``assistant_confidence_threshold``: stop drafting after the first token whose
draft probability is below the threshold (that token is kept and verified).

Why any such rule keeps verification exact
------------------------------------------
Claim. Let a round start from the sequence ``x`` with history ``H`` (everything that happened in
earlier rounds: their tokens, coins and timings). Suppose that whether position ``i`` of the
round is proposed (K, and every stop) is decided from ``(x, H)``, the tokens ``t_{<i}`` proposed
before it and draft-side randomness, but neither from ``t_i`` itself nor from the round's
verification uniforms ``U`` (a draft's ``context`` is a function of ``x``, and a past round's
``hindsight`` a function of its prefix and emitted token, part of ``H``, so a policy that reads
them is covered); and that, given everything that decision saw, a proposed ``t_i`` is
distributed as the row ``q_i`` handed to the verifier. Then every token the decoder emits, given all tokens emitted before it and given
``H``, has the target's conditional law; by the chain rule the decoder's output has the target's
joint law, whatever the policy. (A draft that drew tokens past the stop and had them cut by the
decoder satisfies this: the cut after ``t_j`` depends on ``t_{<=j}`` only, as if the later
tokens had never been drawn.)

Proof (induction on the positions of the round). Write ``p_i = p(. | x, t_{<i})``. At position
``i`` the round has accepted ``t_{<i}`` (so far it emitted exactly them). Either position ``i``
is not proposed: the verifier emits the bonus token drawn from ``p_i`` with a fresh uniform; or
it is, and ``t_i ~ q_i`` whatever the decision saw: the verifier accepts with probability
``min(1, p_i(t_i) / q_i(t_i))`` using ``U_i`` and otherwise emits a draw from
``norm(max(0, p_i - q_i))``; the emitted token then has law
``min(p_i, q_i) + (1 - sum min(p_i, q_i)) norm(max(0, p_i - q_i)) = p_i`` (Leviathan et al.,
Thm 3.5 / Chen et al.). In both branches the token emitted at position ``i`` has law ``p_i``
given ``(x, H, t_{<i})`` and given the branch, because the branch was decided without ``t_i``
and without ``U_i, U_{i+1}, ...``, which are independent of everything the decision saw. If
``t_i`` is accepted the round continues at ``i + 1`` from ``x + t_{<=i}`` with a decision that
again sees only the draft side and the past, so the same argument applies there. Rounds compose
the same way: the next round's K is a function of ``H`` extended by this round, which is the
past of every token it will emit.

What breaks it (both are tested to be rejected by the decoder's joint-law test):

- a stop that sees the current round's verification: cutting the proposal before the first
  draft the target would likely reject (looking at ``p_i(t_i)`` against ``q_i(t_i)``) keeps only
  drafts that "look good" and verifies them as if they had been drawn from ``q_i``: biased;
- removing a drawn token on its own value, even on draft-side grounds: dropping ``t_i`` because
  ``q_i(t_i)`` is small makes the proposal's law ``q_i`` conditioned on being kept, not ``q_i``:
  biased. This is why :class:`ConfidenceStop` keeps the low-confidence token and stops *after* it.

Decisions that look at ``p_i`` as a function of the tokens before ``i`` only are exact by the
same proof (``p_i`` is a function of ``(x, t_{<i})``), but they cost a target pass to compute and
are not what a draft-side policy needs.

Choosing among several drafts is covered too: "whether position ``i`` is proposed" includes
*which* draft proposes it, and ``q_i`` is then that draft's row. So a rule may pick, from
``(x, H)`` and the proposals of deterministic drafts (functions of ``x``), which draft runs, and
cut a stochastic draft's chain before ``t_i`` from its rows ``q_{<=i}`` and ``t_{<i}``; it may not
pick between drafts after a stochastic one's tokens are drawn, on their values (the second
failure below). :mod:`specverify.decoding.planner` is such a rule, with its own tests.

Tree rounds (the draft returns a tree; K is its depth) are exact by the same argument one level
up: the depth is chosen from ``(x, H)`` before drafting, and :func:`specverify.accept_tree` (or
``verify_tree_greedy``) emits the target's law for any tree built from the prefix and draft-side
randomness (deterministic children, or children drawn from the rows handed over, as its rule
requires), whatever decided its shape; the decoder's joint-law test runs trees with an adaptive
depth. Block verification (``SpeculativeDecoder(method="block")``) keeps its exactness under the same
condition (VERIFY_ALGORITHMS.md section F, verified by enumeration there; the decoder's joint-law
test runs it with an adaptive K and the stop). Greedy verification is exact for any proposal at all (it emits the target's argmax), so these
questions only concern speculative sampling.
"""

from __future__ import annotations

import bisect
import inspect
import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import numpy as np
import torch

from ..kernels import _inputs
from ..law.speedup import _cost_values, _speedup_values

__all__ = ["RoundRecord", "ConfidenceStop", "FixedK", "AdaptiveK", "draft_confidences", "confidence_cut",
           "ask_policy", "draft_hindsight"]


@dataclass(frozen=True)
class RoundRecord:
    """What a policy learns from one finished round (times in seconds, ``nan`` if unmeasured)."""

    asked: int  # K asked of the draft (0: a plain target step, no draft call)
    proposed: int  # tokens the draft proposed (after any stop), 0 <= proposed <= asked; a tree: its nodes
    accepted: int  # accepted drafts n, 0 <= accepted <= proposed; a tree: the accepted path's length
    draft_time: float  # the draft call (0 when asked == 0; NaN in a sequence's first round)
    target_time: float  # the target pass scoring proposed + 1 tokens (NaN in a sequence's first round)
    depth: Optional[int] = None  # a tree round: the tree's depth (<= asked; 0 for an empty tree); None: a chain
    context: Optional[int] = None  # the draft's context of the round's prefix (``draft_step.context``); None: none
    # a round that asked K = 0 of a draft with ``first_token(prefix)``: whether the token it would
    # have proposed first is the one emitted; None: not known (the round drafted, or no such draft)
    hindsight: Optional[bool] = None


class ConfidenceStop:
    """Stop drafting after the first token whose draft probability is below ``threshold``.

    transformers' ``assistant_confidence_threshold`` (``ConfidenceCriteria``): the unsupervised
    form of a dynamic speculation lookahead. The low-confidence token itself is kept (removing
    it would bias the verification, see the module docstring).
    """

    def __init__(self, threshold: float):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {threshold!r}")
        self.threshold = float(threshold)

    def __call__(self, i: int, confidence: float) -> bool:
        return confidence < self.threshold


def draft_confidences(probs, tokens) -> np.ndarray:
    """``[m]`` the draft's probability of each of its tokens: ``probs[i, t_i] / sum(probs[i])``.

    probs ``[m, V]`` (torch or NumPy, unnormalized allowed), tokens ``[m]``.
    """
    p = torch.as_tensor(probs).double()  # [m, V]
    t = torch.as_tensor(tokens).reshape(-1).to(torch.int64)  # [m]
    return (p[torch.arange(t.numel()), t] / p.sum(dim=1)).numpy()


def confidence_cut(stop: Callable[[int, float], bool], probs, tokens) -> int:
    """How many of the drafted ``tokens`` a draft-side ``stop`` rule keeps: up to and including
    the first token after which it says stop (all of them if it never does)."""
    for i, conf in enumerate(draft_confidences(probs, tokens)):
        if stop(i, float(conf)):
            return i + 1
    return int(torch.as_tensor(tokens).numel())


def takes_keyword(fn, name: str) -> bool:
    """Whether ``fn`` has a parameter called ``name`` (by name only: a ``**kwargs`` callable may ignore it)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature
        return False
    return name in params


def ask_policy(policy, limit: int, context_of: Callable[[], Optional[int]], takes_context: bool
               ) -> Tuple[int, Optional[int]]:
    """``(K, context)`` for a round that may draft up to ``limit`` tokens, as the decoder asks:
    no draft and no question when ``limit < 1``; a policy whose ``draft_length`` takes a context
    (``takes_context``, from ``takes_keyword``) is asked with ``context_of()`` (the draft's
    context of the prefix, ``None`` for a draft without one), any other without, and the context
    returned is ``None``."""
    if limit < 1:
        return 0, None
    if not takes_context:
        return _asked(policy, policy.draft_length(limit), limit), None
    context = context_of()
    return _asked(policy, policy.draft_length(limit, context=context), limit), context


def _asked(policy, k, limit: int) -> int:
    """The K a policy's ``draft_length`` returned, as an int (any integral type but bool), else a
    TypeError naming the policy."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"policy {policy!r}: draft_length must return an int in [0, {limit}], got {k!r}")
    return int(k)


def draft_hindsight(draft_step, prefix: torch.Tensor, emitted: int) -> Optional[bool]:
    """For a round that drafted nothing, as the decoder records it (:attr:`RoundRecord.hindsight`):
    whether ``draft_step.first_token(prefix)`` is the token the target ``emitted``; ``None`` for a
    draft without ``first_token`` or with nothing to propose."""
    first_token = getattr(draft_step, "first_token", None)
    if not callable(first_token):
        return None
    t = first_token(prefix)
    if t is None:
        return None
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
        raise TypeError(f"draft_step.first_token must return an int or None, got {t!r}")
    return int(t) == int(emitted)


def _stop_rule(confidence_threshold):
    return None if confidence_threshold is None else ConfidenceStop(confidence_threshold)


class FixedK:
    """The same draft length ``k`` every round (optionally cut by a confidence stop)."""

    def __init__(self, k: int, confidence_threshold: Optional[float] = None):
        self.k_max = _inputs.whole_number(k, "k", 1)  # any integral type but bool; floats, inf, NaN refused
        self.stop = _stop_rule(confidence_threshold)

    def begin(self) -> None:
        pass

    def draft_length(self, limit: int) -> int:
        return min(self.k_max, limit)

    def observe(self, record: RoundRecord) -> None:
        pass

    def __repr__(self):
        return f"FixedK({self.k_max})"


class _CostCurve:
    """Seconds as a function of a length x = 1..x_max (room grows when a longer x is observed),
    learned from decayed observations.

    Where x was observed the estimate is the decayed mean there. Between observed lengths it is
    interpolated linearly; beyond the observed range it continues from the nearest observed
    length with a prior slope: ``0`` (extra positions free) or, ``proportional=True``,
    ``mean(y) / mean(x)`` (cost proportional to x). With ``floor_from = f``, an unobserved length
    ``x >= f`` costs at most the cheapest mean observed at any length ``>= f``. Unobserved lengths
    are thus priced optimistically, as the acceptance prior is, and for the same reason: a length
    priced too high is never tried, so its price is never corrected, while one priced too low is
    tried and measured. (A least-squares line through the observations would be the pessimistic
    choice on a CPU, where a target pass scoring one token is a matrix-vector product much cheaper
    than one scoring two: the step from 1 to 2 would be extended to every longer pass. And the
    cost of passes scoring 2..9 tokens is not monotone: the matrix kernels' blocking makes some
    lengths cheaper than shorter ones (SmolLM2-135M, one thread: 4 tokens 87 ms, 3 tokens 113 ms),
    so interpolating between the lengths a policy happens to have seen can overprice the best one
    for ever; the target's curve uses ``floor_from = 2``.) With ``halfway=True`` as well, once
    x = 1 is observed, an unobserved length ``x >= f`` costs halfway from that price down to the
    mean at x = 1, the least any pass can cost: strictly less than every observed length ``>= f``.
    Priced at the cheapest observed length it would tie with it, and a policy whose rounds ask
    the longest length (prompt lookup in a copy) would never time the shorter ones; on a CPU the
    cheapest lengths are often among them (SmolLM2-135M on ``use_fast_linears``: 3 and 4 tokens
    1.22-1.26x a one-token pass, 2 tokens 1.44x, 9 tokens 1.45x).

    ``floor_until = u``: the floor (and ``halfway``) hold for lengths ``f <= x <= u`` only, the
    lengths a policy asks for directly (a chain's tokens + 1) and so times once it tries them. A
    tree's pass scores its node count, which no policy asks for: its lengths spread over many
    values, most of them unobserved at any time, and floored they were all priced at about a
    short pass (a 17-token pass at ~1.1x a one-token one where it costs 2.2x), so trees looked
    cheap for ever. Past ``u`` the estimate is the interpolation between observed lengths (and
    the nearest observed length's price beyond them), where a pass grows with its tokens.
    """

    def __init__(self, decay: float, x_max: int, proportional: bool = False, floor_from: Optional[int] = None,
                 halfway: bool = False, floor_until: Optional[int] = None):
        self.decay, self.proportional, self.floor_from, self.halfway = decay, proportional, floor_from, halfway
        self.floor_until = floor_until
        self.wx = self.wy = 0.0  # decayed sums of x and of y over every observation
        self.w_at = np.zeros(x_max + 1)  # [x_max + 1] decayed weight at each x (index 0 unused)
        self.y_at = np.zeros(x_max + 1)  # [x_max + 1] decayed sum of y at each x

    def add(self, x: int, y: float) -> None:
        d = self.decay
        self.w_at *= d
        self.y_at *= d
        if x >= self.w_at.size:  # a longer pass than planned for (a tree's nodes): make room
            grown = max(x + 1, 2 * self.w_at.size)
            self.w_at = np.concatenate([self.w_at, np.zeros(grown - self.w_at.size)])
            self.y_at = np.concatenate([self.y_at, np.zeros(grown - self.y_at.size)])
        self.w_at[x] += 1.0
        self.y_at[x] += y
        self.wx = d * self.wx + x
        self.wy = d * self.wy + y

    @property
    def seen(self) -> bool:
        return bool(np.any(self.w_at > _NEGLIGIBLE_WEIGHT))

    def mean_at(self, x: int) -> Optional[float]:
        """The decayed mean observed at ``x`` (``None`` where nothing counts as seen)."""
        if x < self.w_at.size and self.w_at[x] > _NEGLIGIBLE_WEIGHT:
            return float(self.y_at[x] / self.w_at[x])
        return None

    def __call__(self, xs) -> np.ndarray:
        return np.asarray(self.values(xs), dtype=np.float64)

    def values(self, xs) -> list:
        """The estimates at the integers ``xs`` as a list of floats. Plain Python on purpose: the
        policy evaluates this every round, right after a target pass has evicted the caches,
        where NumPy's per-call overhead made the policy 2 % of a SmolLM2 round (0.42 ms)."""
        w, y = self.w_at.tolist(), self.y_at.tolist()
        seen = [x for x in range(1, len(w)) if w[x] > _NEGLIGIBLE_WEIGHT]  # observed lengths, increasing
        means = {x: y[x] / w[x] for x in seen}
        slope = self.wy / self.wx if self.proportional else 0.0
        floor = None
        if self.floor_from is not None:
            floor = min((means[x] for x in seen if x >= self.floor_from), default=None)
        out = []
        for x in (int(x) for x in xs):
            if x in means:
                out.append(means[x])
                continue
            j = bisect.bisect(seen, x)  # seen[j - 1] < x < seen[j]
            if j == 0:
                est = max(means[seen[0]] - slope * (seen[0] - x), 0.0)
            elif j == len(seen):
                est = means[seen[-1]] + slope * (x - seen[-1])
            else:  # linear interpolation between the observed lengths around x
                below, above = seen[j - 1], seen[j]
                est = means[below] + (means[above] - means[below]) * (x - below) / (above - below)
            if floor is not None and x >= self.floor_from and (self.floor_until is None or x <= self.floor_until):
                est = min(est, floor)
                if self.halfway and seen[0] == 1:
                    est = 0.5 * (est + means[1])
            out.append(est)
        return out


# An observation whose weight has decayed below this no longer counts as seen.
_NEGLIGIBLE_WEIGHT = 1e-3


class AdaptiveK:
    """Each round's K maximizes the modelled speed-up, from estimates learned over past rounds.

    Estimates (exponentially forgotten, the rates with factor ``decay`` per round, so that a
    change of regime, e.g. a new prompt, is followed, the costs with ``cost_decay``):

    - ``a_i``: P(draft i accepted | proposed, drafts before accepted), i = 1..k_max, a
      Beta-Binomial posterior per position whose prior is ``prior_rate`` for position 1 and the
      pooled rate of positions 2.. (itself pulled to a blend of ``prior_rate`` and position 1's
      posterior, weighted by the prior's weight and position 1's trials) for the others; the prior
      counts as ``prior_strength`` rounds seen when the sequence began, and is forgotten as they
      would be (its weight is ``prior_strength * decay^t`` after t rounds), so that it fades as
      data arrives rather than holding a rarely reached position near the optimistic prior for
      ever (which kept drafting alive longer on prompts where prompt lookup's proposals are
      mostly rejected and plain decoding is faster);
    - ``g_i``: P(draft i proposed | drafts before proposed and at least i asked), the same way
      (prior 1: drafts propose what they are asked unless seen otherwise);
    - ``D(K)`` the draft call's seconds when asked for K and ``T(n)`` the target pass's seconds
      for n scored tokens, learned from the decoder's timings as a *pace* times a *profile*:
      each time is divided by the machine's current pace before it enters the profile's
      per-length means (forgotten with ``cost_decay`` per round; unobserved lengths priced
      optimistically, see :class:`_CostCurve`), and the pace follows the ratio of each target
      pass to the profile's mean at its length (log-averaged with ``pace_decay`` per pass). Only
      the profile's ratios enter the choice, so lengths timed at different moments are compared
      as if timed at one speed. (Why: on a shared machine the speed moves by ±15% from one
      prompt to the next. Priced from raw per-length means, SmolLM2's 9-token pass looked 1.17×
      a one-token pass when it cost 1.62×, its samples from a fast minute and the one-token
      ones from a slow one, and edit_code asked K = 8 where K = 3 was best.) ``pace_decay=1``
      keeps the pace at 1: raw means. ``draft_cost`` and ``target_cost`` given instead: a fixed
      cost model in units of a one-token target pass, as :func:`specverify.law.speedup_curve`
      takes them; no clock is read.

    The chosen K maximizes :func:`specverify.law.speedup_curve` with
    ``survival_i = prod_{j<=i} g_j a_j``, ``proposed_i = prod_{j<=i} g_j`` over ``k_min..k_max``
    (``K = 0``, plain decoding, when no draft length pays).

    Tree drafts (rounds recorded with a ``depth``): K is the depth asked, the positions are
    depths (``a_i``: the accepted path goes on past depth i - 1; ``g_i``: the tree reaches depth
    i; an empty tree proposes nothing), and a round scores ``N + 1`` tokens for its ``N`` nodes,
    however deep it is. So the speed-up of depth K is
    ``(1 + sum_{i<=K} survival_i) / (D(K) + T(1 + E[N | K]))``, with ``E[N | K]`` the
    expected depth the trees reach (from the proposal rates) times their nodes per level
    (:meth:`tree_width`, decayed over the trees seen, kept across sequences like the costs) and
    ``T`` interpolated between the token counts timed: a draft whose trees are wide pays for
    its width at every depth, which the chain pricing (``K + 1`` tokens at most) would miss.

    Draft contexts: when the decoder passes ``draft_length(limit, context=c)`` (the draft's
    ``context(prefix)``, an integer known before drafting), position 1's ``a_1`` and ``g_1`` are
    estimated per context: the context's own counts (decayed like the others) plus
    ``context_weight`` pseudo-rounds at the context's *record* (its counts over all sequences so
    far, kept across :meth:`begin`, forgotten with ``context_memory`` per round), itself shrunk
    to the pooled estimate above with ``context_weight``. Why contexts: prompt lookup's context
    is the order of the n-gram match its proposal copies from and whether later text has
    contradicted that match (``PromptLookupDraft.context``); on SmolLM2's greedy texts the first
    copied token was right after 42 of 43 uncontradicted 3-gram matches and after 8 of 114
    contradicted single tokens. Pooled, those rounds share one rate and every proposal is priced
    alike, so the policy pays a multi-token pass for proposals that are mostly wrong or asks too
    little of the good ones. Why the record: pulled to the pooled rate alone, a context a
    sequence meets late (a 3-gram match first seen after dozens of rejected proposals) started
    near 0, was asked K = 0 and was never observed again (qa's greedy answer, repetitive after
    100 tokens: 0.90 of the best fixed K in the replay, 0.98 before contexts, 1.00 with the
    record); and a context that failed in past sequences fails again in a sequence whose other
    proposals succeed, so its record may also price it *below* the pooled rate (this needs
    contexts that separate good proposals from bad: with match orders alone, a single-token
    record of 8 right in 63 priced fix_spelling's own single-token matches, 2 right in 6, too
    low). Only position 1: later positions ask whether a right start goes on, which the match
    order says little about (estimated per context at every position, the worst replayed prompt
    fell from 0.89 to 0.80 of the best fixed K). The context is a function of the prefix, so
    verification stays exact (module docstring).

    Hindsight: a context priced at K = 0 is never drafted in, so its rate could not be seen to
    rise. A round that asked K = 0 of a draft that can say what it would have proposed first
    (``first_token(prefix)``, deterministic drafts such as prompt lookup) records whether that
    token is the one emitted (:attr:`RoundRecord.hindsight`), and it counts at position 1, in
    the pool and in its context, as a first draft seen and accepted or rejected. (For a point
    mass on ``t`` the token emitted is ``t`` with probability ``p(t)``, its acceptance
    probability, so in sampling mode too the count has the law of a drafted round's.)

    Every ``explore_every``-th round asks
    for one more than the optimum instead, so that positions and lengths beyond it keep being
    observed; after K = 0 it asks for the best K >= 1, so that drafting is tried again where it
    would pay most. Deterministic given the rounds it saw.
    The prior is optimistic on purpose (``prior_rate`` 0.95): a policy that believes drafting does
    not pay asks for K = 0 and never sees the data that would prove it wrong, while an optimistic
    one is corrected within a few rounds. The costs persist across ``generate`` calls (they
    belong to the machine and the models); at the start of each new sequence (:meth:`begin`) the
    acceptance and proposal counts are scaled by ``carry`` (default 0: each sequence starts from
    the prior, since one prompt's acceptance says little about the next's; the prior's weight is
    restored in the same proportion, so a fully carried history is not made optimistic again). A new decoder, or
    :meth:`reset`, starts over.
    """

    def __init__(self, k_max: int = 8, k_min: int = 0, *, prior_rate: float = 0.95, prior_strength: float = 3.0,
                 decay: float = 0.98, carry: float = 0.0, draft_cost=None, target_cost=None,
                 explore_every: int = 10, confidence_threshold: Optional[float] = None,
                 cost_decay: float = 0.98, pace_decay: float = 0.5, context_weight: float = 1.0,
                 context_memory: float = 0.999):
        if int(k_max) != k_max or k_max < 1 or int(k_min) != k_min or not 0 <= k_min <= k_max:
            raise ValueError(f"need integers 0 <= k_min <= k_max, k_max >= 1; got k_min={k_min!r}, k_max={k_max!r}")
        if not 0.0 < prior_rate < 1.0 or not prior_strength > 0.0:
            raise ValueError(f"need 0 < prior_rate < 1 and prior_strength > 0, got {prior_rate!r}, {prior_strength!r}")
        if not 0.0 < decay <= 1.0 or not 0.0 <= carry <= 1.0:
            raise ValueError(f"need decay in (0, 1] and carry in [0, 1], got {decay!r}, {carry!r}")
        if not 0.0 < cost_decay <= 1.0 or not 0.0 <= pace_decay <= 1.0:
            raise ValueError(f"need cost_decay in (0, 1] and pace_decay in [0, 1], "
                             f"got {cost_decay!r}, {pace_decay!r}")
        if not context_weight > 0.0 or not 0.0 < context_memory <= 1.0:
            raise ValueError(f"need context_weight > 0 and context_memory in (0, 1], "
                             f"got {context_weight!r}, {context_memory!r}")
        if (draft_cost is None) != (target_cost is None):
            raise ValueError("give both draft_cost and target_cost (a cost model) or neither (measured)")
        self.k_max, self.k_min = int(k_max), int(k_min)
        self.prior_rate, self.prior_strength, self.decay = float(prior_rate), float(prior_strength), float(decay)
        self.carry, self.cost_decay, self.pace_decay = float(carry), float(cost_decay), float(pace_decay)
        self.context_weight, self.context_memory = float(context_weight), float(context_memory)
        self.draft_cost, self.target_cost = draft_cost, target_cost
        self.explore_every = int(explore_every)
        self.stop = _stop_rule(confidence_threshold)
        self.reset()

    def reset(self) -> None:
        k = self.k_max
        self.tried = np.zeros(k)  # [k] rounds whose verification reached position i (decayed counts)
        self.passed = np.zeros(k)  # [k] ... and accepted it
        self.asked_at = np.zeros(k)  # [k] rounds that asked >= i and proposed everything before i
        self.proposed_at = np.zeros(k)  # [k] ... and proposed i
        # per draft context, position 1's counts as the four above: [tried, passed, asked, proposed],
        # with the round they were last brought up to date (decayed lazily: contexts may be many);
        # in this sequence, and over every sequence (the context's record)
        self.context_counts = {}  # context -> [round, tried, passed, asked, proposed]
        self.context_record = {}  # the same, kept across sequences, forgotten with context_memory
        # the cost profiles, in seconds at pace 1: a draft call vs K asked, a target pass vs tokens
        # scored (the one-token pass is a matrix-vector product, of another kind than the longer
        # ones, so only those set the price of unseen lengths)
        self.draft_fit = _CostCurve(self.cost_decay, k, proportional=True)
        self.target_fit = _CostCurve(self.cost_decay, k + 1, floor_from=2, halfway=True, floor_until=k + 1)
        self.log_pace = 0.0  # log of the machine's pace: a pass takes exp(log_pace) x its profile
        # a tree draft's width: decayed sums of its trees' nodes and depths (proposing rounds only)
        self.tree_nodes = self.tree_depth = 0.0
        self.tree_draft = False  # whether the draft proposes trees (seen from the rounds' records)
        self.rounds = 0
        self.prior_weight = self.prior_strength  # the prior's pseudo-rounds, forgotten like real rounds
        self.last_curve = None  # [k_max + 1] the modelled f(k) behind the last choice
        self._model_costs = None  # the given cost model's (D, T) lists, once evaluated

    # -- estimates ----------------------------------------------------------------------------
    def _posterior(self, hits, trials, prior_mean):
        """Posterior means of per-position rates: position 1 shrunk to ``prior_mean``, positions
        2.. to their pooled rate, itself pulled to an anchor that moves from ``prior_mean`` to
        position 1's posterior as position 1's trials outweigh the prior. Position 1 is kept out
        of the pool because it differs in kind: it asks whether the draft has anything right at
        all (for prompt lookup, whether the n-gram recurs), the later ones whether a right start
        goes on. The anchor is what the later positions have when a failing first draft never
        lets them be observed: pulled to ``prior_mean`` alone they kept it for ever, and with
        long target passes nearly as cheap as short ones (``use_fast_linears``) that optimism
        made long drafts look worth asking for dozens of rounds where plain decoding was faster
        (replayed over all prompt orders of three recorded runs, the anchor raised every
        prompt's worst and median ratio to the best fixed K, or left it unchanged)."""
        hits, trials = hits.tolist(), trials.tolist()  # [k_max] each; plain floats (see _CostCurve.values)
        s = max(self.prior_weight, _NEGLIGIBLE_WEIGHT)
        first = (hits[0] + s * prior_mean) / (trials[0] + s)
        anchor = (s * prior_mean + trials[0] * first) / (s + trials[0])
        later = (sum(hits[1:]) + s * anchor) / (sum(trials[1:]) + s)
        return [(h + s * (prior_mean if i == 0 else later)) / (n + s) for i, (h, n) in enumerate(zip(hits, trials))]

    def rates(self) -> np.ndarray:
        """``[k_max]`` estimated conditional acceptance ``a_i``."""
        return np.array(self._posterior(self.passed, self.tried, self.prior_rate))

    def proposal_rates(self) -> np.ndarray:
        """``[k_max]`` estimated ``g_i`` = P(position i proposed | i-1 proposed, asked >= i)."""
        return np.array(self._posterior(self.proposed_at, self.asked_at, 1.0 - 1e-3))

    def costs(self):
        """``(D [k_max], T [k_max + 1])``: draft cost for K = 1..k_max, target cost for n = 1..k_max+1,
        in units of one single-token target pass (``T[0] = 1``); ``None`` before any timing."""
        costs = self._cost_lists()
        return None if costs is None else (np.array(costs[0]), np.array(costs[1]))

    def _cost_lists(self):
        """``costs()`` as two lists of floats (the given cost model is evaluated once)."""
        if self.target_cost is not None:
            if self._model_costs is None:
                d = _cost_values(self.draft_cost, np.arange(1, self.k_max + 1), "draft_cost")
                t = self._target_costs(np.arange(1, self.k_max + 2))
                self._model_costs = d.tolist(), (t / t[0]).tolist()
            return self._model_costs
        if not (self.target_fit.seen and self.draft_fit.seen):
            return None
        t = [max(v, 1e-12) for v in self.target_fit.values(range(1, self.k_max + 2))]  # [k_max + 1] seconds
        d = [max(v, 0.0) / t[0] for v in self.draft_fit.values(range(1, self.k_max + 1))]  # [k_max]
        return d, [v / t[0] for v in t]

    def _target_costs(self, counts: np.ndarray) -> np.ndarray:
        """A target pass scoring each of ``counts`` tokens: the given ``target_cost``, else the
        seconds fitted from this decoder's timings (kept above 0)."""
        if self.target_cost is not None:
            return _cost_values(self.target_cost, counts, "target_cost")
        return np.maximum(self.target_fit(counts), 1e-12)

    # -- the policy -----------------------------------------------------------------------------
    def begin(self) -> None:
        for arr in self._counts():
            arr *= self.carry
        for counts in self.context_counts.values():
            counts[1:] = [v * self.carry for v in counts[1:]]
        # the prior regains the weight the counts lost: full strength when nothing is carried, none
        # when everything is (a carried history is not made optimistic again by a new sequence)
        self.prior_weight = self.carry * self.prior_weight + (1.0 - self.carry) * self.prior_strength

    def _counts(self):
        return self.tried, self.passed, self.asked_at, self.proposed_at

    def _context_counts(self, context, record=False):
        """``[round, tried, passed, asked, proposed]`` at position 1 in ``context``, decayed to this
        round: in this sequence, or (``record``) over all sequences."""
        table, decay = (self.context_record, self.context_memory) if record else (self.context_counts, self.decay)
        counts = table.setdefault(context, [self.rounds, 0.0, 0.0, 0.0, 0.0])
        if counts[0] != self.rounds:
            f = decay ** (self.rounds - counts[0])
            counts[:] = [self.rounds, *(v * f for v in counts[1:])]
        return counts

    def survival(self, context: Optional[int] = None) -> Tuple[list, list]:
        """``(survival, proposed)``, two ``[k_max]`` lists: the estimated ``P(N >= i) =
        prod_{j<=i} g_j a_j`` and ``P(M >= i) = prod_{j<=i} g_j`` of a round asking ``k_max``,
        position 1's rates taken in ``context`` (see the class docstring) when one is given."""
        g = self._posterior(self.proposed_at, self.asked_at, 1.0 - 1e-3)
        a = self._posterior(self.passed, self.tried, self.prior_rate)
        if context is not None:  # position 1 in this context: its counts, shrunk to its record,
            # itself shrunk to the pooled rates
            _, tried, passed, asked, proposed_1 = self._context_counts(context)
            _, r_tried, r_passed, r_asked, r_proposed = self._context_counts(context, record=True)
            w = self.context_weight
            a_target = (r_passed + w * a[0]) / (r_tried + w)
            g_target = (r_proposed + w * g[0]) / (r_asked + w)
            a[0] = (passed + w * a_target) / (tried + w)
            g[0] = (proposed_1 + w * g_target) / (asked + w)
        proposed, survival = [], []  # [k_max] prod_{j<=i} g_j and prod_{j<=i} g_j a_j
        p = q = 1.0
        for g_i, a_i in zip(g, a):
            p *= g_i
            q *= g_i * a_i
            proposed.append(p)
            survival.append(min(q, p))
        return survival, proposed

    def draft_length(self, limit: int, context: Optional[int] = None) -> int:
        hi = min(self.k_max, limit)
        costs = self._cost_lists()
        if costs is None:  # no timings yet: a short first round measures the costs
            return min(max(self.k_min, 1), hi)
        d, t = costs
        survival, proposed = self.survival(context)
        if self.tree_draft:
            # A tree asked for depth K scores its nodes, not K + 1 tokens: its pass costs
            # tree_pass_costs()[K - 1] (1 + nodes per level x expected depth reached, which
            # already counts how often levels are proposed), entered as the law's T(K + 1).
            t, proposed = [1.0, *self.tree_pass_costs().tolist()], [1.0] * self.k_max
        curve = _speedup_values(survival, proposed, d, t)  # [k_max + 1] f(0..k_max)
        self.last_curve = np.array(curve)
        lo = min(self.k_min, hi)
        k = max(range(lo, hi + 1), key=curve.__getitem__)  # the first maximum, as argmax
        if self.explore_every and self.rounds % self.explore_every == self.explore_every - 1:
            # one more than the optimum; after K = 0, the best length that drafts (K = 1 would
            # observe position 1 only, with a two-token pass, often a CPU's dearest per token)
            k = min(k + 1, hi) if k > 0 or hi < 1 else max(range(1, hi + 1), key=curve.__getitem__)
        return k

    def tree_width(self) -> float:
        """Nodes per level of the draft's trees: their decayed node count over their decayed depth
        (1, a chain, before any tree is seen)."""
        return self.tree_nodes / self.tree_depth if self.tree_depth > 0.0 else 1.0

    def tree_pass_costs(self, target_costs: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> np.ndarray:
        """``[k_max]`` the target pass of a tree round asked for depth K = 1..k_max, relative to a
        one-token pass: ``T(1 + E[N | K])`` with ``E[N | K] = width * sum_{i<=K} P(depth >= i)``
        (the expected depth reached, from the proposal rates, times the nodes per level), T
        interpolated between token counts. ``target_costs``: ``T`` at an array of counts (default:
        this policy's cost model or fitted timings)."""
        reached = np.cumsum(np.cumprod(self.proposal_rates()))  # [k_max] E[depth | K]
        counts = 1.0 + self.tree_width() * reached
        grid = np.arange(1, int(np.ceil(counts.max())) + 1)  # token counts 1..max
        t = (target_costs or self._target_costs)(grid)
        return np.interp(counts, grid, t) / t[0]

    def observe(self, r: RoundRecord) -> None:
        self.rounds += 1
        dec = self.decay
        for arr in self._counts():
            arr *= dec
        self.prior_weight *= dec
        m, n, asked = r.proposed, r.accepted, min(r.asked, self.k_max)
        reach = m  # positions the proposal reaches: a chain's tokens
        if r.depth is not None:  # a tree: its depth (its nodes are m)
            reach = min(r.depth, asked)
            self.tree_draft = True
            if r.depth > 0:
                self.tree_nodes = dec * self.tree_nodes + m
                self.tree_depth = dec * self.tree_depth + r.depth
        self.tried[: min(n + 1, reach)] += 1.0  # verification reached these (the first rejection included)
        self.passed[:n] += 1.0
        # positions 1..min(reach+1, asked) were asked with everything before them proposed
        self.asked_at[: min(reach + 1, asked)] += 1.0
        self.proposed_at[:reach] += 1.0
        hindsight = r.hindsight if r.asked == 0 else None  # position 1 seen without drafting
        if hindsight is not None:
            self.tried[0] += 1.0
            self.passed[0] += bool(hindsight)
        if r.context is not None:
            seen, right = reach > 0 or hindsight is not None, n > 0 or bool(hindsight)
            for counts in (self._context_counts(r.context), self._context_counts(r.context, record=True)):
                counts[1] += seen
                counts[2] += right
                counts[3] += asked > 0
                counts[4] += reach > 0
        if self.target_cost is None:
            t = r.target_time
            profile = self.target_fit.mean_at(m + 1) if math.isfinite(t) else None  # this length's, if seen
            if profile is not None and profile > 0.0 and t > 0.0:
                self.log_pace += (1.0 - self.pace_decay) * (math.log(t / profile) - self.log_pace)
            pace = math.exp(self.log_pace)
            if math.isfinite(t):
                self.target_fit.add(m + 1, t / pace)
            if r.asked > 0 and math.isfinite(r.draft_time):
                self.draft_fit.add(r.asked, r.draft_time / pace)

    def __repr__(self):
        return f"AdaptiveK(k_max={self.k_max})"
