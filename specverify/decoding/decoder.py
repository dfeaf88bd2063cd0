"""The draft/verify loop of speculative decoding, with per-run statistics.

A round of speculative decoding (Leviathan, Kalman & Matias 2023; Chen et al. 2023):

1. the *draft* proposes ``k`` tokens ``t_0 .. t_{k-1}`` after the current sequence;
2. the *target* scores all of them in one pass, returning ``k + 1`` next-token rows, row ``i``
   for the position after ``prefix + t[:i]``;
3. the verifier (:func:`specverify.verify_greedy`, :func:`specverify.accept` or
   :func:`specverify.accept_block`) keeps an *accepted* prefix ``t[:n]`` and emits one more
   token: the *recovered* (residual) token after the accepted prefix, or the *bonus* token drawn
   from row ``k`` when all ``k`` were accepted.

Every round therefore *emits* ``n + 1`` tokens.

A draft may also return a *tree* (:class:`specverify.tree_drafts.DraftTree`: ``tokens [N]``,
``parents [N]``, ``probs [N + 1, V]`` or None): the target then scores all ``N`` nodes in one pass
(``[N + 1, V]`` rows, row ``i + 1`` after node ``i``), :func:`specverify.verify_tree_greedy` or
:func:`specverify.accept_tree` picks the accepted root-to-node path, and the round emits that path
and the next token. A chain is the tree ``parents = [-1, 0, ..., k - 2]``; chain drafts keep the chain
ops. Greedy verification reproduces plain greedy
decoding of the target token for token; speculative sampling preserves the target's joint law
over whole sequences, provided the draft's ``probs`` are the distributions its tokens were
actually drawn from, warped (temperature, top-k, ...) exactly as the target's rows are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import torch

from ..kernels import _inputs
from ..verify import accept, accept_block, accept_tree, verify_greedy, verify_tree_greedy
from .adaptive import AdaptiveK, FixedK, RoundRecord, ask_policy, confidence_cut, draft_hindsight, takes_keyword
from .tree_drafts import DraftTree

__all__ = ["SpeculativeDecoder", "DecodeStats"]

DraftStep = Callable[[torch.Tensor, int], Tuple[Sequence[int], Optional[object]]]
TargetStep = Callable[[torch.Tensor, torch.Tensor], object]


@dataclass
class DecodeStats:
    """Statistics of one :meth:`SpeculativeDecoder.generate` call.

    Per-round lists have one entry per verification round, in order. Times are wall-clock
    seconds spent inside the draft callback, the target callback and the verification op.
    """

    k: int  # the largest draft length the policy may ask for
    drafted: list = field(default_factory=list)  # tokens (tree rounds: nodes) proposed by the draft, per round
    accepted: list = field(default_factory=list)  # accepted draft tokens n (tree rounds: path length), per round
    emitted: list = field(default_factory=list)  # tokens appended to the output, per round
    asked: list = field(default_factory=list)  # draft length asked by the policy, per round
    draft_time: float = 0.0
    target_time: float = 0.0
    verify_time: float = 0.0
    tree_rounds: int = 0  # rounds whose draft was a tree (each round is one target pass)

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def accepted_histogram(self) -> np.ndarray:
        """Counts of accepted lengths ``n = 0 .. k`` over the rounds, shape ``[k + 1]``.

        Rounds that proposed fewer than ``k`` tokens (near ``max_new``) are included; see
        :attr:`full_rounds_histogram` for rounds of exactly ``k`` proposals only.
        """
        return np.bincount(np.asarray(self.accepted, dtype=np.int64), minlength=self.k + 1)

    @property
    def full_rounds_histogram(self) -> np.ndarray:
        """Accepted-length counts over rounds that proposed all ``k`` tokens, shape ``[k + 1]``."""
        acc = np.asarray(self.accepted, dtype=np.int64)
        full = np.asarray(self.drafted, dtype=np.int64) == self.k
        return np.bincount(acc[full], minlength=self.k + 1)

    @property
    def acceptance_per_round(self) -> np.ndarray:
        """Fraction of proposed tokens accepted in each round (NaN where nothing was proposed)."""
        acc = np.asarray(self.accepted, dtype=np.float64)
        dr = np.asarray(self.drafted, dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(dr > 0, acc / np.where(dr > 0, dr, 1.0), np.nan)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over proposed draft tokens, pooled over all rounds."""
        total = sum(self.drafted)
        return float(sum(self.accepted) / total) if total else float("nan")

    @property
    def tokens_per_round(self) -> float:
        """Mean number of tokens emitted per round (target calls per token is its inverse)."""
        return float(np.mean(self.emitted)) if self.emitted else float("nan")

    @property
    def mean_accepted(self) -> float:
        return float(np.mean(self.accepted)) if self.accepted else float("nan")

    def summary(self) -> dict:
        """A flat dict of the headline numbers, for logging or a results table."""
        return {
            "k": self.k,
            "rounds": self.rounds,
            "tokens": int(sum(self.emitted)),
            "mean_accepted": self.mean_accepted,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_round": self.tokens_per_round,
            "tree_rounds": self.tree_rounds,
            "drafted_per_round": float(np.mean(self.drafted)) if self.drafted else float("nan"),
            "draft_time_s": self.draft_time,
            "target_time_s": self.target_time,
            "verify_time_s": self.verify_time,
        }


class SpeculativeDecoder:
    """Drive draft/verify rounds until ``max_new`` tokens are emitted.

    Parameters
    ----------
    draft_step : callable ``(prefix, k) -> (tokens, probs)``
        ``prefix`` is the whole sequence so far, a 1-D int64 tensor (do not modify it).
        Returns ``tokens`` ``[j]`` (ints, ``0 <= j <= k``: a draft with nothing better to
        propose, e.g. prompt lookup without a match, may return fewer, down to none) and
        ``probs`` ``[j, V]``: row ``i`` is the distribution ``tokens[i]`` was drawn from. ``probs`` may be ``None`` in greedy mode;
        in sampling mode ``None`` means a deterministic (point-mass) draft.
        May instead return a :class:`~specverify.tree_drafts.DraftTree` of depth ``<= k`` (any
        node count); its ``probs`` is ``[N + 1, V]`` or ``None`` (deterministic children).
    target_step : callable ``(prefix, proposed) -> target_probs``
        ``proposed`` is a 1-D int64 tensor of ``m`` draft tokens (``0 <= m <= k``); returns
        ``[m + 1, V]`` rows, row ``i`` scoring the position after ``prefix + proposed[:i]``.
        Only the argmax of each row is read in greedy mode. Rows need not be normalized.
        For a tree draft it is called as ``target_step(prefix, tokens, parents)`` and returns
        ``[N + 1, V]`` rows (row 0 after the prefix, row ``i + 1`` after node ``i``'s path).
    k : int, ``"auto"`` or a draft-length policy
        An int: draft tokens asked for per round (fewer in the last rounds, see
        :meth:`generate`). ``"auto"``: :class:`specverify.adaptive.AdaptiveK` (each round's K
        maximizes the modelled speed-up, learned from past rounds and this decoder's timings;
        with a tree draft, K is the tree's depth and a round is priced by the nodes it scores).
        Or any policy of :mod:`specverify.adaptive` (``FixedK(4, confidence_threshold=0.4)``,
        ``AdaptiveK(...)``): it may also stop drafting early on the draft's confidence. A
        ``draft_step`` that accepts a ``stop`` keyword receives the policy's stop rule
        ``stop(i, confidence) -> bool`` and should stop after token ``i`` when it says so;
        otherwise the decoder cuts the returned proposal itself (from ``probs``; a ``None``
        ``probs`` is a point mass, confidence 1). A ``draft_step`` with a ``context(prefix)``
        method (:class:`~specverify.integrations.transformers.PromptLookupDraft`: its match
        order, and whether later text contradicted the match) gives each round's context, before
        drafting, to a policy whose ``draft_length`` takes a ``context`` keyword; the round's
        :class:`~specverify.adaptive.RoundRecord` carries it. A ``draft_step`` with a
        ``first_token(prefix)`` method (the token its proposal would start with, or ``None``) is
        asked it in rounds that draft nothing, and the record says whether it was the token
        emitted (``hindsight``). Policies that only see the draft side and past rounds keep
        verification exact (proof in :mod:`specverify.adaptive`).
    greedy : bool
        ``True``: :func:`specverify.verify_greedy`. ``False``: speculative sampling, verified
        as ``method`` says.
    method : {"token", "block"}
        Sampling verifier: ``"token"`` (:func:`specverify.accept`, token by token) or ``"block"``
        (:func:`specverify.accept_block`, block verification: same output law, never fewer
        accepted tokens on average). Ignored in greedy mode.
    generator : torch.Generator or numpy.random.Generator, optional
        Source of the verification uniforms in sampling mode (``None``: torch's default
        generator). The draft's own sampling randomness belongs to ``draft_step``.
    eos_token_id : int, optional
        Stop right after this token is emitted.
    clock : callable, optional
        Seconds for the timings in :attr:`stats` (and those an adaptive policy learns from);
        default ``time.perf_counter`` (wall clock). ``time.process_time`` counts this process's
        CPU time only, which a shared machine's load disturbs far less (with one torch thread it
        is the wall time of an idle machine).

    After :meth:`generate`, :attr:`stats` (a :class:`DecodeStats`) holds the run's rounds,
    accepted-length histogram, per-round acceptance, tokens per round and timings.
    """

    def __init__(
        self,
        draft_step: DraftStep,
        target_step: TargetStep,
        k: int = 4,
        greedy: bool = True,
        generator=None,
        eos_token_id: Optional[int] = None,
        method: str = "token",
        clock: Callable[[], float] = time.perf_counter,
    ):
        if not callable(draft_step) or not callable(target_step):
            raise TypeError("draft_step and target_step must be callables")
        if isinstance(k, str):
            if k != "auto":
                raise ValueError(f"k must be a positive integer, 'auto' or a policy, got {k!r}")
            k = AdaptiveK()
        elif not hasattr(k, "draft_length"):
            if isinstance(k, bool) or int(k) != k or k < 1:
                raise ValueError(f"k must be a positive integer, got {k!r}")
            k = FixedK(int(k))
        self.policy = k
        if method not in self.METHODS:
            raise ValueError(f"method must be one of {sorted(self.METHODS)}, got {method!r}")
        self.draft_step = draft_step
        self.target_step = target_step
        self.k = int(k.k_max)
        self._draft_takes_stop = takes_keyword(draft_step, "stop")
        self._policy_takes_context = takes_keyword(k.draft_length, "context")
        self.greedy = bool(greedy)
        self.generator = generator
        self.eos_token_id = None if eos_token_id is None else int(eos_token_id)
        self.method = method
        self.clock = clock
        self.stats = DecodeStats(k=self.k)

    METHODS = {"token": accept, "block": accept_block}  # sampling verifiers by name

    # -- verification (the only place the ops are called; subclasses may override) --------
    def _verify(self, target_probs, draft_probs, tokens: torch.Tensor) -> Tuple[int, int]:
        # target_probs [m+1, V], draft_probs [m, V] or None, tokens [m]
        if self.greedy:
            return verify_greedy(target_probs, tokens)
        return self.METHODS[self.method](target_probs, draft_probs, tokens, generator=self.generator)

    def _draft(self, prefix: torch.Tensor, m: int):
        """``(tokens [j], probs [j, V] or None)``, j <= m, cut by the policy's draft-side stop rule
        (or the draft's :class:`~specverify.tree_drafts.DraftTree`, uncut)."""
        stop = self.policy.stop
        if stop is None:
            return self.draft_step(prefix, m)
        # a draft that takes the rule stops early (saving its own passes); the cut below is then a no-op
        drafted = self.draft_step(prefix, m, stop=stop) if self._draft_takes_stop else self.draft_step(prefix, m)
        if isinstance(drafted, DraftTree):
            return drafted  # the stop rule cuts chains
        tokens, probs = draft_result(drafted)
        if probs is not None:
            j = confidence_cut(stop, probs, tokens)
            tokens, probs = tokens[:j], probs[:j]
        return tokens, probs

    def _context(self, prefix: torch.Tensor) -> Optional[int]:
        """The draft's context of ``prefix`` (``draft_step.context(prefix)``, an integer; ``None``
        for a draft without one)."""
        context_of = getattr(self.draft_step, "context", None)
        if not callable(context_of):
            return None
        c = context_of(prefix)
        if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, np.integer)):
            raise TypeError(f"draft_step.context must return an int, got {c!r}")
        return int(c)

    def _hindsight(self, prefix: torch.Tensor, emitted: int) -> Optional[bool]:
        """In a round that drafted nothing: :func:`specverify.adaptive.draft_hindsight`."""
        return draft_hindsight(self.draft_step, prefix.clone(), emitted)

    def _emitted(self, tokens: torch.Tensor, n_accepted: int, next_token: int) -> list:
        """The tokens a round appends: the accepted draft prefix, then the recovered/bonus token."""
        return tokens[:n_accepted].tolist() + [next_token]

    # -- tree rounds (the draft returned a DraftTree) ------------------------------------------
    def _verify_tree(self, target_probs, draft_probs, tokens, parents):
        """``(path, next_token)``: target_probs [N+1, V], draft_probs [N+1, V] or None, tokens/parents [N]."""
        if self.greedy:
            return verify_tree_greedy(target_probs, tokens, parents)
        return accept_tree(target_probs, draft_probs, tokens, parents, generator=self.generator)

    @staticmethod
    def _checked_depth(tree: DraftTree, max_depth: int) -> int:
        """The tree's depth, at most ``max_depth`` (the K asked) or a ``ValueError``."""
        depth = tree.depth()
        if depth > max_depth:
            raise ValueError(f"draft_step returned a tree of depth {depth}, asked for at most {max_depth}")
        return depth

    # -- the loop ------------------------------------------------------------------------
    def generate(self, prompt_ids, max_new: int = 128) -> torch.Tensor:
        """Return the prompt followed by ``max_new`` new tokens (fewer only at ``eos``).

        A round asks the draft for ``K`` tokens, the policy's choice capped at ``remaining - 1``
        (a fixed ``k``: ``min(k, remaining - 1)``), so that its ``n + 1`` emitted tokens never
        exceed what is still wanted: the draft is never asked for a token that could not be used
        and no verified token is discarded. ``K = 0`` (one token left, or the policy's choice) is a
        plain target step with no draft call.
        """
        prompt = torch.as_tensor(prompt_ids).reshape(-1).to(torch.int64)
        if int(max_new) != max_new or max_new < 0:
            raise ValueError(f"max_new must be a non-negative integer, got {max_new!r}")
        max_new = int(max_new)
        n0 = prompt.numel()
        buf = torch.empty(n0 + max_new, dtype=torch.int64)  # positions < n are never rewritten
        buf[:n0] = prompt
        n = n0
        stats = self.stats = DecodeStats(k=self.k)
        clock = self.clock
        if hasattr(self.policy, "begin"):
            self.policy.begin()  # a new sequence: an adaptive policy may discount what it learned before

        while n - n0 < max_new:
            remaining = max_new - (n - n0)
            asked, context = ask_policy(self.policy, remaining - 1, lambda: self._context(buf[:n].clone()),
                                        self._policy_takes_context)
            m = asked
            if not 0 <= m < remaining:
                raise ValueError(f"policy {self.policy!r} asked for {m} draft tokens, allowed 0..{remaining - 1}")
            prefix = buf[:n]  # each callback gets its own copy: writing to it changes no output
            draft_probs = None
            draft_s = 0.0
            tree = None  # a DraftTree when the draft returned one (then m counts its nodes)
            depth = None  # the tree's depth when the draft returned a tree, even an empty one
            if m > 0:
                t0 = clock()
                returned = self._draft(prefix.clone(), m)  # ([m], [m, V] or None) or a DraftTree
                draft_s = clock() - t0
                stats.draft_time += draft_s
                if isinstance(returned, DraftTree):
                    depth = self._checked_depth(returned, m)
                    if returned.n_nodes:
                        tree = returned
                        returned = (tree.tokens, tree.probs)  # [N], [N + 1, V] or None
                    else:
                        returned = (returned.tokens, None)  # an empty tree: a plain target step
                tokens, draft_probs = draft_result(returned)
                if tree is not None:
                    m = tree.n_nodes
                if tokens.numel() > m:
                    raise ValueError(f"draft_step returned {tokens.numel()} tokens, asked for at most {m}")
                if tree is None:
                    m = tokens.numel()  # a short proposal is fine: the round verifies what there is
                if m == 0:
                    draft_probs = None
            else:
                tokens = torch.empty(0, dtype=torch.int64)

            t0 = clock()
            if tree is None:
                target_probs = self.target_step(prefix.clone(), tokens.clone())  # [m+1, V]
            else:
                target_probs = self.target_step(prefix.clone(), tokens.clone(), tree.parents)  # [N+1, V]
            target_s = clock() - t0
            stats.target_time += target_s
            target_probs = score_rows(target_probs, "target_step returned target_probs", m + 1)
            if draft_probs is not None and m > 0:
                draft_rows = m if tree is None else m + 1
                draft_probs = score_rows(draft_probs, "draft_step returned probs", draft_rows)

            t0 = clock()
            if tree is None:
                n_acc, next_token = self._verify(target_probs, draft_probs, tokens)
            else:
                path, next_token = self._verify_tree(target_probs, draft_probs, tokens, tree.parents)
                path = torch.as_tensor(path, dtype=torch.int64).reshape(-1)
                n_acc = path.numel()
            stats.verify_time += clock() - t0

            if tree is None:
                new = self._emitted(tokens, int(n_acc), int(next_token))
            else:
                new = tokens[path].tolist() + [int(next_token)]
                stats.tree_rounds += 1
            if self.eos_token_id is not None and self.eos_token_id in new:
                new = new[: new.index(self.eos_token_id) + 1]
            buf[n : n + len(new)] = torch.as_tensor(new, dtype=torch.int64)
            n += len(new)
            stats.drafted.append(m)
            stats.accepted.append(int(n_acc))
            stats.emitted.append(len(new))
            stats.asked.append(asked)
            hindsight = self._hindsight(prefix, new[0]) if asked == 0 else None
            self.policy.observe(RoundRecord(asked, m, int(n_acc), draft_s, target_s, depth, context, hindsight))
            if self.eos_token_id is not None and new and new[-1] == self.eos_token_id:
                break
        return buf[:n].clone()


# -- what the callbacks return, checked at the boundary ----------------------------------------

def _described(x) -> str:
    """What a callback returned, for an error message: its type, and shape/dtype or a short repr."""
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{type(x).__name__} of shape {list(shape)} and dtype {dtype}"
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def draft_result(returned) -> Tuple[torch.Tensor, Optional[object]]:
    """``(tokens [j] int64 tensor, probs or None)`` from what ``draft_step`` returned.

    Token ids must be integers in a 1-D sequence (list, array or tensor; booleans, floats, complex
    numbers, strings, nested lists and ids outside int64 are refused rather than cast); anything
    else raises TypeError/ValueError/IndexError naming draft_step and what it returned.
    """
    if not (isinstance(returned, (tuple, list)) and len(returned) == 2):
        raise TypeError(f"draft_step must return a pair (tokens, probs or None), got {_described(returned)}")
    tokens, probs = returned
    try:
        tokens = _inputs.tokens_int64(tokens, "tokens")
    except (TypeError, ValueError, IndexError) as error:
        raise type(error)(f"draft_step returned unusable tokens ({_described(tokens)}): {error}") from None
    return torch.as_tensor(tokens), probs


def score_rows(rows, what: str, n_rows: int):
    """``rows`` if it is a 2-D ``[n_rows, V]`` array-like (tensor, array or nested list, which
    the ops accept), else a TypeError/ValueError saying what the callback returned."""
    if rows is None or isinstance(rows, (str, bytes)):
        raise TypeError(f"{what} {_described(rows)}, expected [{n_rows}, V] scores")
    shape = getattr(rows, "shape", None)
    if shape is None:
        try:
            shape = np.shape(rows)
        except ValueError:  # ragged nested lists
            raise TypeError(f"{what} {_described(rows)}, expected [{n_rows}, V] scores") from None
    if len(shape) != 2 or shape[0] != n_rows:
        raise ValueError(f"{what} of shape {list(shape)}, expected [{n_rows}, V]")
    return rows
