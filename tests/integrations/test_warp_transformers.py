"""sv.warp against transformers' warpers: the same kept tokens except at explained boundaries.

transformers (``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``,
``MinPLogitsWarper``, applied in that order) and ``sv.warp`` state the same cuts but round
differently: transformers divides by the temperature and sums probabilities in float32 in
ascending order (after a sort whose order among ties is unspecified), and keeps every token
tied with the k-th; sv.warp keeps exactly k (ties by index) and sums exact fixed-point masses.
So the kept sets may differ only

- "tie": the differing token's scaled logit equals that of a token on the other side of the cut;
- "rounding": its exact (float64) position is within ``TOLERANCE`` of the cut: the mass before
  it within TOLERANCE of top_p, or its probability within TOLERANCE (relative) of
  ``min_p * max``.

Every differing token of thousands of rows is classified; the test fails on any unexplained one,
on rounding differences in more than 1% of the rows, and on ties outside the integer-valued
third of the rows (where they are the rule).  The counts are printed (pytest -s).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
logits_process = pytest.importorskip("transformers.generation.logits_process")

import specverify as sv  # noqa: E402
from specverify.integrations.transformers import transformers_warpers  # noqa: E402

from test_real_model import tiny  # noqa: E402, F401 (the tiny random Llama fixture)
from test_warp import logit_rows  # noqa: E402

ROWS = 2000
VOCAB = 1000
TOLERANCE = 1e-5
SETTINGS = [
    dict(temperature=0.7, top_k=50),
    dict(top_k=5),
    dict(top_p=0.9),
    dict(temperature=1.3, top_p=0.5),
    dict(top_k=50, top_p=0.9),
    dict(min_p=0.05),
    dict(temperature=0.8, min_p=0.2),
]


def transformers_keep(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """``(scaled logits, kept)`` from transformers' warpers, ``[n, V]`` each."""
    scores = torch.from_numpy(logits)
    scaled = logits_process.TemperatureLogitsWarper(float(temperature))(None, scores)
    kept = torch.isfinite(transformers_warpers(temperature, top_k, top_p, min_p)(None, scores))
    return scaled.numpy(), kept.numpy()


def classify(scaled, theirs, ours, settings):
    """Why the kept sets of one row differ: 'tie', 'rounding' or 'unexplained' per token."""
    reasons = []
    differ = np.flatnonzero(theirs != ours)
    kept_either = theirs | ours
    for j in differ:
        others = np.flatnonzero(kept_either & (theirs == ours))  # tokens both agree on
        tied = np.any(scaled[others] == scaled[j]) or np.sum(scaled[differ] == scaled[j]) > 1
        if settings.get("top_k") and tied:
            reasons.append("tie")
            continue
        p = np.exp(scaled.astype(np.float64) - scaled.max())
        if settings.get("top_k"):  # top-p sees the top-k survivors (transformers keeps ties)
            kth = np.sort(scaled)[::-1][min(settings["top_k"], scaled.size) - 1]
            p = np.where(scaled >= kth, p, 0.0)
        p /= p.sum()
        if settings.get("top_p", 1.0) < 1.0:
            before = p[p > p[j]].sum()
            if tied or abs(before - settings["top_p"]) <= TOLERANCE:
                reasons.append("tie" if tied else "rounding")
                continue
        if settings.get("min_p", 0.0) > 0.0:
            if abs(p[j] / p.max() - settings["min_p"]) <= TOLERANCE * settings["min_p"]:
                reasons.append("rounding")
                continue
        reasons.append("unexplained")
    return reasons


def agreement_counts(settings, ours_settings=None):
    """Kept-set differences between transformers and sv.warp over the test rows, by reason."""
    rng = np.random.default_rng(40)
    x = np.vstack([logit_rows(rng, ROWS // len(KINDS), VOCAB, kind) for kind in KINDS])
    # Keep every logit within 60 / temperature of its row's maximum: no probability underflows
    # on either side, so "kept" means the same thing (finite for transformers, > 0 here).
    x = np.maximum(x, x.max(axis=1, keepdims=True) - 60.0 * min(1.0, settings.get("temperature", 1.0)))
    scaled, theirs = transformers_keep(x, **settings)
    ours = sv.warp(x, **(ours_settings or settings)) > 0
    counts = {"rows": x.shape[0], "tie_rows": 0, "rounding_rows": 0, "tie": 0, "rounding": 0,
              "unexplained": 0}
    for i in np.flatnonzero((theirs != ours).any(axis=1)):
        reasons = classify(scaled[i], theirs[i], ours[i], settings)
        for reason in reasons:
            counts[reason] += 1
        counts["rounding_rows" if "rounding" in reasons else "tie_rows"] += 1
    return counts


KINDS = ["normal", "zipf", "ties"]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_kept_tokens_agree_with_transformers(settings):
    counts = agreement_counts(settings)
    print(settings, counts)
    assert counts["unexplained"] == 0, counts
    assert counts["rounding_rows"] <= 0.01 * counts["rows"], counts
    # Exact ties at a cut need equal logits: the integer-valued third of the rows.
    assert counts["tie_rows"] <= counts["rows"] // len(KINDS), counts


@pytest.mark.parametrize("settings, ours", [
    (dict(top_p=0.9), dict(top_p=0.89)),
    (dict(top_k=50), dict(top_k=51)),
    (dict(min_p=0.05), dict(min_p=0.055)),
], ids=["top_p", "top_k", "min_p"])
def test_the_agreement_test_rejects_a_shifted_cut(settings, ours):
    assert agreement_counts(settings, ours)["unexplained"] > 0


# -- the transformers integration ---------------------------------------------------------------
def test_sampling_rows_and_the_processor_are_sv_warp():
    from specverify.integrations.transformers import Sampling, WarpLogitsProcessor

    logits = 3 * torch.randn(4, 300, generator=torch.Generator().manual_seed(1))
    settings = dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02)
    want = sv.warp(logits, **settings)
    assert torch.equal(Sampling(greedy=False, **settings).rows(logits), want)
    scores = WarpLogitsProcessor(**settings)(None, logits)
    assert torch.equal(torch.isfinite(scores), want > 0)
    torch.testing.assert_close(torch.softmax(scores, dim=-1), want)
    with pytest.raises(ValueError, match="top_p"):
        WarpLogitsProcessor(top_p=0.0)


def test_generate_with_the_processor(tiny):
    from transformers import LogitsProcessorList

    from specverify.integrations.transformers import WarpLogitsProcessor

    prompt = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(2))
    plain = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=20, pad_token_id=0)
    greedy = tiny.generate(prompt, do_sample=False, max_new_tokens=20, pad_token_id=0)
    # top_k = 1 keeps the first argmax only: sampling is then greedy decoding.
    torch.manual_seed(3)
    out = tiny.generate(prompt, logits_processor=LogitsProcessorList([WarpLogitsProcessor(top_k=1)]), **plain)
    assert torch.equal(out, greedy)
    # top-p: every sampled token lies in its step's kept set.
    torch.manual_seed(4)
    out = tiny.generate(prompt, logits_processor=LogitsProcessorList([WarpLogitsProcessor(top_p=0.5)]),
                        return_dict_in_generate=True, output_scores=True, **plain)
    chosen = out.sequences[0, prompt.shape[1]:]
    kept = torch.stack([torch.isfinite(s[0]) for s in out.scores])  # [20, V]
    assert kept[torch.arange(20), chosen].all()
    assert (kept.sum(dim=1) < 97).all()  # top-p 0.5 did cut
