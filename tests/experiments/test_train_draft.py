"""``experiments.end_to_end.train_draft``'s prompts and reduced vocabulary (no model).

The draft is judged on held-out prompts (:mod:`experiments.end_to_end.real_model`'s sets): the
training prompts must not copy them, neither an instruction (no four consecutive words of a
template occur in a held-out prompt) nor a subject of the everyday requests.
"""

import random
import re

import pytest

from experiments.end_to_end import real_model, train_draft

HELD_OUT = {**real_model.PROMPTS, **real_model.HELDOUT_PROMPTS, **real_model.HELDOUT_PROMPTS_2,
            **real_model.LONG_PROMPTS}
TEMPLATES = (train_draft.CODE_TEMPLATES + train_draft.TEXT_TEMPLATES + train_draft.TOPIC_TEMPLATES
             + train_draft.CHAT_TEMPLATES + train_draft.TASK_TEMPLATES + train_draft.DOC_TEMPLATES)


def _four_grams(text):
    words = re.findall(r"[a-z']+", text.lower())
    return {tuple(words[i : i + 4]) for i in range(len(words) - 3)}


@pytest.mark.parametrize("template", TEMPLATES)
def test_no_template_copies_a_held_out_instruction(template):
    pieces = re.split(r"\{\w+\}", template)  # the placeholders are filled with other text
    grams = set().union(*map(_four_grams, pieces))
    for name, prompt in HELD_OUT.items():
        assert not grams & _four_grams(prompt), (name, template)


def test_no_everyday_subject_is_a_held_out_one():
    for subject in train_draft.SUBJECTS:
        for name, prompt in HELD_OUT.items():
            assert not re.search(r"\b" + re.escape(subject) + r"\b", prompt, re.I), (subject, name)


def test_the_prompt_mix():
    pieces = {"code": ["def f(x):\n    return x\n"], "text": ["A paragraph of prose about nothing in particular."],
              "topic": ["release notes"]}
    counts = {}
    rng = random.Random(0)
    for _ in range(200):
        prompt = train_draft._task_prompt(rng, pieces)
        assert "{" not in prompt.split("```")[0] and prompt.strip()
    prompts, sources = train_draft.build_prompts(56, seed=1, max_files=200)
    counts = sources["prompts"]
    assert len(prompts) == 56 and set(counts) >= {"chat", "task"}
    assert counts["chat"] + counts["task"] >= len(prompts) / 2  # everyday requests and tasks: over half
    assert all("{" not in p[:20] for p in prompts)


def test_reduced_vocabulary_ranks_the_answers_first():
    torch = pytest.importorskip("torch")

    def rows(*seqs):
        return [(torch.tensor(s, dtype=torch.int32), None) for s in seqs]

    answers = rows([1, 1, 1, 2, 2, 3])
    documents = rows([7] * 50 + [3] * 5 + [2])
    ids, coverage = train_draft.reduced_vocabulary(answers, documents, 3, always=[9])
    assert ids.tolist() == [1, 2, 9]  # 9 always; then the answers' most frequent, not the documents' 7
    assert coverage == pytest.approx(5 / 6)  # of the answers' tokens
    ids, _ = train_draft.reduced_vocabulary(answers, documents, 5, always=[9])
    assert ids.tolist() == [1, 2, 3, 7, 9]  # the documents fill the rest (3 ties with 2 broken by them)
