"""The planner over prompt lookup and the learned draft (specverify.integrations.learned_draft.planned_draft), on the tiny
random Llama of test_learned_draft: the decoder's joint law equals the target's (chi-square on counts
of whole continuations, alpha = 1e-6, fixed seeds) with the planner choosing
among the lookup, the learned chain gated position by position (through LearnedDraft's ``gate``) and
nothing; greedy output equals plain greedy decoding of the target."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import specverify as sv  # noqa: E402
from specverify import law, stats as st  # noqa: E402
from specverify.integrations import learned_draft as ld  # noqa: E402
from specverify.integrations.transformers import PromptLookupDraft  # noqa: E402

from test_learned_draft import ALPHA, PROMPT, RUNS, _continuation_counts, tiny  # noqa: E402,F401

# a CPU's shape: the 2-token pass dearest per token; a learned draft row ~0.1 of a pass
COSTS = law.MeasuredCosts((1.0, 1.3, 1.35, 1.4), {"lookup": (0.0, 0.0), "learned": (0.1, 0.2)})


def _planned(head, target, generator=None):
    return ld.planned_draft(head, target, costs=COSTS, generator=generator, k_max=2,
                                 lookup=PromptLookupDraft(max_ngram=2), explore_every=4)


def test_planned_learned_draft_preserves_the_joint_law(tiny):
    model, head = tiny  # token-wise here; block verification under the planner: tests/decoding/test_planner.py
    counts, rounds, exact, planner = _continuation_counts(model, head, RUNS, "token", draft_cls=_planned, k="auto")
    assert (exact[counts > 0] > 0).all()
    res = st.chisquare_counts(counts, exact)
    assert res.dof >= 5 and rounds > 1.2, (res, rounds)
    assert res.pvalue > ALPHA, res
    assert {None, "lookup", "learned"} <= set(planner.choices), planner.choices  # every kind of round ran


def test_planned_greedy_is_plain_greedy(tiny):
    model, head = tiny
    draft, target = ld.learned_callbacks(model, head, costs=COSTS, greedy=True)  # the default: the planner
    dec = sv.SpeculativeDecoder(draft, target, k=2, greedy=True)
    out = dec.generate(torch.tensor(PROMPT), max_new=24).tolist()
    seq = list(PROMPT)
    with torch.inference_mode():
        for _ in range(24):
            seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    assert out == seq and draft.choices, draft.choices
