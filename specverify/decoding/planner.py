"""The round planner: each round, propose what pays -- the candidate and length with the most
expected tokens per unit of measured cost, or nothing.

A round that proposes a chain of ``L`` tokens emits ``1 + N`` tokens (``N`` accepted) and costs
``D + T(L + 1)``: the draft's calls and one target pass scoring ``L + 1`` tokens, in units of a
one-token pass (:class:`specverify.law.MeasuredCosts`, or learned from the decoder's timings).
With ``S_i = P(N >= i) = prod_{j<=i} a_j`` its expected value is

    E[tokens] = 1 + sum_{i<=L} S_i,        rate = E[tokens] / (D + T(L + 1)),

the law's speed-up (:func:`specverify.law.speedup_curve`) for this round. A tree of ``N`` nodes
scores ``N + 1`` tokens and ``S_i`` is the probability that its accepted path is ``i`` deep.
Proposing nothing is worth one token for ``T(1) = 1``. :class:`Planner` evaluates its
candidates on that one scale and proposes the best, each round:

- a **deterministic** candidate (prompt lookup: its proposal is a function of the prefix, and
  free) is drafted first, every round; its ``S_i`` are per-position acceptance rates learned
  from history, position 1's per draft context (its ``context(prefix)``: the match's order, and
  whether later text contradicted it), exactly as :class:`~specverify.decoding.adaptive.AdaptiveK`
  learns them (one per candidate); the planner may propose any prefix of it. Rounds that used
  another proposal still teach it: the next round's prefix shows which of its tokens the
  target emitted (an emitted token has the target's law whatever was proposed, so the count
  has the law of an acceptance);
- a **gated** chain (a draft whose call takes ``gate``: the learned draft) is drafted position
  by position: before drawing ``t_i`` it hands the planner ``path = prod_{j<i} q_j(t_j)`` and
  ``top = max q_i``, and the planner draws ``t_i`` only if a proposal reaching past ``i`` has
  the best predicted rate. Its ``S_i`` are the draft's own ``c_i = path * top``, mapped through
  a *reliability curve* (the acceptance observed at each confidence, per candidate, Beta counts
  with the identity as prior: an over-confident draft is corrected as rounds are seen); later
  positions are predicted as ``c_i top^{l - i}``. Whether to run it at all is decided before
  its first forward, from its history (an :class:`~specverify.decoding.adaptive.AdaptiveK` of its own:
  the tokens it gave, and the rows and pass lengths its gate let it cost, per call, a call
  stopped at once being worth the fallback's proposal);
  if its gate then stops before the first token, the round falls back to the best
  deterministic proposal or to nothing;
- any other candidate (a stochastic chain without ``gate``, a drawn tree) is valued from its
  history alone and asked for the length its history says.

What a round costs to plan: every deterministic candidate's call (a lookup's suffix match),
arithmetic over at most ``k_max`` lengths per candidate, and for a gated chain one comparison
per draft row; a gated or history-valued draft runs only in rounds that choose it.

Why the choice keeps verification exact
---------------------------------------
The claim and proof of :mod:`specverify.decoding.adaptive` hold for any rule that decides
whether position ``i`` is proposed, and from which candidate, from the prefix ``x``, the
history ``H``, the candidates' draft-side randomness and the tokens ``t_{<i}`` proposed before
``i``, but not from ``t_i`` itself nor from the round's target rows or verification uniforms,
provided a proposed ``t_i`` is distributed, given what the decision saw, as the row ``q_i``
handed to the verifier. The planner's decisions read:

1. the candidate (and a deterministic proposal's length): ``x``, ``H`` and the deterministic
   candidates' proposals, which are functions of ``x``; a point mass handed over as
   ``probs = None`` is its own row whatever chose it;
2. a gated chain's position ``i``: its tokens ``t_{<i}`` (through ``path``) and its row
   ``q_i`` (through ``top``), both fixed before ``t_i`` is drawn; ``t_i`` is then drawn from
   ``q_i``, the row the verifier receives;
3. the fall-back when the gate stops at position 1: ``q_1`` only (no token was drawn);
4. the rounds' records: the past.

So every decision is of the form the claim allows, and the decoder's output has the target's
joint law. What would break it (both rejected by the decoder's joint-law test in
``tests/decoding/test_planner.py``): a choice that reads the target's row of this round
(proposing only where the target would accept), and a choice between candidates made after a
stochastic candidate's tokens are drawn, on their values (keeping a drawn chain only when it
looks good makes its law ``q`` conditioned on looking good). This is why the fall-back happens
only before the first draw: after ``t_1`` is drawn, the chain is proposed, whatever follows.
Greedy verification emits the target's argmax for any proposal.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from ..law.costs import MeasuredCosts
from .adaptive import AdaptiveK, RoundRecord, _CostCurve, takes_keyword
from .tree_drafts import DraftTree

__all__ = ["Candidate", "Planner", "Reliability"]


class Reliability:
    """``R(c)``: the probability that a draft position is accepted given the draft's own
    confidence ``c`` in it (``prod_{j<i} q_j(t_j) * max q_i``), learned online.

    ``bins`` bins over ``[0, 1]`` with edges ``(b / bins)^2`` (fine where learned drafts' confidences
    are, near 0); each holds decayed counts of positions seen and accepted, plus ``prior_strength``
    pseudo-positions at the bin's mid-point (the draft is believed until shown otherwise).
    ``decay`` per round follows a change of regime.
    """

    def __init__(self, bins: int = 12, prior_strength: float = 4.0, decay: float = 0.995):
        if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
            raise ValueError(f"bins must be an integer >= 1, got {bins!r}")
        if not prior_strength > 0.0:
            raise ValueError(f"prior_strength must be > 0, got {prior_strength!r}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay!r}")
        self.edges = (np.arange(bins + 1) / bins) ** 2  # [bins + 1]
        self.mid = 0.5 * (self.edges[:-1] + self.edges[1:])  # [bins] the prior's means
        self.prior_strength, self.decay = float(prior_strength), float(decay)
        self.seen = np.zeros(bins)  # [bins] decayed positions seen
        self.accepted = np.zeros(bins)  # [bins] ... and accepted

    def _bin(self, c: float) -> int:
        return min(int(np.searchsorted(self.edges, min(max(c, 0.0), 1.0), side="right")) - 1, self.mid.size - 1)

    def __call__(self, c: float) -> float:
        b = self._bin(c)
        return float((self.accepted[b] + self.prior_strength * self.mid[b]) / (self.seen[b] + self.prior_strength))

    def observe(self, confidences: Sequence[float], accepted: int) -> None:
        """One round: position ``l`` (1-based) had confidence ``confidences[l - 1]`` and was
        accepted iff ``l <= accepted``."""
        self.seen *= self.decay
        self.accepted *= self.decay
        for l, c in enumerate(confidences, 1):
            b = self._bin(c)
            self.seen[b] += 1.0
            self.accepted[b] += l <= accepted


@dataclass
class Candidate:
    """One way a round may propose: ``draft`` is a ``draft_step(prefix, k)`` as
    :class:`~specverify.SpeculativeDecoder` takes it, ``name`` its name in the cost model.

    ``deterministic=True``: its proposal is a function of the prefix (prompt lookup, a top-k
    tree) and cheap, so the planner drafts it every round before choosing. A draft whose call
    takes a ``gate`` keyword is planned position by position (module docstring); any other is
    valued from its history. ``k_max`` caps the lengths (tree depths) asked of it.
    """

    name: str
    draft: Callable
    deterministic: bool = False
    k_max: int = 8
    gated: bool = field(init=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"name must be a non-empty string, got {self.name!r}")
        if not callable(self.draft):
            raise TypeError(f"draft of candidate {self.name!r} must be a draft_step callable, got {self.draft!r}")
        if not isinstance(self.deterministic, (bool, np.bool_)):
            raise TypeError(f"deterministic of candidate {self.name!r} must be a bool, got {self.deterministic!r}")
        if isinstance(self.k_max, bool) or not isinstance(self.k_max, (int, np.integer)) or self.k_max < 1:
            raise ValueError(f"k_max of candidate {self.name!r} must be an integer >= 1, got {self.k_max!r}")
        self.k_max = int(self.k_max)
        self.gated = not self.deterministic and takes_keyword(self.draft, "gate")


@dataclass
class _Choice:
    """What a round may propose: ``candidate`` (None: nothing), its length or tree depth ``k``, its
    modelled expected ``tokens`` and ``cost``, and for a deterministic one the proposal and the
    draft context it was valued in."""

    candidate: Optional[Candidate]
    k: int
    tokens: float
    cost: float
    proposal: object = None
    context: Optional[int] = None

    @property
    def rate(self) -> float:
        return self.tokens / self.cost if self.cost > 0.0 else 0.0


class Planner:
    """``draft_step`` and draft-length policy in one: each round proposes the candidate and length
    (or tree) with the most expected tokens per unit of cost, or nothing (module docstring).

    Use it as ``SpeculativeDecoder(Planner([...], costs), target_step, k="auto")``.

    Parameters
    ----------
    candidates : sequence of :class:`Candidate`
        The ways a round may propose (distinct names).
    costs : :class:`specverify.law.MeasuredCosts` or None
        ``T(n)`` and each candidate's ``D(k)`` (by its name; a name not measured is timed
        online). ``None``: every cost is learned from this planner's timings (``clock``): a
        target pass's seconds by the tokens it scored (unseen lengths priced optimistically, as
        :class:`~specverify.decoding.adaptive.AdaptiveK` does), each draft's by the rows it computed
        in rounds it runs in a row (a call after rounds it sat out also catches up on their tokens).
    k_max : int
        The longest proposal (tree depth) of any round.
    explore_every : int
        A gated or history-valued candidate that has not run for ``explore_every`` rounds (0:
        never) is run even where another looks better, so that its history does not freeze on
        the prior's first verdict (a gated chain still stops where its own rows say). Each such
        forced run after which it still does not look best doubles its wait (up to
        ``64 * explore_every``); a round it wins on its own merit resets the wait. A draft that does
        not pay thus costs ever fewer wasted calls, and one that starts to pay is found again
        (with ``carry=0`` the waits start over with each sequence, as the counts do).
    carry : float
        The share of a model draft's (any candidate not ``deterministic``) acceptance counts kept
        from one sequence to the next (:meth:`begin`): its acceptance is a property of the two
        models, so by default (1) it is learned once, not paid for again with every prompt. A
        deterministic candidate (prompt lookup) depends on the prompt: it starts each sequence
        from the prior (its per-context record across sequences is kept, as AdaptiveK keeps it).
    prior_rate, prior_strength, decay, context_weight : float
        As :class:`~specverify.decoding.adaptive.AdaptiveK`'s (each candidate's history is one).
    reliability : callable
        Returns a fresh :class:`Reliability`, one per gated candidate.
    clock : callable
        Seconds, for the draft calls' timings when costs are learned online.

    ``last_choice`` is the latest round's ``(name or None, k, rate)``; ``choices`` counts rounds
    per candidate name (``None``: nothing proposed). Not thread-safe (one decoder at a time).
    """

    greedy = None  # set from the candidates that declare a mode

    def __init__(self, candidates: Sequence[Candidate], costs: Optional[MeasuredCosts] = None, *, k_max: int = 8,
                 explore_every: int = 10, carry: float = 1.0, prior_rate: float = 0.95, prior_strength: float = 3.0,
                 decay: float = 0.98, context_weight: float = 1.0, reliability: Callable[[], Reliability] = Reliability,
                 clock: Callable[[], float] = time.perf_counter):
        candidates = list(candidates) if isinstance(candidates, (list, tuple)) else candidates
        if not isinstance(candidates, list) or not candidates or not all(isinstance(c, Candidate) for c in candidates):
            raise TypeError(f"candidates must be a non-empty list of Candidate, got {candidates!r}")
        names = [c.name for c in candidates]
        if len(set(names)) != len(names):
            raise ValueError(f"candidates must have distinct names, got {names}")
        MeasuredCosts.check(costs)
        if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or k_max < 1:
            raise ValueError(f"k_max must be an integer >= 1, got {k_max!r}")
        if isinstance(explore_every, bool) or not isinstance(explore_every, (int, np.integer)) or explore_every < 0:
            raise ValueError(f"explore_every must be an integer >= 0, got {explore_every!r}")
        if not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
        modes = {bool(c.draft.greedy) for c in candidates if isinstance(getattr(c.draft, "greedy", None), bool)}
        if len(modes) > 1:
            raise ValueError("candidates: drafts built for greedy decoding and for sampling cannot be mixed")
        self.greedy = modes.pop() if modes else None
        vocab = [getattr(c.draft, "vocab_size", None) for c in candidates]
        self.vocab_size = next((v for v in vocab if v is not None), None)
        self.candidates, self.costs, self.clock = candidates, costs, clock
        self.k_max, self.explore_every = int(k_max), int(explore_every)
        self.stop = None  # the decoder's stop rule: the planner cuts its own proposals
        self._history_args = dict(prior_rate=prior_rate, prior_strength=prior_strength, decay=decay,
                                  context_weight=context_weight, explore_every=0)
        AdaptiveK(k_max=1, carry=carry, **self._history_args)  # checks the arguments once, naming them
        self.carry = float(carry)
        self._make_reliability = reliability
        self.reset()

    def reset(self) -> None:
        """Forget every estimate (rates, reliability, online costs)."""
        self.history = {c.name: AdaptiveK(k_max=min(c.k_max, self.k_max), carry=0.0 if c.deterministic else self.carry,
                                          **self._history_args)
                        for c in self.candidates}
        # rounds since each planned candidate last ran, and how long it waits to be explored
        self._idle = {c.name: 0 for c in self.candidates if not c.deterministic}
        self._wait = {c.name: self.explore_every for c in self.candidates if not c.deterministic}
        self.reliability = {c.name: self._make_reliability() for c in self.candidates if c.gated}
        # seconds by tokens scored; floored only over the chain lengths it asks for (not trees' node counts)
        self.target_fit = _CostCurve(0.98, self.k_max + 2, floor_from=2, halfway=True, floor_until=self.k_max + 1)
        self.draft_fit = {c.name: _CostCurve(0.98, c.k_max + 1, proportional=True) for c in self.candidates}
        self.rounds = 0
        self.choices = {}
        self.last_choice = None
        self._pending = None  # what this round proposed, for observe()
        self._unused = []  # (candidate, context, tokens) of deterministic proposals not used, for hindsight
        self._last_prefix = None
        self._called = set()  # candidates called in this sequence (a first call catches up on the prefix)
        self._ran_last = set()  # planned candidates that ran in the round before this one

    # -- the decoder's policy protocol ----------------------------------------------------------
    def begin(self) -> None:
        for h in self.history.values():
            h.begin()
        if self.carry == 0.0:  # nothing learned about the drafts is kept: nor how long they wait
            self._wait = dict.fromkeys(self._wait, self.explore_every)
        self._unused, self._last_prefix, self._called = [], None, set()

    def draft_length(self, limit: int) -> int:
        return min(self.k_max, limit)  # the round's choice is made when the prefix is seen (__call__)

    def observe(self, record: RoundRecord) -> None:
        self.rounds += 1
        if self.costs is None and math.isfinite(record.target_time):
            self.target_fit.add(record.proposed + 1, record.target_time)
        pending, self._pending = self._pending, None
        if pending is None or pending["candidate"] is None:
            return
        c = pending["candidate"]
        self.history[c.name].observe(RoundRecord(pending["asked"], record.proposed, record.accepted, math.nan,
                                                 math.nan, record.depth, pending["context"]))
        if c.gated:
            self.reliability[c.name].observe(pending["confidences"], record.accepted)

    # -- costs ------------------------------------------------------------------------------------
    def target_cost(self, n: int) -> float:
        """``T(n)`` relative to a one-token pass: measured, or fitted from timings (1 before any)."""
        if self.costs is not None:
            return self.costs(n)
        if not self.target_fit.seen:
            return 1.0
        one, t = self.target_fit.values([1, n])
        return max(t, 1e-12) / max(one, 1e-12)

    def draft_cost(self, candidate: Candidate, rows: int) -> float:
        """``D(rows)`` of ``candidate``'s call computing ``rows`` draft rows, relative to a one-token pass."""
        if rows <= 0:
            return 0.0
        if self.costs is not None and candidate.name in self.costs.drafts:
            return self.costs.draft_cost(candidate.name, rows)
        fit = self.draft_fit[candidate.name]
        if not fit.seen or not self.target_fit.seen:
            return 0.0  # optimistic until timed: a draft priced too high is never tried, so never corrected
        return max(fit.values([rows])[0], 0.0) / max(self.target_fit.values([1])[0], 1e-12)

    def _timed(self, candidate: Candidate, rows, call):
        """``call()``, its seconds learned as ``candidate``'s cost for ``rows()`` draft rows (rows
        is read after the call: a gated chain knows them only then) unless the costs are measured.
        A candidate's first call in a sequence is not learned: a model draft catches up on the
        whole prefix there (the prompt's prefill), which no later call of that length repeats. Nor
        is a planned candidate's call after rounds it sat out: it catches up on their tokens (a
        learned draft feeds every new pair to its cache), and learned as the cost of its rows that
        made a draft that had sat out dearer the longer it sat out, until it was chosen no more.
        Its cost is what a call costs in rounds it runs in a row, one round's tokens to catch up."""
        t0 = self.clock()
        out = call()
        n = rows()
        first = candidate.name not in self._called
        self._called.add(candidate.name)
        caught_up = candidate.deterministic or candidate.name in self._ran_last
        if (self.costs is None or candidate.name not in self.costs.drafts) and n > 0 and not first and caught_up:
            self.draft_fit[candidate.name].add(n, self.clock() - t0)
        return out

    # -- values -----------------------------------------------------------------------------------
    def _context(self, candidate: Candidate, prefix: torch.Tensor) -> Optional[int]:
        context_of = getattr(candidate.draft, "context", None)
        if not callable(context_of):
            return None
        c = context_of(prefix.clone())
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)):
            raise TypeError(f"candidate {candidate.name!r}: draft.context must return an int, got {c!r}")
        return int(c)

    def _rates(self, candidate: Candidate, context: Optional[int]) -> List[float]:
        """``[k_max]`` ``prod_{j<=i} a_j``: P(a proposal of at least i tokens accepts i), from history."""
        survival, proposed = self.history[candidate.name].survival(context)
        return [s / p if p > 0.0 else 0.0 for s, p in zip(survival, proposed)]

    def _chain_choice(self, candidate: Candidate, accepted: Sequence[float], longest: int, base: float,
                      proposal, context: Optional[int]) -> _Choice:
        """The best length ``1..longest`` of a chain whose ``accepted[i - 1] = P(N >= i)``."""
        best, tokens = _Choice(candidate, 0, 0.0, 1.0, proposal, context), 1.0
        for length in range(1, longest + 1):
            tokens += accepted[length - 1]
            option = _Choice(candidate, length, tokens, base + self.target_cost(length + 1), proposal, context)
            if option.rate > best.rate:
                best = option
        return best

    def _history_choice(self, candidate: Candidate, limit: int, base: float, fallback: _Choice) -> _Choice:
        """The best length of a candidate valued from its history (``proposed``: how often its calls
        reach each position), its draft cost included. A gated chain is valued as it runs: asked
        its longest length, its gate ends it where its rows say, or falls back to ``fallback``
        (:meth:`_gated_choice`)."""
        h = self.history[candidate.name]
        survival, proposed = h.survival(None)
        hi = min(limit, h.k_max)
        if candidate.gated:
            return self._gated_choice(candidate, survival[:hi], proposed[:hi], base, fallback)
        if h.tree_draft:  # a tree of depth K scores its nodes: T(1 + E[N | K])
            passes = h.tree_pass_costs(lambda counts: np.array([self.target_cost(int(n)) for n in counts]))
        best, tokens, time_ = _Choice(candidate, 0, 0.0, 1.0), 1.0, 1.0
        for k in range(1, hi + 1):
            tokens += survival[k - 1]
            if h.tree_draft:
                time_ = passes[k - 1]
            else:
                time_ += proposed[k - 1] * (self.target_cost(k + 1) - self.target_cost(k))
            option = _Choice(candidate, k, tokens, base + self.draft_cost(candidate, k) + time_)
            if option.rate > best.rate:
                best = option
        return best

    def _gated_choice(self, candidate: Candidate, survival: Sequence[float], proposed: Sequence[float],
                      base: float, fallback: _Choice) -> _Choice:
        """A gated chain asked ``L = len(survival)`` tokens, valued from its history before its
        first forward: ``survival[i - 1] = P(N >= i)``, ``proposed[i - 1] = P(M >= i)`` with ``M``
        the tokens its gate lets through (``M = 0``: one row computed, and the round proposes
        ``fallback``, the best deterministic proposal or nothing, instead of a plain step).

        A call that proposes ``M < L`` tokens computes ``M + 1`` rows (its gate reads the row past
        the last token) and ``L`` rows at ``M = L``, so its draft cost is expected over ``M``'s law,
        ``E[D] = sum_{m<L} P(M = m) D(m + 1) + P(M = L) D(L)``, with the pass's
        ``E[T(M + 1)] = 1 + sum_i P(M >= i) (T(i + 1) - T(i))``. Charged the rows of a full
        proposal on every call instead, with its stopped calls counted as plain steps, a chain
        whose gate often stops early (on text far from its training data) was priced out and,
        with no call to correct its history, never chosen again."""
        L = len(proposed)
        if L == 0:
            return _Choice(candidate, 0, 0.0, 1.0)  # asked nothing: never chosen
        reach = [1.0, *proposed]  # [L + 1] P(M >= m), m = 0..L
        rows = sum((reach[m] - reach[m + 1]) * self.draft_cost(candidate, m + 1) for m in range(L))
        rows += reach[L] * self.draft_cost(candidate, L)
        passes = 1.0 + sum(p * (self.target_cost(i + 1) - self.target_cost(i)) for i, p in enumerate(proposed, 1))
        stop = 1.0 - reach[1]  # P(M = 0): the fallback's tokens and pass in place of a plain step's
        tokens = 1.0 + sum(survival) + stop * (fallback.tokens - 1.0)
        return _Choice(candidate, L, tokens, base + rows + passes + stop * (fallback.cost - base - 1.0))

    # -- a round ----------------------------------------------------------------------------------
    def __call__(self, prefix: torch.Tensor, k: int):
        prefix = torch.as_tensor(prefix).reshape(-1)
        self._learn_in_hindsight(prefix)
        base, options, self._unused = 0.0, [], []
        for c in self.candidates:  # deterministic proposals first: functions of the prefix
            if not c.deterministic:
                continue
            limit = min(k, c.k_max)
            context = self._context(c, prefix)
            drafted = self._timed(c, lambda: limit, lambda: c.draft(prefix.clone(), limit))
            if (drafted.probs if isinstance(drafted, DraftTree) else drafted[1]) is not None:
                # drawn tokens valued after drawing would be chosen on their values: not exact
                raise ValueError(f"candidate {c.name!r} is deterministic but its draft returned probs: a "
                                 f"deterministic proposal is a point mass (probs None), a function of the prefix")
            base += self.draft_cost(c, limit)
            options.append((c, context, drafted))
        nothing = _Choice(None, 0, 1.0, base + 1.0)
        fixed = [self._deterministic_choice(c, context, drafted, base) for c, context, drafted in options]
        fallback = max([nothing, *fixed], key=lambda ch: ch.rate)  # what a gate stopping at once proposes
        planned = [self._history_choice(c, k, base, fallback) for c in self.candidates if not c.deterministic]
        best = max([nothing, *fixed, *planned], key=lambda ch: ch.rate)  # the first on ties
        # which planned candidates ran last round: a call after rounds sat out catches up on them
        self._ran_last = {name for name, idle in self._idle.items() if idle == 0}
        for name in self._idle:
            self._idle[name] += 1
        if best.candidate is not None and best.candidate.name in self._idle:  # won on merit
            self._wait[best.candidate.name] = self.explore_every
        elif self.explore_every:
            due = [ch for ch in planned if self._idle[ch.candidate.name] >= self._wait[ch.candidate.name]]
            if due:  # explored: if it is still not the best next time it is due, it waits twice as long
                best = max(due, key=lambda ch: ch.rate)
                name = best.candidate.name
                self._wait[name] = min(2 * self._wait[name], 64 * self.explore_every)
        if best.candidate is not None and best.candidate.name in self._idle:
            self._idle[best.candidate.name] = 0
        result = self._run(best, prefix, k, base, [nothing, *fixed])
        for c, context, drafted in options:
            if self._pending["candidate"] is not c and not isinstance(drafted, DraftTree) and len(drafted[0]):
                self._unused.append((c, context, drafted[0]))
        self._last_prefix = prefix.clone()
        return result

    def _deterministic_choice(self, c: Candidate, context, drafted, base: float) -> _Choice:
        if isinstance(drafted, DraftTree):
            if not drafted.n_nodes:
                return _Choice(c, 0, 0.0, 1.0, drafted, context)
            accepted = self._rates(c, context)  # P(the accepted path is >= i deep), from history
            depth = drafted.depth()
            return _Choice(c, depth, 1.0 + sum(accepted[:depth]), base + self.target_cost(drafted.n_nodes + 1),
                           drafted, context)
        accepted = self._rates(c, context)
        longest = min(torch.as_tensor(drafted[0]).reshape(-1).numel(), len(accepted))
        return self._chain_choice(c, accepted, longest, base, drafted, context)

    def _run(self, best: _Choice, prefix, k: int, base: float, fallbacks: List[_Choice]):
        """Propose ``best``; ``fallbacks`` (nothing and the deterministic options) if it is a
        gated chain whose gate stops before its first token."""
        c = best.candidate
        if c is None or c.deterministic:
            return self._use(best)
        if not c.gated:
            self._pending = {"candidate": c, "asked": best.k, "context": None}
            self._note(best)
            return self._timed(c, lambda: best.k, lambda: c.draft(prefix.clone(), best.k))
        limit = min(k, c.k_max)
        gate = _Gate(self, c, limit, base, fallbacks)
        tokens, probs = self._timed(c, lambda: gate.rows, lambda: c.draft(prefix.clone(), limit, gate=gate))
        if len(tokens) == 0:  # the gate stopped before drawing t_1, on q_1 alone: fall back
            self.history[c.name].observe(RoundRecord(limit, 0, 0, math.nan, math.nan))  # a draft-side fact
            return self._use(gate.fallback or max(fallbacks, key=lambda ch: ch.rate))  # (no row: no gate call)
        self._pending = {"candidate": c, "asked": limit, "context": None,
                         "confidences": gate.confidences[: len(tokens)]}
        self._note(_Choice(c, len(tokens), gate.tokens, gate.cost))
        return tokens, probs

    def _use(self, choice: _Choice):
        """The deterministic proposal of ``choice`` cut to its length (nothing: no tokens)."""
        self._note(choice)
        c = choice.candidate
        self._pending = {"candidate": c, "asked": choice.k, "context": choice.context}
        if c is None:
            return torch.empty(0, dtype=torch.int64), None
        drafted = choice.proposal
        if isinstance(drafted, DraftTree):
            return drafted
        return torch.as_tensor(drafted[0]).reshape(-1)[: choice.k], None

    def _note(self, choice: _Choice) -> None:
        name = None if choice.candidate is None else choice.candidate.name
        self.last_choice = (name, choice.k, choice.rate)
        self.choices[name] = self.choices.get(name, 0) + 1

    def _learn_in_hindsight(self, prefix: torch.Tensor) -> None:
        """The deterministic proposals the last round did not use, scored against what it emitted."""
        last, unused, self._unused = self._last_prefix, self._unused, []
        if last is None or prefix.numel() <= last.numel() or not torch.equal(prefix[: last.numel()], last):
            return
        emitted = prefix[last.numel():]
        for c, context, tokens in unused:
            tokens = torch.as_tensor(tokens).reshape(-1)
            seen = min(tokens.numel(), emitted.numel(), self.history[c.name].k_max)
            right = 0
            while right < seen and int(tokens[right]) == int(emitted[right]):
                right += 1
            self.history[c.name].observe(RoundRecord(seen, seen, right, math.nan, math.nan, None, context))

    def __repr__(self):
        return f"Planner([{', '.join(c.name for c in self.candidates)}], k_max={self.k_max})"


class _Gate:
    """A gated chain's position-by-position rule (module docstring, decision 2): before drawing
    ``t_i`` (0-based ``i``), draw it iff some proposal longer than ``i`` tokens has a better
    predicted rate than stopping at ``i``; at ``i = 0`` stopping means the best of ``fallbacks``
    (nothing, the deterministic proposals), the draft row already paid for."""

    def __init__(self, planner: Planner, candidate: Candidate, limit: int, base: float, fallbacks: List[_Choice]):
        self.planner, self.candidate, self.limit, self.base, self.fallbacks = planner, candidate, limit, base, fallbacks
        self.reliability = planner.reliability[candidate.name]
        self.tokens = 1.0  # 1 + sum of R(c_l) over the positions already proposed
        self.cost = 0.0  # the modelled cost of the proposal so far
        self.confidences = []  # raw c_l of the positions proposed
        self.fallback = None  # the choice after a stop at i = 0
        self.rows = 0  # draft rows the draft computed (one per call)

    def __call__(self, i: int, path: float, top: float) -> bool:
        p, R = self.planner, self.reliability
        self.rows = i + 1
        sunk = p.draft_cost(self.candidate, i + 1)  # the rows computed so far
        if i == 0:
            self.fallback = max((_Choice(ch.candidate, ch.k, ch.tokens, ch.cost + sunk, ch.proposal, ch.context)
                                 for ch in self.fallbacks), key=lambda ch: ch.rate)
            stop_rate = self.fallback.rate
        else:
            stop_rate = self.tokens / (self.base + sunk + p.target_cost(i + 1))
        best, tokens, c = stop_rate, self.tokens, path * top
        for length in range(i + 1, self.limit + 1):  # predicted: c_l = path * top^(l - i)
            tokens += R(c)
            c *= top
            rows = min(length + 1, self.limit)
            cost = self.base + p.draft_cost(self.candidate, rows) + p.target_cost(length + 1)
            best = max(best, tokens / cost)
        if best <= stop_rate:
            self.cost = self.base + sunk + p.target_cost(i + 1)
            return False
        self.confidences.append(path * top)
        self.tokens += R(path * top)
        self.cost = self.base + sunk + p.target_cost(i + 2)
        return True
