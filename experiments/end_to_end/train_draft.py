"""Train the learned draft for SmolLM2-135M on this CPU, offline: ``python -m experiments.end_to_end.train_draft``.

The draft is :class:`specverify.integrations.learned_draft.FeatureHead` (EAGLE-style: one decoder
layer over the target's last hidden state and the next token's embedding, the target's frozen norm
and a reduced-vocabulary slice of its LM head). Three cached, resumable stages:

1. **Prompts** from text that is on this machine and is not the project's: Python functions and
   documentation paragraphs of the installed packages (``site-packages``) and ``/usr/share/doc``,
   wrapped in instruction templates (explain, summarize, comment, continue, answer a question about
   a heading ...) as one user turn of the chat template. The project's prompt sets
   (:mod:`experiments.end_to_end.real_model`) are the held-out evaluation: no template copies
   their instructions and no text of theirs is used.
2. **Self-distillation data**, two kinds, both stored as shards of int32 tokens and float16
   last-layer hidden states ``h_t`` of every position (a forward pre-hook on the target's final
   norm keeps them, so the soft labels -- the target's distribution at every position,
   ``softmax(W norm(h_t))`` -- need no second pass):

   - *answers*: the target answers each prompt (batched ``generate``, half greedy, half sampled at
     temperature 0.7 / top-p 0.9, up to ``--max-new`` tokens): the draft's inputs at inference
     (the target's own tokens) exactly, at ~75 tokens/s on one core;
   - *documents*: one teacher-forced forward over a chat whose user turn asks to continue a piece
     of a file and whose assistant turn is the text that follows it in that file: the target's
     features and distributions on text it did not write, at ~200 tokens/s on one core (no
     decoding), so the data grows ~3x faster per core.

   Both are drawn in chunks (``GEN_CHUNK`` prompts, ``DOC_CHUNK`` documents), chunk ``c`` from
   its own seed, so a larger ``--prompts`` or ``--documents`` adds chunks and keeps every shard
   already made; ``--data-workers`` processes (one torch thread each) make the shards side by
   side.
3. **Training**: pair ``t`` is ``(h_t, x_{t+1})``; the draft's output ``f_t`` is pulled towards
   ``h_{t+1}`` (smooth L1 on RMS-normalized features) and its distribution over the reduced
   vocabulary towards the target's at ``t + 1`` restricted to it (cross-entropy on soft labels), as
   in EAGLE, at answer positions only (the prompt and chat template are context: the draft is
   used on answers, and ~30 template tokens a sequence would otherwise take a large share of the
   loss). ``--ttt-steps`` draft steps are unrolled (EAGLE-3's training-time test): step ``s`` feeds
   the draft its own output of step ``s - 1`` with an attention mask that shows it the true pairs
   before it and its own earlier pairs on the same chain -- what drafting token ``s + 1`` sees --
   weighted ``0.8 ** s``. The reduced vocabulary is the ``--vocab`` most frequent tokens of the
   target's answers (the documents', if any, break ties and fill the rest; chat-template tokens
   always included).

Everything lands in ``results/train_draft/<key>/`` (the data's key hashes the parameters of how
a shard is made, not how many there are; the run's key all parameters; an interrupted run resumes
at the next missing shard or from its last checkpoint, every 50 steps); the trained draft is
written to the run's folder (``draft.safetensors``) or to ``--out``, with the parameters, data
sources and token counts and the losses in its metadata. Nothing is written over the shipped
draft (:data:`~specverify.integrations.learned_draft.DEFAULT_WEIGHTS`) unless ``--out`` names
it; the defaults are the shipped draft's parameters, so
``python -m experiments.end_to_end.train_draft --out specverify/integrations/data/smollm2_draft.safetensors``
reproduces it. ``--tiny`` is the CI-sized run (a handful of prompts, a few steps, a small
vocabulary; it says which options it overrides and refuses to write over the shipped draft).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import re
import site
import time
from pathlib import Path

from .. import paths

EXPERIMENT = "train_draft"

# Instruction templates. None of them repeats an instruction of the evaluation prompt sets.
CODE_TEMPLATES = [
    "Explain what this Python code does:\n```python\n{text}\n```",
    "What are the inputs and outputs of this function?\n```python\n{text}\n```",
    "Describe in plain English how this works:\n```python\n{text}\n```",
    "Write a short usage example for this function:\n```python\n{text}\n```",
    "Are there any bugs or edge cases in this code?\n```python\n{text}\n```",
    "Add comments to this code and show it again:\n```python\n{text}\n```",
]
TEXT_TEMPLATES = [
    "Summarize the following text:\n{text}",
    "Explain this to a beginner:\n{text}",
    "What is the main point of this passage?\n{text}",
    "Write three questions a reader might ask about this text:\n{text}",
    "Continue writing after this paragraph:\n{text}",
    "Make a bullet list of the key facts in this text:\n{text}",
]
TOPIC_TEMPLATES = [
    "What is {text}?",
    "Explain {text} in simple terms.",
    "Give me three tips about {text}.",
    "Write a short paragraph about {text}.",
    "Why would someone use {text}?",
    "Tell me a short story that involves {text}.",
]
# Everyday requests: what a chat assistant is mostly asked, and where its answers differ most from
# the prose and code of the files above. Subjects and templates are written here, not taken from any
# prompt set (held-out or benchmark).
CHAT_TEMPLATES = [
    "Give me five ideas related to {text}.",
    "Explain how {text} works, step by step.",
    "What are the pros and cons of {text}?",
    "Write a short speech about {text}.",
    "Describe {text} to someone who has never heard of it.",
    "What are common mistakes people make with {text}?",
    "Write a haiku about {text}.",
    "Write a product description for {text}.",
    "Write the opening paragraph of a blog post about {text}.",
    "Answer in one paragraph: why does {text} matter?",
    "Make a checklist for {text}.",
    "Write a motivational message about {text}.",
    "What should I know before I start with {text}?",
    "Tell me a fun fact about {text} and explain it.",
    "Compare {text} with {other} in a few sentences.",
    "Write a short conversation between two friends about {text}.",
    "Give me a one-week plan for getting better at {text}.",
    "What is the history of {text}, in brief?",
]
SUBJECTS = [
    "gardening", "a rainy weekend", "learning to swim", "coffee", "tea", "public libraries", "camping",
    "saving money", "a first job interview", "running a marathon", "houseplants", "volcanoes", "bread baking",
    "chess", "electric cars", "recycling", "birthday parties", "moving to a new city", "homework",
    "sleep", "breakfast", "snow", "thunderstorms", "the moon", "honey bees", "museums", "trains",
    "photography", "knitting", "video games", "board games", "soccer", "basketball", "yoga",
    "meditation", "time management", "public speaking", "writing a resume", "learning a language",
    "the piano", "guitar lessons", "a science fair", "recycling old phones", "solar panels", "wind power",
    "composting", "hiking boots", "dogs as pets", "goldfish", "birds in winter", "autumn leaves",
    "spring cleaning", "a road trip", "airports", "hotels", "street food", "spicy food", "vegetables",
    "drinking water", "vitamins", "a healthy lunch", "a budget for students", "credit cards",
    "online shopping", "passwords", "email etiquette", "social media", "smartphones", "laptops",
    "the internet", "printers", "spreadsheets", "a small bakery", "opening a cafe", "farmers",
    "forests", "deserts", "rivers", "mountains", "glaciers", "earthquakes", "the solar system",
    "telescopes", "dinosaurs", "ancient Egypt", "the printing press", "the telephone", "bicycle repair",
    "kites", "paper airplanes", "origami", "painting with watercolors", "a school play", "summer camp",
    "teamwork", "friendship", "kindness", "patience", "curiosity", "a new neighbor", "grandparents",
    "family dinners", "a wedding toast", "a thank-you note", "job feedback", "a lost wallet",
    "a flat tire", "fixing a leaky tap", "painting a room", "building a bookshelf", "a tiny house",
    "city parks", "public transport", "traffic", "clean air", "plastic bags", "ocean tides",
    "rainbows", "clouds", "fireflies", "ants", "owls", "elephants", "penguins", "sharks",
    "olive oil", "cheese", "chocolate", "rice", "soup", "sandwiches", "ice cream", "lemonade",
    "a lemonade stand", "a garage sale", "a job promotion", "working from home", "a daily walk",
    "stretching", "drawing comics", "poetry readings", "podcasts", "audiobooks", "newspapers",
    "maps", "compasses", "clocks", "calendars", "birthdays", "holidays", "fireworks", "lanterns",
]
TASK_TEMPLATES = [
    "Paraphrase this paragraph:\n{text}",
    "Give this text a title and a one-sentence description:\n{text}",
    "Turn this text into a list of short points:\n{text}",
    "Which three words matter most in the following text? Explain each:\n{text}",
    "Write a friendly reply to someone who sent you this:\n{text}",
    "Is this text formal or informal? Explain with an example:\n{text}",
    "List every name and number mentioned in this text:\n{text}",
    "Write a question about this text and answer it:\n{text}",
    "Shorten this text to one sentence:\n{text}",
    "Write a unit test for this function:\n```python\n{code}\n```",
    "Annotate the arguments of this function with types:\n```python\n{code}\n```",
    "Suggest a clearer name for this function and explain why:\n```python\n{code}\n```",
    "How could this function be made shorter? Give the new version:\n```python\n{code}\n```",
    "Sort these alphabetically, one per line:\n{items}",
    "Number these items and add a short note to each:\n{items}",
    "Group these into categories:\n{items}",
]


# -- 1. prompts --------------------------------------------------------------------------------
def _text_files(max_files: int, rng: random.Random):
    roots = [Path(p) for p in site.getsitepackages()] + [Path("/usr/share/doc")]
    repo = paths.REPO_ROOT.resolve()
    found = []
    for root in roots:
        for dirpath, _, names in os.walk(root):
            if Path(dirpath).resolve().is_relative_to(repo):
                continue  # never the project's own text (an editable install points here)
            for name in names:
                if name.endswith((".py", ".md", ".rst", ".txt")) or name in ("README", "copyright") or name.endswith(".md.gz"):
                    found.append(Path(dirpath) / name)
    found.sort()
    rng.shuffle(found)
    return found[:max_files]


def _read(path: Path) -> str:
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        return raw[:200_000].decode("utf-8", "replace")
    except OSError:
        return ""


_DEF = re.compile(r"^(?:    )?def \w+\(.*?(?=^(?:    )?def |^class |\Z)", re.S | re.M)
_HEADING_MD = re.compile(r"^#{1,3} +([A-Za-z][\w .,'()-]{3,60})$", re.M)
_HEADING_RST = re.compile(r"^([A-Za-z][\w .,'()-]{3,60})\n[=\-~^]{4,}$", re.M)


def snippets(path: Path, text: str):
    """``(kind, text)`` pieces of one file: functions of a .py, paragraphs and headings of prose."""
    out = []
    if path.suffix == ".py":
        for m in _DEF.finditer(text):
            body = m.group(0).rstrip()
            if 120 <= len(body) <= 600 and body.count("\n") >= 3:
                out.append(("code", body))
    else:
        for para in re.split(r"\n\s*\n", text):
            para = " ".join(para.split())
            letters = sum(c.isalpha() for c in para)
            if 200 <= len(para) <= 600 and letters > 0.7 * len(para):
                out.append(("text", para))
        for m in list(_HEADING_MD.finditer(text)) + list(_HEADING_RST.finditer(text)):
            title = m.group(1).strip()
            if len(title.split()) >= 2:
                out.append(("topic", title.lower()))
    return out


def build_prompts(n: int, seed: int, max_files: int = 6000):
    """``n`` user-turn prompts (strings) and the count of each source kind."""
    rng = random.Random(seed)
    pieces = {"code": [], "text": [], "topic": []}
    for path in _text_files(max_files, rng):
        for kind, text in snippets(path, _read(path)):
            pieces[kind].append(text)
    templates = {"code": CODE_TEMPLATES, "text": TEXT_TEMPLATES, "topic": TOPIC_TEMPLATES}
    kinds = [k for k in ("code", "text", "topic") if pieces[k]] + ["chat", "chat", "task", "task"]
    prompts, counts = [], {k: 0 for k in kinds}
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if kind == "chat":
            subject, other = rng.sample(SUBJECTS, 2)
            prompts.append(rng.choice(CHAT_TEMPLATES).format(text=subject, other=other))
        elif kind == "task":
            prompts.append(_task_prompt(rng, pieces))
        else:
            prompts.append(rng.choice(templates[kind]).format(text=rng.choice(pieces[kind])))
        counts[kind] += 1
    return prompts, {"prompts": counts, "pieces": {k: len(v) for k, v in pieces.items()}}


def _task_prompt(rng: random.Random, pieces) -> str:
    """One of :data:`TASK_TEMPLATES`, filled with a prose piece, a function or a few subjects."""
    template = rng.choice(TASK_TEMPLATES)
    if "{code}" in template and not pieces["code"] or "{text}" in template and not pieces["text"]:
        template = TASK_TEMPLATES[-1]
    return template.format(text=rng.choice(pieces["text"]) if pieces["text"] else "",
                           code=rng.choice(pieces["code"]) if pieces["code"] else "",
                           items="\n".join(rng.sample(SUBJECTS, rng.randint(4, 8))))


#: Bumped when :func:`build_prompts` changes (part of the answers' cache key): 2 added the everyday
#: requests (``chat``) and tasks on texts, functions and lists (``task``), over half the prompts.
PROMPTS_VERSION = 2

# Chunks: chunk c of the answers draws its prompts with seed + CHUNK_SEED_STRIDE * c (chunk 0 with
# the seed itself), chunk c of the documents with the string "documents:<seed>:<c>".
GEN_CHUNK = 640
DOC_CHUNK = 512
CHUNK_SEED_STRIDE = 1_000_003
DOC_TEMPLATES = [
    "Continue this {kind}:\n{text}",
    "Here is the beginning of a {kind}. Write what comes next.\n{text}",
    "What comes after this {kind}?\n{text}",
]


def prompt_chunk(c: int, seed: int, max_files: int):
    """Chunk ``c`` of the prompts: ``GEN_CHUNK`` prompts sorted by length (batches of similar length
    pad little in ``generate``) and their sources."""
    prompts, sources = build_prompts(GEN_CHUNK, seed + CHUNK_SEED_STRIDE * c, max_files)
    return sorted(prompts, key=len), sources


def _lines_piece(lines, start: int, min_chars: int, max_chars: int):
    """Whole lines from ``start`` adding up to at most ``max_chars`` (None below ``min_chars``)."""
    out, size = [], 0
    for line in lines[start:]:
        if size + len(line) + 1 > max_chars:
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out).strip() if size >= min_chars else None


def document_chunk(c: int, seed: int, max_files: int):
    """Chunk ``c`` of the documents: ``DOC_CHUNK`` ``(user, assistant)`` turns, the user asking to
    continue a piece of a file (300-900 characters), the assistant turn the text that follows it
    there (400-1600 characters); half prose (up to three pieces a file: prose files are the fewer),
    half code, license files left out (the same few texts again and again); and the count of each."""
    rng = random.Random(f"documents:{seed}:{c}")
    files = [f for f in _text_files(max_files, rng) if f.name not in ("copyright", "LICENSE", "LICENSE.txt", "COPYING")]
    found = {"code": [], "text": []}
    for path in files:
        kind = "code" if path.suffix == ".py" else "text"
        if len(found[kind]) >= DOC_CHUNK // 2:
            if all(len(v) >= DOC_CHUNK // 2 for v in found.values()):
                break
            continue
        lines = _read(path).splitlines()
        for _ in range(1 if kind == "code" else 3):
            if len(lines) <= 20:
                break
            start = rng.randrange(0, len(lines) - 20)
            first = _lines_piece(lines, start, 300, 900)
            if first is None:
                continue
            second = _lines_piece(lines, start + first.count("\n") + 1, 400, 1600)
            if second is None or sum(ch.isalpha() for ch in first + second) < 0.4 * len(first + second):
                continue
            if kind == "code":
                first, second = f"```python\n{first}\n```", f"```python\n{second}\n```"
            name = "piece of Python code" if kind == "code" else "text"
            found[kind].append((rng.choice(DOC_TEMPLATES).format(kind=name, text=first), second))
    turns = [t for pair in zip(found["text"], found["code"]) for t in pair]
    rest = found["text"][len(found["code"]):] + found["code"][len(found["text"]):]
    turns = (turns + rest)[:DOC_CHUNK]
    counts = {k: sum(1 for t in turns if t in v) for k, v in found.items()}
    return turns, {"documents": counts, "files": len(files)}


# -- 2. self-distillation data -------------------------------------------------------------------
class _NormInputs:
    """A forward pre-hook on the target's final norm keeping every call's input ``[B, T, d]``."""

    def __init__(self, model):
        self.calls = []
        self.handle = model.model.norm.register_forward_pre_hook(lambda module, args: self.calls.append(args[0].detach()))

    def take(self):
        calls, self.calls = self.calls, []
        return calls

    def remove(self):
        self.handle.remove()


def generate_shard(model, tokenizer, prompts, max_new: int, sample: bool, seed: int):
    """The target's answers to ``prompts`` with the hidden state of every position.

    Returns a list of ``(tokens [n] int32, hidden [n - 1, d] float16)``: ``tokens`` the prompt (chat
    template) and answer up to and including the first end token, ``hidden[t]`` the input of the
    final norm at position ``t`` (what produced the distribution of ``tokens[t + 1]``).
    """
    import torch

    chats = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
             for p in prompts]
    tokenizer.padding_side = "left"
    batch = tokenizer(chats, return_tensors="pt", padding=True, add_special_tokens=False)
    eos = {int(t) for t in ([model.generation_config.eos_token_id] if isinstance(model.generation_config.eos_token_id, int)
                            else model.generation_config.eos_token_id)}
    tap = _NormInputs(model)
    torch.manual_seed(seed)
    kwargs = dict(do_sample=True, temperature=0.7, top_p=0.9, top_k=0) if sample else dict(do_sample=False)
    try:
        with torch.inference_mode():
            out = model.generate(**batch, max_new_tokens=max_new, pad_token_id=tokenizer.pad_token_id, **kwargs)
        hidden = torch.cat(tap.take(), dim=1)  # [B, padded prompt + steps, d]
    finally:
        tap.remove()
    width = batch["input_ids"].shape[1]
    result = []
    for b in range(out.shape[0]):
        start = int((batch["attention_mask"][b] == 0).sum())  # left padding
        answer = out[b, width:].tolist()
        end = next((i + 1 for i, t in enumerate(answer) if t in eos), len(answer))
        tokens = out[b, start : width + end]
        n = tokens.numel()
        h = hidden[b, start : start + n - 1]
        if h.shape[0] != n - 1:
            raise RuntimeError(f"hidden states cover {h.shape[0]} positions, expected {n - 1}")
        result.append((tokens.to(torch.int32).clone(), h.to(torch.float16).clone()))
    return result


def document_shard(model, tokenizer, turns, max_len: int):
    """Teacher-forced hidden states of the chats ``turns`` (``(user, assistant)`` pairs), in the
    format of :func:`generate_shard`: ``(tokens [n] int32, hidden [n - 1, d] float16)`` per chat,
    cut at ``max_len`` tokens. One forward of the target's decoder (no LM head, no decoding)."""
    import torch

    seqs = [tokenizer.apply_chat_template([{"role": "user", "content": u}, {"role": "assistant", "content": a}],
                                          tokenize=False) for u, a in turns]
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"][:max_len] for text in seqs]
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), tokenizer.pad_token_id or 0, dtype=torch.long)
    attention = torch.zeros(len(ids), width, dtype=torch.long)
    for b, x in enumerate(ids):
        input_ids[b, : len(x)] = torch.tensor(x)
        attention[b, : len(x)] = 1
    tap = _NormInputs(model)
    try:
        with torch.inference_mode():
            model.model(input_ids=input_ids, attention_mask=attention)  # right padding: rows need no shift
        (hidden,) = tap.take()
    finally:
        tap.remove()
    return [(torch.tensor(x, dtype=torch.int32), hidden[b, : len(x) - 1].to(torch.float16).clone())
            for b, x in enumerate(ids)]


def _save(rows, path: Path):
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(rows, tmp)
    os.replace(tmp, path)


def _chunk_inputs(kind: str, c: int, data_dir: Path, seed: int, max_files: int):
    """Chunk ``c``'s prompts (kind ``answers``) or chats (``documents``), cached as JSON."""
    path = data_dir / f"{kind}_c{c:03d}.json"
    if path.is_file():
        return json.loads(path.read_text())["items"]
    items, sources = (prompt_chunk if kind == "answers" else document_chunk)(c, seed, max_files)
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"items": items, "sources": sources}))
    os.replace(tmp, path)
    return items


def shard_plan(args):
    """Every shard of the run: ``(kind, chunk, index in chunk, path)``; the shard's batch is the
    ``index``-th slice of the chunk's prompts or chats."""
    plan = []
    for kind, total, chunk, batch, folder in (("answers", args.prompts, GEN_CHUNK, args.gen_batch, args.answers_dir),
                                               ("documents", args.documents, DOC_CHUNK, args.doc_batch, args.documents_dir)):
        for c in range(math.ceil(total / chunk)):
            for s in range(math.ceil(min(chunk, total - c * chunk) / batch)):
                plan.append((kind, c, s, folder / f"shard_c{c:03d}_{s:05d}.pt"))
    return plan


def make_shards(args, worker: int = 0, workers: int = 1):
    """Make the missing shards of :func:`shard_plan` whose position is ``worker`` modulo ``workers``
    (resumable: shards on disk are kept)."""
    import torch
    from tqdm import tqdm

    from specverify.integrations import smollm2

    torch.set_num_threads(1)  # one process per core: two threads each would oversubscribe them
    plan = [item for i, item in enumerate(shard_plan(args)) if i % workers == worker]
    todo = [item for item in plan if not item[3].is_file()]
    if not todo:
        return
    model, tokenizer = smollm2.load(log=lambda *a: None)
    for kind, c, s, path in tqdm(todo, desc=f"data (worker {worker + 1}/{workers})", unit="shard", position=worker):
        folder = path.parent
        items = _chunk_inputs(kind, c, folder, args.seed, args.max_files)
        if kind == "answers":
            chunk = items[s * args.gen_batch : (s + 1) * args.gen_batch]
            rows = generate_shard(model, tokenizer, chunk, args.max_new, sample=bool(s % 2),
                                  seed=args.seed + CHUNK_SEED_STRIDE * c + s)
        else:
            chunk = items[s * args.doc_batch : (s + 1) * args.doc_batch]
            rows = document_shard(model, tokenizer, chunk, args.doc_len)
        _save(rows, path)


def collect_data(args):
    """All shards of the run, made by ``args.data_workers`` processes side by side. Returns paths."""
    plan = shard_plan(args)
    for _, c, _, path in plan:  # the chunks' inputs once, before the workers share them
        path.parent.mkdir(parents=True, exist_ok=True)
    for kind, c in sorted({(k, c) for k, c, _, p in plan if not p.is_file()}):
        _chunk_inputs(kind, c, args.answers_dir if kind == "answers" else args.documents_dir, args.seed, args.max_files)
    workers = min(args.data_workers, max(1, sum(not p.is_file() for *_, p in plan)))
    if workers == 1:
        make_shards(args)
    else:
        import concurrent.futures
        import multiprocessing

        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            for future in [pool.submit(make_shards, args, w, workers) for w in range(workers)]:
                future.result()
    return [path for *_, path in plan]


def load_sequences(shards):
    import torch

    rows = []
    for path in shards:
        rows += torch.load(path)
    return rows


#: What the chat template puts before an assistant turn: the answer starts after its last occurrence.
ASSISTANT_HEADER = "<|im_start|>assistant\n"
#: The draft file's format (in its metadata): 2 normalizes the head's two inputs (FeatureHead's n_h, n_e).
FORMAT = 2


def answer_start(tokens, header) -> int:
    """Index of the first answer token of ``tokens`` ``[n]``: right after the last ``header`` (a
    list of ids); 0 when there is none (the whole sequence is then trained on)."""
    seq, m = tokens.tolist(), len(header)
    for i in range(len(seq) - m, -1, -1):
        if seq[i : i + m] == header:
            return i + m
    return 0


def reduced_vocabulary(answers, documents, size: int, always):
    """The ``size`` token ids the draft's head keeps, sorted, and the share of the answers' tokens
    they cover: the most frequent of the target's own answers (what the draft proposes at
    inference), ties and the rest by their frequency in the documents, then by id (lower first),
    ``always`` included.
    ``answers``, ``documents``: lists of ``(tokens, hidden)`` rows, or ``(tokens, hidden,
    answer_start)``: then only the answer's tokens ``tokens[answer_start:]`` count (the prompts'
    are context the draft never proposes)."""
    import torch

    def answer(row):
        return row[0][row[2]:] if len(row) > 2 else row[0]

    n_ids = max([int(row[0].max()) for row in answers + documents] + list(always)) + 1

    def counts(rows):
        total = torch.zeros(n_ids, dtype=torch.int64)
        for row in rows:
            total += torch.bincount(answer(row).long(), minlength=n_ids)
        return total

    in_answers, in_documents = counts(answers), counts(documents)
    rank = in_answers * (in_documents.max() + 1) + in_documents
    rank[list(always)] = rank.max() + 1  # always kept
    # Ties (tokens neither kind holds, when the answers use fewer than ``size``) go to the lower id:
    # a BPE vocabulary numbers its merges in order, so lower ids are the tokenizer corpus's commoner ones.
    top = torch.argsort(rank, descending=True, stable=True)[:size]
    return torch.sort(top).values, float(in_answers[top].sum()) / max(1.0, float(in_answers.sum()))


# -- 3. training ---------------------------------------------------------------------------------
def _batches(rows, batch: int, rng: random.Random):
    order = list(range(len(rows)))
    rng.shuffle(order)
    for i in range(0, len(order), batch):
        yield [rows[j] for j in order[i : i + batch]]


def _pad(seqs, max_len: int):
    """``tokens [B, T + 1]`` int64, ``hidden [B, T, d]`` float32 (``hidden[b, t] = h_t``) and
    ``learn [B, T]`` bool: True where position ``t``'s distribution (that of ``x_{t+1}``) is a
    training label, that is where ``h_t`` exists and ``x_{t+1}`` is an answer token (``seqs``:
    ``(tokens [n], hidden [n - 1, d], answer_start)`` rows; the prompt stays context only)."""
    import torch

    n = min(max_len, max(h.shape[0] for _, h, _ in seqs))
    d = seqs[0][1].shape[1]
    tokens = torch.zeros(len(seqs), n + 1, dtype=torch.int64)
    hidden = torch.zeros(len(seqs), n, d)
    learn = torch.zeros(len(seqs), n, dtype=torch.bool)
    for b, (t, h, start) in enumerate(seqs):
        m = min(n, h.shape[0])
        tokens[b, : m + 1] = t[: m + 1].long()
        hidden[b, :m] = h[:m].float()
        learn[b, max(0, start - 1) : m] = True
    return tokens, hidden, learn


def draft_losses(head, tokens, hidden, learn, noise: float, steps: int = 3, decay: float = 0.8, generator=None):
    """EAGLE losses of one batch over ``steps`` unrolled draft steps (training-time test).

    ``tokens [B, T + 1]``, ``hidden [B, T, d]`` (``h_t``), ``learn [B, T]`` (:func:`_pad`). Step 0
    feeds the true pairs ``(h_j, x_{j+1})`` at positions ``j``; step ``s`` feeds pair ``j + s`` =
    ``(f, x_{j+s+1})``, ``f`` the draft's own output of step ``s - 1`` at row ``j``, at position
    ``j + s``, attending to the true pairs ``0 .. j``, its own pairs of steps ``1 .. s - 1`` at row
    ``j`` and itself: exactly what drafting token ``s + 1`` after the prefix ``x_0 .. x_{j+1}``
    sees. Its output is pulled towards ``h_{j+s+1}`` (smooth L1 on normalized features, weight 10)
    and its distribution over the reduced vocabulary towards the target's at ``j + s + 1``
    (cross-entropy on soft labels) wherever ``learn`` marks that position; step ``s`` weighs
    ``decay ** s``. Returns ``(loss, stats)`` (``top1_s``: the draft's argmax equals the
    target's, step ``s``; ``overlap1``: ``sum min(p, q)`` at step 0, the acceptance rate).
    """
    import torch
    import torch.nn.functional as F

    B, T, d = hidden.shape
    if T < steps + 2:
        raise ValueError(f"sequences need at least {steps + 3} tokens")
    feats = hidden[:, :-1]  # h_0 .. h_{T-2}
    if noise:
        feats = feats + noise * (torch.rand(feats.shape, generator=generator) - 0.5) * feats.abs().mean()
    with torch.no_grad():
        labels = torch.softmax(F.linear(head.final_norm(hidden[:, 1:]), head.head), dim=-1)  # [B, T-1, V_r]: position t+1
        targets = head.final_norm(hidden[:, 1:])  # [B, T-1, d]
    n0 = T - 1  # rows of step 0 (true pairs 0 .. T-2)
    loss, stats, past, f = 0.0, {}, None, None
    for s in range(steps):
        rows = n0 - s  # step s has rows j = 0 .. T-2-s
        if s == 0:
            f, z, past = head(feats, tokens[:, 1:T], torch.arange(n0))
        else:
            held = past[0].shape[2]  # the true pairs, then rows' keys of steps 1 .. s-1
            mask = torch.zeros(rows, held + rows, dtype=torch.bool)
            mask[:, :n0] = torch.ones(rows, n0, dtype=torch.bool).tril()  # true pairs 0 .. j
            j = torch.arange(rows)
            for earlier in range(1, s + 1):  # own pairs of steps 1 .. s-1 (row j), and itself
                offset = n0 + sum(n0 - e for e in range(1, earlier))
                mask[j, offset + j] = True
            f, z, past = head(f[:, :rows], tokens[:, s + 1 : s + 1 + rows], torch.arange(s, s + rows), past=past, mask=mask)
        weight = learn[:, s + 1 : s + 1 + rows].float()  # label position j + s + 1
        count = weight.sum().clamp(min=1)
        ce = -(labels[:, s : s + rows] * F.log_softmax(z, -1)).sum(-1)
        reg = F.smooth_l1_loss(head.final_norm(f), targets[:, s : s + rows], reduction="none").mean(-1)
        loss = loss + decay**s * ((ce + 10 * reg) * weight).sum() / count
        with torch.no_grad():
            stats[f"ce{s + 1}"] = float((ce * weight).sum() / count)
            stats[f"top{s + 1}"] = float(((z.argmax(-1) == labels[:, s : s + rows].argmax(-1)).float() * weight).sum() / count)
            if s == 0:
                stats["overlap1"] = float((torch.minimum(torch.softmax(z, -1), labels).sum(-1) * weight).sum() / count)
                stats["tokens"] = int(weight.sum())
    return loss, stats


def train(head, rows, epochs: int, batch: int, max_len: int, lr: float, noise: float, seed: int,
          ckpt_dir: Path, max_steps: int = 0, checkpoint_every: int = 50, ttt_steps: int = 3, log=print):
    """AdamW with warmup and cosine decay; a checkpoint every ``checkpoint_every`` steps and at the
    end of each epoch (resumable mid-epoch: the epoch's batch order is a function of the seed; a
    finished run resumed trains nothing more). A non-finite loss stops the run with a
    FloatingPointError before the step is taken (the last checkpoint stays as it was).
    Returns the loss log."""
    import torch
    from tqdm import tqdm

    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    steps_per_epoch = math.ceil(len(rows) / batch)
    total = epochs * steps_per_epoch if not max_steps else max_steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, total // 20)) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total)))
    history, step = [], 0
    ckpt = ckpt_dir / "checkpoint.pt"

    def save_checkpoint():
        tmp = ckpt.with_suffix(".tmp")
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "schedule": schedule.state_dict(),
                    "history": history, "step": step}, tmp)
        os.replace(tmp, ckpt)

    if ckpt.is_file():
        state = torch.load(ckpt)
        head.load_state_dict(state["head"], strict=False)
        opt.load_state_dict(state["opt"])
        schedule.load_state_dict(state["schedule"])
        history, step = state["history"], state["step"]
        log(f"resumed after step {step}")
    gen = torch.Generator().manual_seed(seed + step)
    for epoch in range(step // steps_per_epoch, epochs):
        if max_steps and step >= max_steps:
            break
        done = step - epoch * steps_per_epoch  # batches of this epoch already trained on
        rng = random.Random(seed + epoch)
        batches = _batches(rows, batch, rng)
        for _ in range(done):
            next(batches)
        bar = tqdm(batches, total=steps_per_epoch, initial=done, desc=f"epoch {epoch + 1}/{epochs}")
        sums, count = {}, 0
        for seqs in bar:
            loss, stats = draft_losses(head, *_pad(seqs, max_len), noise=noise, steps=ttt_steps, generator=gen)
            if not math.isfinite(float(loss)):
                raise FloatingPointError(f"the loss is {float(loss)} at step {step + 1}: stopping (nothing written; "
                                         "lower --lr or --noise)")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
            schedule.step()
            step += 1
            count += 1
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + value
            bar.set_postfix(loss=f"{float(loss):.3f}", top1=f"{stats['top1']:.2f}")
            history.append({"step": step, "loss": float(loss), **stats})
            if max_steps and step >= max_steps:
                break
            if step % checkpoint_every == 0:
                save_checkpoint()
        if count:
            log(f"epoch {epoch + 1}: " + ", ".join(f"{k} {v / count:.3f}" for k, v in sums.items() if k != "tokens"))
        save_checkpoint()
        if max_steps and step >= max_steps:
            break
    return history


# -- the command ---------------------------------------------------------------------------------
#: What ``--tiny`` (the CI run) sets, whatever the command line says (it tells which options it overrides).
TINY = dict(prompts=4, gen_batch=4, max_new=12, vocab=512, max_files=300, documents=4, doc_batch=4, doc_len=48,
            data_workers=1, epochs=3, max_steps=6, batch=2, max_len=64)


def _number(kind, low=None, high=None, low_open=False, high_open=False):
    """An argparse type: ``kind`` (int or float), finite, within the bounds (a message names them)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        ok = math.isfinite(value)
        ok = ok and (low is None or (value > low if low_open else value >= low))
        ok = ok and (high is None or (value < high if high_open else value <= high))
        if not ok:
            lo = "" if low is None else f"{'>' if low_open else '>='} {low}"
            hi = "" if high is None else f"{'<' if high_open else '<='} {high}"
            what = "an integer" if kind is int else "a finite number"
            raise argparse.ArgumentTypeError(f"must be {what} {' and '.join(x for x in (lo, hi) if x)}, got {text}")
        return value
    return parse


def parse_args(argv=None):
    positive, count = _number(int, 1), _number(int, 0)
    parser = argparse.ArgumentParser(prog="python -m experiments.end_to_end.train_draft", description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=count, default=1920, help=f"prompts the target answers (chunks of {GEN_CHUNK})")
    parser.add_argument("--gen-batch", type=positive, default=32, help="prompts per generate call")
    parser.add_argument("--max-new", type=positive, default=128, help="answer tokens per prompt at most")
    parser.add_argument("--documents", type=count, default=0,
                        help=f"teacher-forced document chats (chunks of {DOC_CHUNK}; 0: none)")
    parser.add_argument("--doc-batch", type=positive, default=16, help="document chats per forward")
    parser.add_argument("--doc-len", type=positive, default=384, help="tokens per document chat at most")
    parser.add_argument("--data-workers", type=positive, default=2, help="processes making data shards (one thread each)")
    parser.add_argument("--data-only", action="store_true", help="make the data shards and stop")
    parser.add_argument("--vocab", type=positive, default=12288, help="rows of the draft's reduced LM head")
    parser.add_argument("--epochs", type=positive, default=2, help="passes over the data")
    parser.add_argument("--ttt-steps", type=_number(int, 1, 8), default=3,
                        help="draft steps unrolled in training (each later step weighs 0.8 times the one before)")
    parser.add_argument("--batch", type=positive, default=8, help="sequences per training step")
    parser.add_argument("--max-len", type=_number(int, 8), default=384, help="positions per sequence in training")
    parser.add_argument("--lr", type=_number(float, 0, 1, low_open=True, high_open=True), default=1e-3)
    parser.add_argument("--noise", type=_number(float, 0), default=0.1, help="uniform feature noise, times the mean |h|")
    parser.add_argument("--max-steps", type=count, default=0, help="stop after this many steps (0: all epochs)")
    parser.add_argument("--seed", type=count, default=0)
    parser.add_argument("--threads", type=positive, default=2)
    parser.add_argument("--out", type=Path, default=None,
                        help="where the draft goes (default: draft.safetensors in the run's results folder; the "
                             "shipped file is replaced only when named here)")
    parser.add_argument("--results", type=Path, default=None, help="results root (default results/)")
    parser.add_argument("--max-files", type=positive, default=6000, help="text files read for the prompts")
    parser.add_argument("--tiny", action="store_true",
                        help="the CI run: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in TINY.items()))
    args = parser.parse_args(argv)
    if args.tiny:
        given = sorted(k for k, v in TINY.items() if getattr(args, k) != parser.get_default(k))
        if given:
            print("--tiny sets " + ", ".join(f"--{k.replace('_', '-')} {TINY[k]} (not {getattr(args, k)})" for k in given))
        for k, v in TINY.items():
            setattr(args, k, v)
    if args.out is not None and args.out.exists() and not args.out.is_file():
        parser.error(f"--out {args.out} is not a file")
    if args.prompts + args.documents == 0:
        parser.error("--prompts and --documents are both 0: there is nothing to train on")
    if args.tiny and args.out is not None and _is_shipped(args.out):
        parser.error(f"--tiny writes a toy draft: not over the shipped {args.out}")
    return args


def _is_shipped(path: Path) -> bool:
    from specverify.integrations.learned_draft import DEFAULT_WEIGHTS

    return path.resolve() == DEFAULT_WEIGHTS.resolve()


def main(argv=None):
    import torch

    from specverify.integrations import learned_draft, smollm2

    args = parse_args(argv)
    started = time.time()
    shard_params = {k: getattr(args, k) for k in ("seed", "max_files")}
    args.answers_dir = paths.result_dir(EXPERIMENT, {"answers": {**shard_params, "gen_batch": args.gen_batch,
                                                                   "max_new": args.max_new, "prompts_version": PROMPTS_VERSION}},
                                        args.results, versioned=False)
    args.documents_dir = paths.result_dir(EXPERIMENT, {"documents": {**shard_params, "doc_batch": args.doc_batch,
                                                                       "doc_len": args.doc_len}}, args.results, versioned=False)
    data_params = {k: getattr(args, k) for k in ("prompts", "gen_batch", "max_new", "documents", "doc_batch", "doc_len", "seed")}
    if args.max_files != 6000:
        data_params["max_files"] = args.max_files
    train_params = {**data_params, **{k: getattr(args, k) for k in ("vocab", "epochs", "batch", "max_len", "lr", "noise",
                                                                      "max_steps", "ttt_steps")},
                    "format": FORMAT}
    run_dir = paths.result_dir(EXPERIMENT, {"train": train_params}, args.results)
    print(f"answers: {args.answers_dir}\ndocuments: {args.documents_dir}\nrun: {run_dir}")
    collect_data(args)
    if args.data_only:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    model, tokenizer = smollm2.load(log=print)
    model.requires_grad_(False)
    header = tokenizer(ASSISTANT_HEADER, add_special_tokens=False)["input_ids"]
    sources, tokens_by_kind, rows_by_kind = {}, {}, {"answers": [], "documents": []}
    for kind, c, _, path in shard_plan(args):
        name = f"{kind}_c{c:03d}"
        if name not in sources:
            sources[name] = json.loads((path.parent / f"{name}.json").read_text())["sources"]
        shard_rows = [(t, h, answer_start(t, header)) for t, h in load_sequences([path]) if h.shape[0] >= args.ttt_steps + 2]
        tokens_by_kind[kind] = tokens_by_kind.get(kind, 0) + sum(int(t.numel()) for t, _, _ in shard_rows)
        tokens_by_kind[f"{kind}_trained"] = tokens_by_kind.get(f"{kind}_trained", 0) + sum(
            max(0, min(int(t.numel()), args.max_len + 1) - start) for t, _, start in shard_rows)
        rows_by_kind[kind] += shard_rows
    rows = rows_by_kind["answers"] + rows_by_kind["documents"]
    n_tokens = tokens_by_kind.get("answers", 0) + tokens_by_kind.get("documents", 0)
    always = sorted(set(tokenizer.all_special_ids))
    vocab_ids, coverage = reduced_vocabulary(rows_by_kind["answers"], rows_by_kind["documents"], args.vocab, always)
    print(f"{len(rows)} sequences, {n_tokens} tokens; reduced vocabulary {vocab_ids.numel()} covers {coverage:.3f} "
          "of the answers' tokens")

    torch.manual_seed(args.seed)
    head = learned_draft.FeatureHead(model.config, vocab_ids).attach(model)
    head.init_from_layer(model.model.layers[-1])
    history = train(head, rows, args.epochs, args.batch, args.max_len, args.lr, args.noise, args.seed, run_dir,
                    max_steps=args.max_steps, ttt_steps=args.ttt_steps)
    if not history:
        raise SystemExit(f"no training step was taken (a finished run: its checkpoint is {run_dir / 'checkpoint.pt'})")
    out = args.out if args.out is not None else run_dir / "draft.safetensors"
    last = history[-max(1, len(history) // 10):]
    final_keys = [k for k in history[-1] if k not in ("step", "tokens")]
    meta = {"params": train_params, "sources": sources, "sequences": len(rows), "tokens": n_tokens,
            "tokens_by_kind": tokens_by_kind,
            "vocab_coverage_answers": round(coverage, 4), "minutes": round((time.time() - started) / 60, 1),
            "final": {k: round(sum(h[k] for h in last) / len(last), 4) for k in final_keys},
            "first": {k: round(history[0][k], 4) for k in ("loss", "top1")} if history else {},
            "run": paths.run_metadata()}
    learned_draft.save(head, out, meta=meta)
    (run_dir / "history.json").write_text(json.dumps(history))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): {json.dumps(meta['final'])}")
    return out


if __name__ == "__main__":
    main()
