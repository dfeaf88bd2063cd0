"""The learned draft's training, model-free: the prompts (``draft_prompts``), the reduced vocabulary and
the training loop (``draft_training``), the command's arguments (``train_draft``).

The draft is judged on held-out prompts (:mod:`experiments.end_to_end.prompt_sets`): the
training prompts must not copy them, neither an instruction (no four consecutive words of a
template occur in a held-out prompt) nor a subject of the everyday requests.
"""

import itertools
import random
import re

import pytest

from experiments.end_to_end import draft_data, draft_prompts, draft_training, prompt_sets, train_draft

HELD_OUT = {**prompt_sets.PROMPTS, **prompt_sets.HELDOUT_PROMPTS, **prompt_sets.HELDOUT_PROMPTS_2,
            **prompt_sets.LONG_PROMPTS}
TEMPLATES = (draft_prompts.CODE_TEMPLATES + draft_prompts.TEXT_TEMPLATES + draft_prompts.TOPIC_TEMPLATES
             + draft_prompts.CHAT_TEMPLATES + draft_prompts.TASK_TEMPLATES + draft_prompts.DOC_TEMPLATES)


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
    for subject in draft_prompts.SUBJECTS:
        for name, prompt in HELD_OUT.items():
            assert not re.search(r"\b" + re.escape(subject) + r"\b", prompt, re.I), (subject, name)


def test_the_prompt_mix():
    pieces = {"code": ["def f(x):\n    return x\n"], "text": ["A paragraph of prose about nothing in particular."],
              "topic": ["release notes"]}
    counts = {}
    rng = random.Random(0)
    for _ in range(200):
        prompt = draft_prompts._task_prompt(rng, pieces)
        assert "{" not in prompt.split("```")[0] and prompt.strip()
    prompts, sources = draft_prompts.build_prompts(56, seed=1, max_files=200)
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
    ids, coverage = draft_training.reduced_vocabulary(answers, documents, 3, always=[9])
    assert ids.tolist() == [1, 2, 9]  # 9 always; then the answers' most frequent, not the documents' 7
    assert coverage == pytest.approx(5 / 6)  # of the answers' tokens
    ids, _ = draft_training.reduced_vocabulary(answers, documents, 5, always=[9])
    assert ids.tolist() == [1, 2, 3, 7, 9]  # the documents fill the rest (3 ties with 2 broken by them)


# -- the command's arguments and the training loop's guards (model-free) -------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--noise", "nan"], "--noise: must be a finite number >= 0"),
    (["--noise", "inf"], "--noise: must be a finite number >= 0"),
    (["--noise", "-0.1"], "--noise"),
    (["--lr", "0"], "--lr: must be a finite number > 0 and < 1"),
    (["--lr", "nan"], "--lr"),
    (["--max-steps", "-1"], "--max-steps: must be an integer >= 0"),
    (["--epochs", "0"], "--epochs"),
    (["--prompts", "0", "--documents", "0"], "nothing to train on"),
    (["--batch", "two"], "--batch: must be an integer"),
    (["--ttt-steps", "0"], "--ttt-steps"),
    (["--tiny", "--out", "specverify/integrations/data/smollm2_draft.safetensors"], "not over the shipped"),
    (["--prompts", "100", "--more-prompts", "64"], "not a multiple of --gen-batch 32"),
    (["--more-epochs", "0"], "--more-epochs"),
    (["--more-lr", "1"], "--more-lr"),
    (["--init", "no/such/draft.safetensors"], "--init: no file"),
])
def test_bad_options_are_refused_naming_them(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        train_draft.parse_args(argv)
    assert info.value.code == 2 and words in capsys.readouterr().err


def test_tiny_says_what_it_overrides(capsys):
    args = train_draft.parse_args(["--tiny", "--epochs", "5", "--vocab", "512"])
    assert args.epochs == 3 and "--epochs 3 (not 5)" in capsys.readouterr().out  # --vocab 512 is tiny's own: not named
    assert train_draft.parse_args([]).out is None  # the default: the run's own folder, never the shipped file


def _tiny_head():
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from specverify.integrations import learned_draft as ld

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval().requires_grad_(False)
    head = ld.FeatureHead(config, torch.arange(16)).attach(model)
    rows = [(torch.randint(0, 16, (12,), dtype=torch.int32), torch.randn(11, 16, dtype=torch.float16) * 30, 4)
            for _ in range(6)]
    return head, rows


def test_a_finished_run_resumed_trains_nothing_more(tmp_path):
    head, rows = _tiny_head()
    history = draft_training.train(head, rows, epochs=2, batch=2, max_len=16, lr=1e-3, noise=0.0, seed=0,
                                   ckpt_dir=tmp_path, max_steps=4, log=lambda *a: None)
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    again = draft_training.train(head, rows, epochs=2, batch=2, max_len=16, lr=1e-3, noise=0.0, seed=0,
                                 ckpt_dir=tmp_path, max_steps=4, log=lambda *a: None)
    assert [h["step"] for h in again] == [1, 2, 3, 4]


def test_a_resumed_run_counts_the_training_time_of_every_part(tmp_path, monkeypatch):
    """The history's ``seconds`` (the metadata's ``minutes``) adds the stopped part's time to the
    resumed one's (it once counted the last process only: a run resumed halfway said half)."""
    head, rows = _tiny_head()
    clock = itertools.count(0, 10)  # each time.time() call is 10 s after the one before
    monkeypatch.setattr(draft_training.time, "time", lambda: float(next(clock)))
    args = dict(epochs=2, batch=2, max_len=16, lr=1e-3, noise=0.0, seed=0, ckpt_dir=tmp_path, log=lambda *a: None,
                checkpoint_every=1)
    first = draft_training.train(head, rows, max_steps=2, **args)
    resumed = draft_training.train(head, rows, max_steps=4, **args)
    seconds = [h["seconds"] for h in resumed]
    assert [h["step"] for h in resumed] == [1, 2, 3, 4] and seconds[:2] == [h["seconds"] for h in first]
    assert all(b > a for a, b in zip(seconds, seconds[1:])) and seconds[2] > seconds[1] + 5


def test_a_non_finite_loss_stops_the_run_before_the_step(tmp_path):
    torch = pytest.importorskip("torch")
    head, rows = _tiny_head()
    rows[0] = (rows[0][0], torch.full_like(rows[0][1], float("nan")), 4)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    with pytest.raises(FloatingPointError, match="loss is nan"):
        draft_training.train(head, rows[:1] * 2, epochs=1, batch=2, max_len=16, lr=1e-3, noise=0.0, seed=0,
                             ckpt_dir=tmp_path, log=lambda *a: None)
    assert all(torch.equal(before[k], v) for k, v in head.state_dict().items())  # no step taken


def test_losses_are_taken_on_answer_positions_only():
    torch = pytest.importorskip("torch")
    head, rows = _tiny_head()
    tokens, hidden, learn = draft_training._pad(rows[:2], 16)
    assert learn[:, :3].sum() == 0 and learn[:, 3:].all()  # answer from token 4: position 3 predicts it; labels at 3 .. 10
    _, stats = draft_training.draft_losses(head, tokens, hidden, learn, noise=0.0, steps=3)
    assert stats["tokens"] == 2 * (11 - 3) and {"top1", "top2", "top3", "ce3"} <= set(stats)
    assert draft_training.answer_start(torch.tensor([5, 1, 2, 9, 1, 2, 7, 8]), [1, 2]) == 6
    assert draft_training.answer_start(torch.tensor([5, 9]), [1, 2]) == 0


def test_top1_over_the_whole_vocabulary_misses_an_argmax_outside_the_rows_proposed_from():
    """Evaluation's top-1 (``full_head``) is what greedy acceptance asks: the draft's token is the
    target's argmax over all tokens. Over the rows alone (training's), a position whose argmax
    lies outside them is judged against the best of the rows, and can count as right."""
    torch = pytest.importorskip("torch")
    head, rows = _tiny_head()
    full = head.head.clone()  # [16, d]
    full[1::2] = 3 * full[0::2]  # an odd row: 3x its even neighbour's logit, so every argmax is odd
    head.vocab_ids = torch.arange(0, 16, 2)  # the even ids only
    head.head = full[head.vocab_ids]
    tokens, hidden, learn = draft_training._pad(rows, 16)
    _, over_rows = draft_training.draft_losses(head, tokens, hidden, learn, noise=0.0, steps=1)
    _, over_all = draft_training.draft_losses(head, tokens, hidden, learn, noise=0.0, steps=1, full_head=full)
    with torch.no_grad():
        n0 = hidden.shape[1] - 1
        _, z, _ = head(hidden[:, :-1], tokens[:, 1 : n0 + 1], torch.arange(n0))
        labelled = learn[:, 1:]
        target = head.final_norm(hidden[:, 1:])
        drafted = head.vocab_ids[z.argmax(-1)][labelled]
        truth = torch.nn.functional.linear(target, full).argmax(-1)[labelled]
        best_row = head.vocab_ids[torch.nn.functional.linear(target, head.head).argmax(-1)][labelled]
    assert over_all["top1"] == pytest.approx(float((drafted == truth).float().mean()))
    assert over_rows["top1"] == pytest.approx(float((drafted == best_row).float().mean()))
    assert over_all["top1"] == 0 < over_rows["top1"]  # no position is right; over the rows, some are
    # Context rows: row j's call may also propose the tokens of its prefix x_0 .. x_{j+1} (odd ones too).
    first = draft_training.first_positions(tokens, 16)
    assert first[0, int(tokens[0, 5])] <= 5 and (first[0][~torch.isin(torch.arange(16), tokens[0])] == tokens.shape[1]).all()
    _, with_context = draft_training.draft_losses(head, tokens, hidden, learn, noise=0.0, steps=1, full_head=full,
                                                  first=first)
    b, j = labelled.nonzero(as_tuple=True)
    logits = torch.nn.functional.linear(head.final_norm(head(hidden[:, :-1], tokens[:, 1 : n0 + 1], torch.arange(n0))[0]),
                                        full)[labelled]  # [n, 16]
    allowed = torch.isin(torch.arange(16), head.vocab_ids)[None] | torch.stack(
        [torch.isin(torch.arange(16), tokens[b_, : j_ + 2]) for b_, j_ in zip(b.tolist(), j.tolist())])
    drafted = logits.masked_fill(~allowed, float("-inf")).argmax(-1)
    assert with_context["top1"] == pytest.approx(float((drafted == truth).float().mean())) and with_context["top1"] > 0


def _dense_losses(head, tokens, hidden, learn, steps: int, decay: float = 0.8):
    """The readable reference of draft_training.draft_losses (noise 0): logits at every row of
    every unrolled step, the losses weighted by the answer mask."""
    import torch
    import torch.nn.functional as F

    B, T, d = hidden.shape
    labels = torch.softmax(F.linear(head.final_norm(hidden[:, 1:]), head.head), dim=-1)  # [B, T-1, V_r]
    targets = head.final_norm(hidden[:, 1:])
    n0, loss, past, f = T - 1, 0.0, None, None
    for s in range(steps):
        rows = n0 - s
        if s == 0:
            f, z, past = head(hidden[:, :-1], tokens[:, 1:T], torch.arange(n0))
        else:
            mask = torch.zeros(rows, past[0].shape[2] + rows, dtype=torch.bool)
            mask[:, :n0] = torch.ones(rows, n0, dtype=torch.bool).tril()
            for earlier in range(1, s + 1):
                offset = n0 + sum(n0 - e for e in range(1, earlier))
                mask[torch.arange(rows), offset + torch.arange(rows)] = True
            f, z, past = head(f[:, :rows], tokens[:, s + 1 : s + 1 + rows], torch.arange(s, s + rows), past=past, mask=mask)
        weight = learn[:, s + 1 : s + 1 + rows].float()
        ce = -(labels[:, s : s + rows] * F.log_softmax(z, -1)).sum(-1)
        reg = F.smooth_l1_loss(head.final_norm(f), targets[:, s : s + rows], reduction="none").mean(-1)
        loss = loss + decay**s * ((ce + 10 * reg) * weight).sum() / weight.sum().clamp(min=1)
    return loss


def test_losses_equal_the_dense_reference_in_value_and_gradient():
    """The LM head is applied to labelled rows only: same loss and gradients as computing every row
    and weighting (answers starting at different positions, a padded shorter sequence)."""
    torch = pytest.importorskip("torch")
    head, rows = _tiny_head()
    rows = [(rows[0][0], rows[0][1], 3), (rows[1][0][:9], rows[1][1][:8], 6), (rows[2][0], rows[2][1], 0)]
    batch = draft_training._pad(rows, 16)
    params = [p for p in head.parameters() if p.requires_grad]
    loss, _ = draft_training.draft_losses(head, *batch, noise=0.0, steps=3)
    grads = torch.autograd.grad(loss, params)
    reference = _dense_losses(head, *batch, steps=3)
    expected = torch.autograd.grad(reference, params)
    assert torch.allclose(loss, reference, rtol=1e-5, atol=1e-6)
    assert all(torch.allclose(g, e, rtol=1e-4, atol=1e-6) for g, e in zip(grads, expected))
    # Power: a mask shifted by one position (a label off by one) changes the loss.
    tokens, hidden, learn = batch
    shifted, _ = draft_training.draft_losses(head, tokens, hidden, learn.roll(1, dims=1), noise=0.0, steps=3)
    assert not torch.allclose(shifted, reference, rtol=1e-3)


def test_bfloat16_training_follows_float32_and_precision_is_checked(tmp_path):
    """bfloat16 products (autocast) track the float32 run's losses closely over a few steps; an
    unknown precision is named; ``--precision auto`` resolves to one the trainer takes."""
    head, rows = _tiny_head()
    state = {k: v.clone() for k, v in head.state_dict().items()}
    runs = {}
    for precision in ("float32", "bfloat16"):
        head.load_state_dict(state)
        runs[precision] = draft_training.train(head, rows, epochs=1, batch=2, max_len=16, lr=1e-3, noise=0.0, seed=0,
                                               ckpt_dir=tmp_path, precision=precision, log=lambda *a: None)
        (tmp_path / "checkpoint.pt").unlink()
    for a, b in zip(runs["float32"], runs["bfloat16"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=0.05)
    assert any(a["loss"] != b["loss"] for a, b in zip(runs["float32"], runs["bfloat16"]))  # bfloat16 was used
    with pytest.raises(ValueError, match="precision must be one of"):
        draft_training.train(head, rows, epochs=1, batch=2, max_len=16, lr=1e-3, noise=0.0, seed=0,
                             ckpt_dir=tmp_path, precision="float16", log=lambda *a: None)
    assert train_draft.parse_args([]).precision in draft_training.PRECISIONS
    assert train_draft.parse_args(["--precision", "float32"]).precision == "float32"


def test_the_defaults_are_the_shipped_drafts_parameters():
    """``python -m experiments.end_to_end.train_draft`` with its defaults reproduces the shipped draft:
    every training parameter in its metadata is the parser's default (precision: ``auto`` picks it
    where oneDNN has bfloat16, as on the machine that trained it)."""
    from specverify.integrations import learned_draft

    params = dict(learned_draft.metadata()["params"])
    assert params.pop("format") == draft_training.FORMAT
    args = train_draft.parse_args([])
    shipped_precision = params.pop("precision", "float32")
    assert args.precision == shipped_precision or train_draft._auto_precision() != shipped_precision
    for key, value in params.items():
        assert getattr(args, key) == value, key
    assert args.more_prompts == params.get("more_prompts", 0)  # a one-phase file: the defaults make no phase 2


def _data_args(tmp_path, prompts=8, gen_batch=2):
    from types import SimpleNamespace

    return SimpleNamespace(prompts=prompts, gen_batch=gen_batch, documents=0, doc_batch=2, answers_dir=tmp_path / "a",
                           documents_dir=tmp_path / "d", seed=0, max_files=10, max_new=4, doc_len=8, data_workers=1)


def _fake_data(monkeypatch, made):
    torch = pytest.importorskip("torch")
    from specverify.integrations import smollm2

    monkeypatch.setattr(smollm2, "load", lambda log=None: (None, None))
    monkeypatch.setattr(draft_data, "_chunk_inputs", lambda kind, c, folder, seed, max_files: [f"p{i}" for i in range(640)])

    def generate(model, tokenizer, prompts, max_new, sample, seed):
        made.append(seed)
        return [(torch.tensor([seed], dtype=torch.int32), torch.zeros(0, 4))]

    monkeypatch.setattr(draft_data, "generate_shard", generate)


def test_workers_take_the_next_unclaimed_shard(tmp_path, monkeypatch):
    """A shard another worker has claimed is left to it; every other missing one is made once, from
    its own seed; a finished run makes nothing; a stopped run's stale claims are dropped."""
    made = []
    _fake_data(monkeypatch, made)
    args = _data_args(tmp_path)
    plan = draft_data.shard_plan(args)
    assert len(plan) == 4
    plan[0][3].parent.mkdir(parents=True)
    assert draft_data._claim(plan[1][3]) and not draft_data._claim(plan[1][3])  # held by "another worker"
    assert draft_data.make_shards(args) == 3 and not plan[1][3].is_file()
    assert sorted(made) == [args.seed + s for s in (0, 2, 3)]  # chunk 0's shards 0, 2, 3: each its own seed
    assert draft_data.make_shards(args) == 0  # the claimed one is still someone else's
    paths = draft_data.collect_data(args)  # a new run: the stale claim is dropped and the shard made
    assert all(p.is_file() for p in paths) and sorted(made) == [0, 1, 2, 3]
    assert not list(plan[0][3].parent.glob("*.claim"))
    assert draft_data.make_shards(args) == 0


def test_phase_two_answers_the_prompts_after_phase_one(tmp_path, monkeypatch):
    """``--more-prompts``' shards continue phase 1's: the next prompts of the same chunks (and the
    next chunks), each shard from the seed it would have in one long run, none made twice."""
    made = []
    _fake_data(monkeypatch, made)
    first = _data_args(tmp_path, prompts=6)
    more = _data_args(tmp_path, prompts=1284)
    more.prompts_from = 6
    one_run = _data_args(tmp_path, prompts=1290)
    names = lambda plan: [p.name for *_, p in plan]  # noqa: E731
    assert names(draft_data.shard_plan(first)) + names(draft_data.shard_plan(more)) == names(draft_data.shard_plan(one_run))
    assert names(draft_data.shard_plan(more))[0] == "shard_c000_00003.pt"
    assert names(draft_data.shard_plan(more))[-1] == "shard_c002_00004.pt"
    draft_data.collect_data(first)
    draft_data.collect_data(more)
    stride = draft_prompts.CHUNK_SEED_STRIDE
    assert sorted(made) == sorted(stride * c + s for _, c, s, _ in draft_data.shard_plan(one_run))
    assert draft_data.make_shards(one_run) == 0  # one long run finds every shard made


def test_a_request_is_kept_when_its_turn_ends_with_words_enough():
    """The target's requests (``--more-source target``): a draw is kept only when the user turn
    closes, has ``REQUEST_MIN_WORDS`` words or more and opens no other turn."""
    end = 2
    words = {5: "How", 6: "do", 7: "I", 8: "bake", 9: "bread?", 10: "<|im_start|>assistant"}
    decode = lambda row: " ".join(words[t] for t in row)  # noqa: E731
    assert draft_data.kept_request([5, 6, 7, 8, 9, end, end], end, decode) == "How do I bake bread?"
    assert draft_data.kept_request([5, 6, 7, 8, 9], end, decode) is None  # never closed: a page, not a request
    assert draft_data.kept_request([5, 6, 9, end], end, decode) is None  # three words
    assert draft_data.kept_request([5, 6, 7, 10, 9, end], end, decode) is None  # another turn inside
    assert draft_prompts.REQUEST_MIN_WORDS == 4


def test_phase_two_from_the_targets_requests(tmp_path, monkeypatch):
    """``--more-source target``: the shards live in their own folder; each draws its requests from
    its seed plus ``REQUEST_SEED_OFFSET`` and answers the kept ones from the seed itself; a shard
    whose draws were all dropped is saved empty (made, not drawn again)."""
    made = []
    _fake_data(monkeypatch, made)
    drawn = []

    def write(model, tokenizer, n, seed):
        drawn.append((n, seed))
        return [] if len(drawn) == 2 else [f"request {i}" for i in range(n - 1)]

    monkeypatch.setattr(draft_data, "write_requests", write)
    args = _data_args(tmp_path, prompts=0)
    args.requests, args.requests_dir = 1286, tmp_path / "r"  # two chunks and a shard of the third
    plan = draft_data.shard_plan(args)
    assert {kind for kind, *_ in plan} == {"requests"} and {p.parent for *_, p in plan} == {args.requests_dir}
    assert len(plan) == 2 * 320 + 3 and plan[-1][3].name == "shard_c002_00002.pt"
    draft_data.collect_data(args)
    stride = draft_prompts.CHUNK_SEED_STRIDE
    seeds = [stride * c + s for _, c, s, _ in plan]
    assert sorted(seed for _, seed in drawn) == sorted(s + draft_data.REQUEST_SEED_OFFSET for s in seeds)
    assert len(made) == len(plan) - 1  # the shard with no request kept generates nothing
    assert all(p.is_file() for *_, p in plan) and draft_data.make_shards(args) == 0
