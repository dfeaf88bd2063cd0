"""The learned draft's self-distillation data: stage 2 of :mod:`experiments.end_to_end.train_draft`.

Three kinds, all stored as shards of int32 tokens and float16 last-layer hidden states ``h_t`` of
every position (a forward pre-hook on the target's final norm keeps them, so the soft labels -- the
target's distribution at every position, ``softmax(W norm(h_t))`` -- need no second pass):

- *answers* (:func:`generate_shard`): the target answers each prompt (batched ``generate``, half
  greedy, half sampled at temperature 0.7 / top-p 0.9, up to ``--max-new`` tokens): the draft's
  inputs at inference (the target's own tokens) exactly, at ~75 tokens/s on one core;
- *documents* (:func:`document_shard`): one teacher-forced forward over a chat whose user turn asks
  to continue a piece of a file and whose assistant turn is the text that follows it in that file:
  the target's features and distributions on text it did not write, at ~200 tokens/s on one core
  (no decoding), so the data grows ~3x faster per core;
- *requests* (:func:`write_requests`, then :func:`generate_shard`): the target's answers to
  requests it writes itself (Magpie: its chat template up to the user turn, sampled), drawn shard
  by shard (``gen_batch`` draws, the unfinished dropped: ~26 of 32 kept): what a chat model is asked,
  by the model's own account, with no template of ours; phase 2's ``--more-source target``.

All are drawn in chunks (``GEN_CHUNK`` prompts, ``DOC_CHUNK`` documents:
:mod:`experiments.end_to_end.draft_prompts`), chunk ``c`` from its own seed, so a larger
``--prompts`` or ``--documents`` adds chunks and keeps every shard already made. :func:`shard_plan`
names every shard of a run; :func:`make_shards` makes the missing ones (resumable);
:func:`collect_data` runs ``--data-workers`` processes (one torch thread each) side by side;
:func:`load_sequences` reads shards back.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .draft_prompts import (CHUNK_SEED_STRIDE, DOC_CHUNK, GEN_CHUNK, REQUEST_MIN_WORDS, REQUEST_SAMPLING, REQUEST_SOURCES,
                            REQUEST_TOKENS, document_chunk, prompt_chunk)


#: Added to a requests shard's seed for the draw of its requests (its answers are drawn from the seed itself).
REQUEST_SEED_OFFSET = 500_001


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


def write_requests(model, tokenizer, n: int, seed: int):
    """Up to ``n`` requests the target writes itself (:data:`~.draft_prompts.REQUEST_SAMPLING`): one
    batched ``generate`` from its chat template up to the user turn, the finished turns of
    ``REQUEST_MIN_WORDS`` words or more kept, in draw order (strings)."""
    import torch

    system_and_user = tokenizer.apply_chat_template([{"role": "user", "content": "\x00"}], tokenize=False)
    prefix = system_and_user[: system_and_user.index("\x00")]  # the template's text before a user turn's content
    ids = tokenizer([prefix] * n, return_tensors="pt", add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(**ids, do_sample=True, top_k=0, max_new_tokens=REQUEST_TOKENS, eos_token_id=end,
                             pad_token_id=tokenizer.pad_token_id, **REQUEST_SAMPLING)
    drawn = (kept_request(row, end, tokenizer.decode) for row in out[:, ids["input_ids"].shape[1]:].tolist())
    return [text for text in drawn if text is not None]


def kept_request(row, end: int, decode):
    """The request in the drawn tokens ``row`` (a list), or None: a turn that never ends (a page of
    text, not a request), has fewer than ``REQUEST_MIN_WORDS`` words or opens another turn."""
    if end not in row:
        return None
    text = decode(row[: row.index(end)]).strip()
    return text if len(text.split()) >= REQUEST_MIN_WORDS and "<|im_start|>" not in text else None


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
    """Chunk ``c``'s prompts (kind ``answers``) or chats (``documents``), cached as JSON (kind
    ``requests``: none, the target writes them shard by shard; the JSON says how)."""
    path = data_dir / f"{kind}_c{c:03d}.json"
    if path.is_file():
        return json.loads(path.read_text())["items"]
    if kind == "requests":
        items, sources = [], REQUEST_SOURCES
    else:
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
    skip = getattr(args, "prompts_from", 0)  # the answers to prompts skip .. skip + prompts (skip: a multiple of gen_batch)
    requests = getattr(args, "requests", 0)
    for kind, lo, total, chunk, batch, folder in (
            ("answers", skip, skip + args.prompts, GEN_CHUNK, args.gen_batch, args.answers_dir),
            ("requests", 0, requests, GEN_CHUNK, args.gen_batch, getattr(args, "requests_dir", None)),
            ("documents", 0, args.documents, DOC_CHUNK, args.doc_batch, args.documents_dir)):
        for c in range(lo // chunk, math.ceil(total / chunk)):
            for s in range(max(0, lo - c * chunk) // batch, math.ceil(min(chunk, total - c * chunk) / batch)):
                plan.append((kind, c, s, folder / f"shard_c{c:03d}_{s:05d}.pt"))
    return plan


def _claim(path: Path) -> bool:
    """Whether this process makes ``path``'s shard: the first to create its claim file does."""
    try:
        os.close(os.open(path.with_suffix(".claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _drop_claims(plan) -> None:
    """Remove the claim files of ``plan``'s folders (a stopped run's claims are stale)."""
    for folder in {path.parent for *_, path in plan}:
        for claim in folder.glob("*.claim"):
            claim.unlink(missing_ok=True)


def make_shards(args, worker: int = 0, workers: int = 1) -> int:
    """Make the missing shards of :func:`shard_plan`, each by the first worker to claim it, in the
    plan's order (resumable: shards on disk are kept). Workers take the next unclaimed shard as they
    finish one, so none finishes long before another (sampled answers, every other shard, run longer
    than greedy ones: a fixed split by position gave one worker all of them). Every shard is drawn
    from its own seed, so which worker makes it does not change it. Returns the shards made."""
    import torch
    from tqdm import tqdm

    from specverify.integrations import smollm2

    torch.set_num_threads(1)  # one process per core: two threads each would oversubscribe them
    todo = [item for item in shard_plan(args) if not item[3].is_file()]
    if not todo:
        return 0
    model, tokenizer = smollm2.load(log=lambda *a: None)
    made = 0
    # no total: each worker makes about 1/workers of the missing shards, which it cannot know ahead
    bar = tqdm(desc=f"data (worker {worker + 1}/{workers}; {len(todo)} shards missing in all)", unit="shard",
               position=worker)
    for kind, c, s, path in todo:
        if path.is_file() or not _claim(path):
            continue
        folder = path.parent
        items = _chunk_inputs(kind, c, folder, args.seed, args.max_files)
        seed = args.seed + CHUNK_SEED_STRIDE * c + s
        if kind in ("answers", "requests"):
            if kind == "answers":
                chunk = items[s * args.gen_batch : (s + 1) * args.gen_batch]
            else:  # the same seeds as the answers' shards would be fine; an offset keeps the two draws apart
                chunk = write_requests(model, tokenizer, args.gen_batch, seed + REQUEST_SEED_OFFSET)
            rows = generate_shard(model, tokenizer, chunk, args.max_new, sample=bool(s % 2), seed=seed) if chunk else []
        else:
            chunk = items[s * args.doc_batch : (s + 1) * args.doc_batch]
            rows = document_shard(model, tokenizer, chunk, args.doc_len)
        _save(rows, path)
        made += 1
        bar.update(1)
    bar.close()
    return made


def collect_data(args):
    """All shards of the run, made by ``args.data_workers`` processes side by side. Returns paths."""
    plan = shard_plan(args)
    for _, c, _, path in plan:  # the chunks' inputs once, before the workers share them
        path.parent.mkdir(parents=True, exist_ok=True)
    for kind, c, folder in sorted({(k, c, p.parent) for k, c, _, p in plan if not p.is_file()}):
        _chunk_inputs(kind, c, folder, args.seed, args.max_files)
    workers = min(args.data_workers, max(1, sum(not p.is_file() for *_, p in plan)))
    _drop_claims(plan)
    try:
        if workers == 1:
            make_shards(args)
        else:
            import concurrent.futures
            import multiprocessing

            with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                for future in [pool.submit(make_shards, args, w, workers) for w in range(workers)]:
                    future.result()
    finally:
        _drop_claims(plan)
    return [path for *_, path in plan]


def load_sequences(shards):
    import torch

    rows = []
    for path in shards:
        rows += torch.load(path)
    return rows
