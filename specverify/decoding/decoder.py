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

A draft may also return a *tree* (:class:`specverify.decoding.tree_drafts.DraftTree`: ``tokens [N]``,
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

import inspect
import numbers
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import torch

from ..kernels import _inputs
from ..verify import accept, accept_block, accept_tree, verify_greedy, verify_tree_greedy
from .adaptive import AdaptiveK, FixedK, RoundRecord, ask_policy, confidence_cut, draft_hindsight, takes_keyword
from .planner import Planner
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
    def longest_proposal(self) -> int:
        """The longest accepted length the rounds could have had, ``min(k, max(drafted))`` (0
        before any round). The histograms are sized by it, not by the cap ``k``, which may be
        huge (``k = 10**12`` means "never cut by the policy")."""
        return min(self.k, max(self.drafted, default=0))

    @property
    def accepted_histogram(self) -> np.ndarray:
        """Counts of accepted lengths ``n = 0 .. longest_proposal`` over the rounds, shape
        ``[longest_proposal + 1]`` (``[k + 1]`` once a round proposed ``k`` tokens).

        Rounds that proposed fewer than ``k`` tokens (near ``max_new``) are included; see
        :attr:`full_rounds_histogram` for rounds of exactly ``k`` proposals only.
        """
        return np.bincount(np.asarray(self.accepted, dtype=np.int64), minlength=self.longest_proposal + 1)

    @property
    def full_rounds_histogram(self) -> np.ndarray:
        """Accepted-length counts over rounds that proposed all ``k`` tokens, shape
        ``[longest_proposal + 1]`` like :attr:`accepted_histogram`."""
        acc = np.asarray(self.accepted, dtype=np.int64)
        full = np.asarray(self.drafted, dtype=np.int64) == self.k
        return np.bincount(acc[full], minlength=self.longest_proposal + 1)

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
        May instead return a :class:`~specverify.decoding.tree_drafts.DraftTree` of depth ``<= k`` (any
        node count); its ``probs`` is ``[N + 1, V]`` or ``None`` (deterministic children).
    target_step : callable ``(prefix, proposed) -> target_probs``
        ``proposed`` is a 1-D int64 tensor of ``m`` draft tokens (``0 <= m <= k``); returns
        ``[m + 1, V]`` rows, row ``i`` scoring the position after ``prefix + proposed[:i]``.
        Only the argmax of each row is read in greedy mode. Rows need not be normalized.
        For a tree draft it is called as ``target_step(prefix, tokens, parents)`` and returns
        ``[N + 1, V]`` rows (row 0 after the prefix, row ``i + 1`` after node ``i``'s path).
    k : int, ``"auto"`` or a draft-length policy
        An int: draft tokens asked for per round (fewer in the last rounds, see
        :meth:`generate`). ``"auto"``: :class:`specverify.decoding.adaptive.AdaptiveK` (each round's K
        maximizes the modelled speed-up, learned from past rounds and this decoder's timings;
        with a tree draft, K is the tree's depth and a round is priced by the nodes it scores).
        Or any policy of :mod:`specverify.decoding.adaptive` (``FixedK(4, confidence_threshold=0.4)``,
        ``AdaptiveK(...)``): it may also stop drafting early on the draft's confidence. With a
        :class:`~specverify.decoding.planner.Planner` as ``draft_step``, the planner is the policy
        too: each round proposes the candidate and length (or nothing) with the most expected
        tokens per unit of measured cost, up to its ``k_max`` (``"auto"``) or ``k`` (an int). A
        ``draft_step`` that accepts a ``stop`` keyword receives the policy's stop rule
        ``stop(i, confidence) -> bool`` and should stop after token ``i`` when it says so;
        otherwise the decoder cuts the returned proposal itself (from ``probs``; a ``None``
        ``probs`` is a point mass, confidence 1). A ``draft_step`` with a ``context(prefix)``
        method (:class:`~specverify.integrations.transformers.PromptLookupDraft`: its match
        order, and whether later text contradicted the match) gives each round's context, before
        drafting, to a policy whose ``draft_length`` takes a ``context`` keyword; the round's
        :class:`~specverify.decoding.adaptive.RoundRecord` carries it. A ``draft_step`` with a
        ``first_token(prefix)`` method (the token its proposal would start with, or ``None``) is
        asked it in rounds that draft nothing, and the record says whether it was the token
        emitted (``hindsight``). Policies that only see the draft side and past rounds keep
        verification exact (proof in :mod:`specverify.decoding.adaptive`).
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
    eos_token_id : int or sequence of int, optional
        Stop right after any of these tokens is emitted: an int, or a list, tuple, set, array or
        tensor of ints (the forms of ``generation_config.eos_token_id``). ``None`` or empty: no stop.
    clock : callable, optional
        Seconds for the timings in ``stats`` (and those an adaptive policy learns from);
        default ``time.perf_counter`` (wall clock). ``time.process_time`` counts this process's
        CPU time only, which a shared machine's load disturbs far less (with one torch thread it
        is the wall time of an idle machine).

    After :meth:`generate`, ``stats`` (a :class:`DecodeStats`) holds the run's rounds,
    accepted-length histogram, per-round acceptance, tokens per round and timings. It is the
    statistics of the *most recently started* call (filled in as it runs, so after an interruption
    it holds the rounds that completed); ``generate(..., return_stats=True)`` returns each call's
    own, which is what a decoder shared by threads or re-entered from a callback needs.

    Accepted argument types (anything else raises a TypeError/ValueError naming the argument):
    ``k`` and ``max_new`` are integers (any integral type but bool: floats, even ``4.0``, inf,
    NaN and None are refused rather than cast); ``greedy`` is a bool; token ids (the prompt,
    ``eos_token_id``, draft tokens) are integers, never floats or booleans; ``prompt_ids`` is one
    sequence, ``[L]`` or ``[1, L]`` with ``L >= 1`` (a ``[B > 1, L]`` batch is refused); ``clock``
    returns a number. Token ids are checked to be ``>= 0`` always, and ``< V`` where the
    vocabulary is known: from ``target_step.vocab_size`` if the target has one (the transformers
    callbacks do), else from the draft's ``probs`` and the target's rows once seen. A draft's
    output is validated (type, shape, token range) before the target is called. Callbacks with a
    boolean ``greedy`` attribute (the transformers callbacks) must agree with the decoder's mode.

    Thread-safety: :meth:`generate` keeps its sequence, buffers and statistics local to the call,
    so a decoder is exactly as thread-safe as its callbacks and its policy. :class:`FixedK` holds
    no state; :class:`AdaptiveK` learns from every round it observes, unsynchronized, so threads
    sharing one mix (and may corrupt) its estimates; the transformers callbacks follow one
    sequence's KV cache and raise a RuntimeError when two threads use one pair at once. Build one
    decoder and one callbacks pair per thread (they may share the models' weights).

    Recovery after interruption: an exception or ``KeyboardInterrupt`` raised inside a callback or
    the policy propagates out of :meth:`generate` and leaves the decoder as it was, except for
    ``stats`` (the completed rounds) and the policy's estimates (updated only by completed
    rounds); the next call starts afresh. Callbacks that keep state across calls must recover
    theirs: the transformers callbacks do (an interrupted forward drops the KV cache, which the
    next call rebuilds).
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
        planning = isinstance(draft_step, Planner)
        cap = None  # an int k with a Planner: the longest proposal of any round
        if isinstance(k, str):
            if k != "auto":
                raise ValueError(f"k must be a positive integer, 'auto' or a policy, got {k!r}")
            k = draft_step if planning else AdaptiveK()
        elif planning and k is not draft_step:
            if hasattr(k, "draft_length"):
                raise ValueError(f"k must be 'auto' or an integer when draft_step is a Planner (it is the policy: "
                                 f"it chooses each round's proposal), got the policy {k!r}")
            cap = _inputs.whole_number(k, "k", 1)
            k = draft_step
        elif not hasattr(k, "draft_length"):
            k = FixedK(k)  # k is checked there: an integer >= 1
        self.policy = k
        if not isinstance(method, str) or method not in self.METHODS:
            raise ValueError(f"method must be one of {sorted(self.METHODS)}, got {method!r}")
        if not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds (e.g. time.perf_counter), got {clock!r}")
        self.draft_step = draft_step
        self.target_step = target_step
        self.k = _inputs.whole_number(k.k_max, f"policy {k!r}: k_max", 1)
        if cap is not None:
            self.k = min(self.k, cap)
        self._draft_takes_stop = takes_keyword(draft_step, "stop")
        self._policy_takes_context = takes_keyword(k.draft_length, "context")
        self._target_takes_parents = _takes_positional(target_step, 3)
        self.greedy = _inputs.flag(greedy, "greedy")
        for name, step in (("draft_step", draft_step), ("target_step", target_step)):
            _check_mode(name, step, self.greedy)
        self.generator = generator
        self.eos_token_ids = _inputs.token_ids(eos_token_id, "eos_token_id")  # () for none
        ids = self.eos_token_ids
        self.eos_token_id = None if not ids else ids[0] if len(ids) == 1 else ids
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
        """``(tokens [j], probs [j, V] or None)``, j <= m, validated (:func:`draft_result`,
        :func:`draft_rows`, token ids in ``[0, V)`` of ``probs``) *before* the policy's draft-side
        stop rule reads them, then cut by it; or the draft's
        :class:`~specverify.decoding.tree_drafts.DraftTree`, uncut (:meth:`_proposal` checks it)."""
        stop = self.policy.stop
        # a draft that takes the rule stops early (saving its own passes); the cut below is then a no-op
        if stop is not None and self._draft_takes_stop:
            drafted = self.draft_step(prefix, m, stop=stop)
        else:
            drafted = self.draft_step(prefix, m)
        if stop is None or isinstance(drafted, DraftTree):
            return drafted  # the stop rule cuts chains; _proposal validates what is returned
        tokens, probs = draft_result(drafted)
        if tokens.numel() > m:
            raise ValueError(f"draft_step returned {tokens.numel()} tokens, asked for at most {m}")
        if probs is not None and tokens.numel():
            probs = draft_rows(probs, tokens.numel())
            check_draft_tokens(tokens, _width(probs), "position")
            j = confidence_cut(stop, probs, tokens)
            tokens, probs = tokens[:j], probs[:j]
        return tokens, probs

    def _proposal(self, drafted, m: int, vocab: Optional[int]):
        """``(tokens, probs or None, tree or None, depth or None)`` from what :meth:`_draft`
        returned for a round asking for ``m`` tokens, validated before the target sees it: token
        ids integers in ``[0, V)``, ``V`` the known ``vocab`` or the width of ``probs``. A chain:
        ``tokens [j]`` (``j <= m``), ``probs [j, V]``. A tree of depth ``<= m``: its ``tokens [N]``,
        ``probs [N + 1, V]``, the tree and its depth (an empty tree: no tokens, depth 0)."""
        if isinstance(drafted, DraftTree):
            depth = self._checked_depth(drafted, m)
            if not drafted.n_nodes:
                return drafted.tokens, None, None, depth  # an empty tree: a plain target step
            probs = None if drafted.probs is None else draft_rows(drafted.probs, drafted.n_nodes + 1)
            check_draft_tokens(drafted.tokens, vocab if vocab is not None else _width(probs), "node")
            return drafted.tokens, probs, drafted, depth
        tokens, probs = draft_result(drafted)
        if tokens.numel() > m:
            raise ValueError(f"draft_step returned {tokens.numel()} tokens, asked for at most {m}")
        if tokens.numel() == 0:
            return tokens, None, None, None
        if probs is not None:
            probs = draft_rows(probs, tokens.numel())
        check_draft_tokens(tokens, vocab if vocab is not None else _width(probs), "position")
        return tokens, probs, None, None

    def _now(self) -> float:
        """``clock()``, checked to be a number of seconds."""
        t = self.clock()
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Real):
            raise TypeError(f"clock must return a number of seconds, got {t!r} from {self.clock!r}")
        return t

    def _known_vocab(self) -> Optional[int]:
        """``target_step.vocab_size`` (checked) if the target has one, else ``None``."""
        vocab = getattr(self.target_step, "vocab_size", None)
        return None if vocab is None else _inputs.whole_number(vocab, "target_step.vocab_size", 1)

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
        """In a round that drafted nothing: :func:`specverify.decoding.adaptive.draft_hindsight`."""
        return draft_hindsight(self.draft_step, prefix.clone(), emitted)

    def _emitted(self, tokens: torch.Tensor, n_accepted: int, next_token: int) -> list:
        """The tokens a round appends: the accepted draft prefix, then the recovered/bonus token."""
        return tokens[:n_accepted].tolist() + [next_token]

    # -- tree rounds (the draft returned a DraftTree) ------------------------------------------
    def _verify_tree(self, target_probs, draft_probs, tokens, parents, replacement=False):
        """``(path, next_token)``: target_probs [N+1, V], draft_probs [N+1, V] or None, tokens/parents [N];
        ``replacement``: the tree's children were drawn i.i.d. (:attr:`DraftTree.replacement`)."""
        if self.greedy:
            return verify_tree_greedy(target_probs, tokens, parents)
        return accept_tree(target_probs, draft_probs, tokens, parents, generator=self.generator, replacement=replacement)

    @staticmethod
    def _checked_depth(tree: DraftTree, max_depth: int) -> int:
        """The tree's depth, at most ``max_depth`` (the K asked) or a ``ValueError``."""
        depth = tree.depth()
        if depth > max_depth:
            raise ValueError(f"draft_step returned a tree of depth {depth}, asked for at most {max_depth}")
        return depth

    # -- the loop ------------------------------------------------------------------------
    def generate(self, prompt_ids, max_new: int = 128, *, return_stats: bool = False):
        """Return the prompt followed by ``max_new`` new tokens (fewer only at ``eos``).

        ``prompt_ids``: one sequence of integer token ids, ``[L]`` or ``[1, L]`` (``L >= 1``; a
        list, array or tensor). ``max_new``: an integer ``>= 0``; the output grows as it is
        emitted, so a huge ``max_new`` means "until eos" and allocates nothing up front.
        ``return_stats=True``: return ``(ids, stats)``, this call's own :class:`DecodeStats`.

        A round asks the draft for ``K`` tokens, the policy's choice capped at ``remaining - 1``
        (a fixed ``k``: ``min(k, remaining - 1)``), so that its ``n + 1`` emitted tokens never
        exceed what is still wanted: the draft is never asked for a token that could not be used
        and no verified token is discarded. ``K = 0`` (one token left, or the policy's choice) is a
        plain target step with no draft call.
        """
        prompt = prompt_tokens(prompt_ids)
        max_new = _inputs.whole_number(max_new, "max_new", 0)
        return_stats = _inputs.flag(return_stats, "return_stats")
        vocab = self._known_vocab()  # None until a callback shows it
        check_prompt_vocab(prompt, vocab)
        n0 = prompt.numel()
        buf = torch.empty(n0 + min(max_new, OUTPUT_CHUNK), dtype=torch.int64)  # positions < n are never rewritten
        buf[:n0] = prompt
        n = n0
        stats = self.stats = DecodeStats(k=self.k)
        eos = self.eos_token_ids
        if hasattr(self.policy, "begin"):
            self.policy.begin()  # a new sequence: an adaptive policy may discount what it learned before

        while n - n0 < max_new:
            remaining = max_new - (n - n0)
            asked, context = ask_policy(self.policy, min(remaining - 1, self.k), lambda: self._context(buf[:n].clone()),
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
                t0 = self._now()
                drafted = self._draft(prefix.clone(), m)  # ([j], [j, V] or None) or a DraftTree
                draft_s = self._now() - t0
                tokens, draft_probs, tree, depth = self._proposal(drafted, m, vocab)
                stats.draft_time += draft_s
                m = tokens.numel()  # a short proposal is fine: the round verifies what there is
            else:
                tokens = torch.empty(0, dtype=torch.int64)

            t0 = self._now()
            if tree is None:
                target_probs = self.target_step(prefix.clone(), tokens.clone())  # [m+1, V]
            else:
                if not self._target_takes_parents:
                    raise TypeError(
                        f"draft_step returned a DraftTree, and trees call target_step(prefix, tokens, parents), "
                        f"but target_step {self.target_step!r} takes (prefix, proposed) only: give it a third "
                        f"parameter (e.g. CausalLMTarget scores trees), or return chains")
                target_probs = self.target_step(prefix.clone(), tokens.clone(), tree.parents)  # [N+1, V]
            target_s = self._now() - t0
            stats.target_time += target_s
            target_probs = score_rows(target_probs, "target_step returned target_probs", m + 1)
            if vocab is None:  # the first rows: the vocabulary the prompt's ids must lie in
                vocab = int(np.shape(target_probs)[1])
                check_prompt_vocab(prompt, vocab)

            t0 = self._now()
            try:
                if tree is None:
                    n_acc, next_token = self._verify(target_probs, draft_probs, tokens)
                else:
                    path, next_token = self._verify_tree(target_probs, draft_probs, tokens, tree.parents,
                                                         bool(tree.replacement))
                    path = torch.as_tensor(path, dtype=torch.int64).reshape(-1)
                    n_acc = path.numel()
            except ValueError as error:
                if not self.greedy and "target_probs" in str(error) and "negative value" in str(error):
                    raise ValueError(
                        f"{error}. In sampling mode (greedy=False) target_step must return probabilities; "
                        f"negative scores are logits, which greedy callbacks return: build the callbacks "
                        f"for sampling (speculative_callbacks(..., greedy=False)) or decode with greedy=True"
                    ) from error
                raise
            stats.verify_time += self._now() - t0

            if tree is None:
                new = self._emitted(tokens, int(n_acc), int(next_token))
            else:
                new = tokens[path].tolist() + [int(next_token)]
                stats.tree_rounds += 1
            if eos:
                stop_at = next((i for i, t in enumerate(new) if t in eos), None)
                if stop_at is not None:
                    new = new[: stop_at + 1]
            if n + len(new) > buf.numel():  # grow geometrically, never past the prompt + max_new
                grown = torch.empty(min(n0 + max_new, max(n + len(new), 2 * buf.numel())), dtype=torch.int64)
                grown[:n] = buf[:n]
                buf = grown
            buf[n : n + len(new)] = torch.as_tensor(new, dtype=torch.int64)
            n += len(new)
            stats.drafted.append(m)
            stats.accepted.append(int(n_acc))
            stats.emitted.append(len(new))
            stats.asked.append(asked)
            hindsight = self._hindsight(prefix, new[0]) if asked == 0 else None
            # The first round's calls also read the prompt (a cached model catches up on it): not
            # what m tokens cost, so no policy learns it.
            if prefix.numel() == n0:
                draft_s = target_s = float("nan")
            self.policy.observe(RoundRecord(asked, m, int(n_acc), draft_s, target_s, depth, context, hindsight))
            if eos and new[-1] in eos:
                break
        out = buf[:n].clone()
        return (out, stats) if return_stats else out


OUTPUT_CHUNK = 256  # tokens of output room allocated up front; it doubles as the output grows


def _takes_positional(fn, count: int) -> bool:
    """Whether ``fn`` can be called with ``count`` positional arguments (True when unknown)."""
    try:
        inspect.signature(fn).bind(*([None] * count))
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): let the call decide
        return True
    return True


def _check_mode(name: str, step, greedy: bool) -> None:
    """A ValueError if the callback ``step`` declares (a boolean ``greedy`` attribute, as the
    transformers callbacks do) a mode other than the decoder's ``greedy``."""
    mode = getattr(step, "greedy", None)
    if isinstance(mode, (bool, np.bool_)) and bool(mode) != greedy:
        built, runs = ("greedy decoding (it returns raw logits)", "samples") if mode else ("sampling", "is greedy")
        raise ValueError(
            f"{name} was built for {built} but the decoder {runs} (greedy={greedy}): build the callbacks "
            f"with the decoder's mode, e.g. speculative_callbacks(model, draft, greedy={greedy})")


def prompt_tokens(prompt_ids) -> torch.Tensor:
    """``[L]`` int64 from ``prompt_ids`` ``[L]`` or ``[1, L]`` (list, array or tensor), ``L >= 1``.

    Token ids must be integers (booleans and floats are refused, as for draft tokens) and
    ``>= 0``; a ``[B > 1, L]`` batch raises (the decoder follows one sequence).
    """
    shape = getattr(prompt_ids, "shape", None)
    if shape is None and isinstance(prompt_ids, (list, tuple)):
        try:
            shape = np.shape(prompt_ids)
        except ValueError:  # ragged: tokens_int64 says what is wrong
            shape = None
    if shape is not None and len(shape) == 2:
        if shape[0] != 1:
            raise ValueError(
                f"prompt_ids has shape {list(shape)}, a batch of {shape[0]} sequences, but SpeculativeDecoder "
                f"decodes one sequence: call generate once per row (without its padding), or verify a "
                f"batch of requests' rounds with specverify.verify_batch")
        prompt_ids = prompt_ids[0]
    tokens = torch.as_tensor(_inputs.tokens_int64(prompt_ids, "prompt_ids"))
    if tokens.numel() == 0:
        raise ValueError("prompt_ids is empty: the decoder continues a sequence of at least one token "
                         "(e.g. the tokenizer's BOS token)")
    negative = torch.nonzero(tokens < 0)
    if negative.numel():
        i = int(negative[0, 0])
        raise ValueError(f"prompt_ids[{i}] = {int(tokens[i])} is negative: not a token id")
    return tokens


def check_prompt_vocab(prompt: torch.Tensor, vocab: Optional[int]) -> None:
    """An IndexError naming ``prompt_ids`` if an id is ``>= vocab`` (``None``: not known yet)."""
    if vocab is None:
        return
    outside = torch.nonzero(prompt >= vocab)
    if outside.numel():
        i = int(outside[0, 0])
        raise IndexError(f"prompt_ids[{i}] = {int(prompt[i])} is not a token id in [0, {vocab}) (the target's vocabulary)")


def check_draft_tokens(tokens: torch.Tensor, vocab: Optional[int], where: str) -> None:
    """An IndexError naming ``draft_step``, the position (or tree node) and the vocabulary size if a
    draft token is negative or (``vocab`` known) ``>= vocab``."""
    bad = (tokens < 0) if vocab is None else (tokens < 0) | (tokens >= vocab)
    found = torch.nonzero(bad)
    if found.numel():
        i = int(found[0, 0])
        span = "[0, V)" if vocab is None else f"[0, {vocab}) (V = {vocab})"
        raise IndexError(f"draft_step returned token {int(tokens[i])} at {where} {i}: not a token id in {span}")


def _width(rows) -> Optional[int]:
    """V of validated ``[n, V]`` rows, ``None`` for no rows."""
    return None if rows is None else int(rows.shape[1])


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


def draft_rows(probs, n_rows: int):
    """The draft's ``probs`` as validated float32 ``[n_rows, V]`` rows (:func:`score_rows` for the
    shape, then the ops' own dtype checks), or a TypeError/ValueError naming draft_step. Run
    before the confidence cut and before the target is called, so both see the same checks."""
    probs = score_rows(probs, "draft_step returned probs", n_rows)
    try:
        return _inputs.float_rows(probs, "draft_probs")
    except (TypeError, ValueError) as error:
        raise type(error)(f"draft_step returned unusable probs: {error}") from None


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
