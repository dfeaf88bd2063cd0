"""Rounds of verification on synthetic rows, and the statistics of their accepted lengths.

One experiment = one fixed target/draft pair (``[k+1, V]`` / ``[k, V]`` rows from
:mod:`experiments.law.synthetic`), ``rounds`` fresh draft-token draws (``t_i ~ q_i``) and one call of
``sv.accept`` (or ``sv.verify_greedy``) per round. The accepted length ``N`` of a round then
follows the analytic law exactly: ``P(N >= n) = a_0 ... a_{n-1}`` with ``a_i`` the per-position
acceptance, so the histogram of ``N`` can be tested against ``sv.law.accepted_length_pmf(a)``.

Randomness: one ``numpy.random.SeedSequence`` per experiment, spawned into three generators
(rows, draft tokens, verification uniforms). No global random state is read or written.

``variant`` deliberately breaks the verification for power checks:

``wrong_row``       the target rows are passed shifted by one (position i tested against row i+1)
``no_draft_probs``  the draft's probabilities are dropped (``accept`` then treats the draft as a
                    point mass and accepts ``t_i`` with probability ``p_i(t_i)``)
``tokens_from_target``  the draft tokens are drawn from the target rows instead of the draft rows
                    that ``accept`` is told about (a subtle mismatch: acceptance becomes
                    ``E_p[min(1, p/q)]`` instead of ``sum min(p, q)``)
``warp_mismatch``   ``accept`` is told the draft rows at a 10% higher temperature than the ones
                    its tokens were drawn from (``q ** (1/1.1)``, renormalized): the caller's
                    contract of identically warped distributions broken, mildly
"""

from __future__ import annotations

import time
from typing import Sequence, Union

import numpy as np

from .. import stats as st
from . import synthetic

VARIANTS = ("correct", "wrong_row", "no_draft_probs", "tokens_from_target", "warp_mismatch")
WARP_MISMATCH = 1.1  # temperature ratio of the draft rows handed to accept in "warp_mismatch"
Seed = Union[int, Sequence[int]]


def generators(seed: Seed, n: int = 3) -> list:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]


def verify_rounds(target: np.ndarray, draft: np.ndarray, tokens: np.ndarray, *, greedy: bool,
                  generator: np.random.Generator, variant: str = "correct", progress: bool = False):
    """Run one verification per row of ``tokens`` ``[rounds, k]``.

    Returns ``(accepted [rounds] int64, emitted [rounds] int64)``: the accepted length and the
    emitted (recovered or bonus) token of every round.
    """
    import specverify as sv

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    if variant == "wrong_row":
        target = np.ascontiguousarray(np.concatenate([target[1:], target[-1:]]))
    probs = None if variant == "no_draft_probs" else draft
    if variant == "warp_mismatch":
        w = np.asarray(draft, dtype=np.float64) ** (1.0 / WARP_MISMATCH)
        probs = np.ascontiguousarray(w / w.sum(axis=1, keepdims=True), dtype=np.float32)
    rounds = tokens.shape[0]
    accepted = np.empty(rounds, dtype=np.int64)
    emitted = np.empty(rounds, dtype=np.int64)
    it = range(rounds)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="rounds", unit="round", leave=False, mininterval=0.5)
    for r in it:
        if greedy:
            n, nxt = sv.verify_greedy(target, tokens[r])
        else:
            n, nxt = sv.accept(target, probs, tokens[r], generator=generator)
        accepted[r] = n
        emitted[r] = nxt
    return accepted, emitted


def law_for(pair: synthetic.Pair, greedy: bool) -> np.ndarray:
    """The law's per-position acceptance ``a`` ``[k]`` for this pair and verification mode."""
    import specverify as sv

    if greedy:
        return synthetic.acceptance(pair.target, pair.draft, "greedy")
    return np.asarray(sv.law.acceptance_rates(pair.target, pair.draft), dtype=np.float64)


def analyze(accepted: np.ndarray, a: np.ndarray, min_expected: float = st.MIN_EXPECTED) -> dict:
    """Empirical vs analytic statistics of accepted lengths ``accepted`` under acceptance ``a``."""
    import specverify as sv

    a = np.asarray(a, dtype=np.float64)
    k = a.size
    pmf = np.asarray(sv.law.accepted_length_pmf(a), dtype=np.float64)
    law_mean = float(sv.law.mean_accepted(a))
    law_var = float(sv.law.var_accepted(a))
    counts = st.histogram(accepted, k)
    n = int(counts.sum())
    mean = float(np.mean(accepted))
    chi = st.chisquare_counts(counts, pmf, min_expected)
    return {
        "rounds": n,
        "counts": counts.tolist(),
        "law_pmf": pmf.tolist(),
        "law_mean": law_mean,
        "law_var": law_var,
        "emp_mean": mean,
        "se": float(np.sqrt(law_var / n)),
        "z": st.zscore(mean, n, law_mean, law_var),
        "chi2": chi.statistic,
        "chi2_dof": chi.dof,
        "chi2_p": chi.pvalue,
        "chi2_bins": chi.n_bins,
        "tv": st.tv_distance(counts, pmf),
        "acc_law": a.tolist(),
        "acc_emp": st.positionwise_acceptance(counts).tolist(),
    }


def run(k: int, vocab: int, rounds: int, seed: Seed, *, acceptance: float | None = 0.68,
        mismatch: float | None = None, family: str | None = None,
        temperature: float = synthetic.TEMPERATURE, greedy: bool = False, variant: str = "correct",
        progress: bool = False) -> dict:
    """One complete experiment. Returns a dict of per-round arrays and their statistics.

    ``acceptance`` (calibrated) or ``mismatch`` (the family's knob) sets the draft's quality;
    ``family`` defaults to ``noise`` (``argmax`` in greedy mode, see :mod:`experiments.law.synthetic`).
    """
    if family is None:
        family = "argmax" if greedy else "noise"
    if mismatch is not None:
        acceptance = None
    mode = "greedy" if greedy else "sample"
    g_rows, g_draft, g_verify = generators(seed)
    t0 = time.perf_counter()
    pair = synthetic.make_pair(g_rows, k, vocab, acceptance_target=acceptance, knob=mismatch,
                               family=family, mode=mode, temperature=temperature)
    proposal = pair.target[:k] if variant == "tokens_from_target" else pair.draft
    tokens = synthetic.sample_tokens(proposal, rounds, g_draft)
    t1 = time.perf_counter()
    accepted, emitted = verify_rounds(pair.target, pair.draft, tokens, greedy=greedy,
                                      generator=g_verify, variant=variant, progress=progress)
    t2 = time.perf_counter()
    a = law_for(pair, greedy)
    out = analyze(accepted, a)
    out.update(
        family=family, knob=pair.knob, mode=mode, variant=variant,
        setup_s=t1 - t0, verify_s=t2 - t1, us_per_round=1e6 * (t2 - t1) / max(rounds, 1),
        accepted=accepted, emitted=emitted, draft_tokens=tokens,
    )
    return out
