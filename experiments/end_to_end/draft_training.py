"""Training the learned draft: stage 3 of :mod:`experiments.end_to_end.train_draft`.

Pair ``t`` is ``(h_t, x_{t+1})``; the draft's output ``f_t`` is pulled towards
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

:func:`draft_losses` is one batch's loss over the unrolled steps, :func:`train` the loop (AdamW,
checkpoints, resumable), :func:`reduced_vocabulary` the head's rows and :func:`answer_start` where a
sequence's answer begins.
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path

#: What the chat template puts before an assistant turn: the answer starts after its last occurrence.
ASSISTANT_HEADER = "<|im_start|>assistant\n"
#: What :func:`train` may compute the forward's matrix products in.
PRECISIONS = ("float32", "bfloat16")
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


def first_positions(tokens, n_vocab: int):
    """``[B, V]`` int32: where each token first occurs in each row of ``tokens [B, L]`` (``L``:
    nowhere). A draft's context rows after the prefix ``x_0 .. x_p`` are the tokens ``v`` with
    ``first[b, v] <= p``."""
    import torch

    batch, length = tokens.shape
    first = torch.full((batch, n_vocab), length, dtype=torch.int32)
    return first.scatter_reduce_(1, tokens, torch.arange(length, dtype=torch.int32).expand(batch, length), reduce="amin")


def argmax_over_rows(x, full_head, row_ids=None, first=None, seq=None, last=None, chunk: int = 256):
    """The argmax over the whole vocabulary of ``full_head x`` (``x [n, d]`` normalized features,
    ``full_head [V, d]``), among the tokens a draft may propose: all (``row_ids`` None), those of
    ``row_ids [V_r]`` (its trained rows), and with ``first [B, V]`` (:func:`first_positions`),
    ``seq [n]`` and ``last [n]`` also those of each position's prefix ``x_0 .. x_last`` in sequence
    ``seq`` (its context rows). ``[n]`` int64 token ids; ``chunk`` rows at a time (``n x V`` floats
    are large)."""
    import torch
    import torch.nn.functional as F

    if row_ids is not None:
        in_rows = torch.zeros(full_head.shape[0], dtype=torch.bool)  # [V]
        in_rows[row_ids] = True
    out = []
    for lo in range(0, x.shape[0], chunk):
        z = F.linear(x[lo : lo + chunk], full_head)  # [c, V]
        if row_ids is not None:
            allowed = in_rows[None].expand_as(z)
            if first is not None:
                allowed = allowed | (first[seq[lo : lo + chunk]] <= last[lo : lo + chunk, None])
            z = z.masked_fill(~allowed, float("-inf"))
        out.append(z.argmax(-1))
    return torch.cat(out) if out else torch.empty(0, dtype=torch.int64)


def draft_losses(head, tokens, hidden, learn, noise: float, steps: int = 3, decay: float = 0.8, generator=None,
                 full_head=None, first=None):
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
    target's over the reduced vocabulary, step ``s``; ``overlap1``: ``sum min(p, q)`` at step 0,
    the acceptance rate there). ``full_head`` ``[V, d]`` (the target's whole LM head; evaluation):
    ``top1_s`` against the target's argmax over all ``V`` tokens instead, what greedy acceptance
    asks (a position whose argmax lies outside the rows counts as missed, not as matched against
    the best of the rows); with ``first [B, V]`` (:func:`first_positions` of ``tokens``) the draft
    proposes from its context rows too, as it does in decoding: row ``j``'s call has the prefix
    ``x_0 .. x_{j+1}``.
    """
    import torch
    import torch.nn.functional as F

    B, T, d = hidden.shape
    if T < steps + 2:
        raise ValueError(f"sequences need at least {steps + 3} tokens")
    feats = hidden[:, :-1]  # h_0 .. h_{T-2}
    if noise:
        feats = feats + noise * (torch.rand(feats.shape, generator=generator) - 0.5) * feats.abs().mean()
    # The LM head (V_r x d, ~2/3 of a pair's work) is applied to labelled positions only: the
    # others (the prompt and chat template, ~45 % of the tokens here, and padding) are context,
    # whose features and keys are still computed.
    labelled = learn[:, 1:]  # [B, T-1]: label position t + 1 is an answer token
    row_of = torch.full((B, T - 1), -1, dtype=torch.int64)  # [B, T-1] -> row of labels
    row_of[labelled] = torch.arange(int(labelled.sum()))
    with torch.no_grad():
        targets = head.final_norm(hidden[:, 1:][labelled])  # [N, d]: position t+1's normalized feature
        labels = torch.softmax(F.linear(targets, head.head), dim=-1)  # [N, V_r]: the target's distribution there
        if full_head is not None:  # [N]: the target's argmax over all V
            truth = argmax_over_rows(targets, full_head)
    n0 = T - 1  # rows of step 0 (true pairs 0 .. T-2)
    loss, stats, past, f = 0.0, {}, None, None
    for s in range(steps):
        rows = n0 - s  # step s has rows j = 0 .. T-2-s
        if s == 0:
            f, past = head.layer(feats, tokens[:, 1:T], torch.arange(n0))
        else:
            held = past[0].shape[2]  # the true pairs, then rows' keys of steps 1 .. s-1
            mask = torch.zeros(rows, held + rows, dtype=torch.bool)
            mask[:, :n0] = torch.ones(rows, n0, dtype=torch.bool).tril()  # true pairs 0 .. j
            j = torch.arange(rows)
            for earlier in range(1, s + 1):  # own pairs of steps 1 .. s-1 (row j), and itself
                offset = n0 + sum(n0 - e for e in range(1, earlier))
                mask[j, offset + j] = True
            f, past = head.layer(f[:, :rows], tokens[:, s + 1 : s + 1 + rows], torch.arange(s, s + rows), past=past,
                                 mask=mask)
        picked = learn[:, s + 1 : s + 1 + rows]  # [B, rows]: label position j + s + 1 is an answer token
        at = row_of[:, s : s + rows][picked]  # [n] rows of labels / targets
        count = max(1, at.numel())
        labelled_f = f[picked]  # [n, d]
        z = head.logits(labelled_f)  # [n, V_r]
        ce = -(labels[at] * F.log_softmax(z, -1)).sum(-1)  # [n]
        reg = F.smooth_l1_loss(head.final_norm(labelled_f), targets[at], reduction="none").mean(-1)  # [n]
        loss = loss + decay**s * (ce + 10 * reg).sum() / count
        with torch.no_grad():
            stats[f"ce{s + 1}"] = float(ce.sum() / count)
            if full_head is None:
                right = z.argmax(-1) == labels[at].argmax(-1)
            elif first is None:
                right = head.vocab_ids[z.argmax(-1)] == truth[at]
            else:
                b, j = picked.nonzero(as_tuple=True)  # row j's call: the prefix x_0 .. x_{j+1}
                right = argmax_over_rows(head.final_norm(labelled_f), full_head, head.vocab_ids, first, b, j + 1) == truth[at]
            stats[f"top{s + 1}"] = float(right.float().sum() / count)
            if s == 0:
                stats["overlap1"] = float(torch.minimum(torch.softmax(z, -1), labels[at]).sum(-1).sum() / count)
                stats["tokens"] = int(at.numel())
    return loss, stats


def train(head, rows, epochs: int, batch: int, max_len: int, lr: float, noise: float, seed: int,
          ckpt_dir: Path, max_steps: int = 0, checkpoint_every: int = 50, ttt_steps: int = 3,
          precision: str = "float32", log=print):
    """AdamW with warmup and cosine decay; a checkpoint every ``checkpoint_every`` steps and at the
    end of each epoch (resumable mid-epoch: the epoch's batch order is a function of the seed; a
    finished run resumed trains nothing more). A non-finite loss stops the run with a
    FloatingPointError before the step is taken (the last checkpoint stays as it was).
    ``precision="bfloat16"``: the forward's matrix products in bfloat16 (CPU autocast; weights,
    optimizer, softmaxes and losses stay float32), ~1.5x faster a step on a CPU with native
    bfloat16 (AVX512-BF16, AMX), slower without it. Returns the loss log: per step ``step``,
    ``seconds`` (the training's wall time so far, summed over resumed runs), ``loss`` and the
    stats of :func:`draft_losses`."""
    import torch
    from tqdm import tqdm

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
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
    # the training's wall time so far, over every process that resumed it (what the metadata says it cost)
    clock, trained = time.time(), history[-1].get("seconds", 0.0) if history else 0.0
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
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
                loss, stats = draft_losses(head, *_pad(seqs, max_len), noise=noise, steps=ttt_steps, generator=gen)
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"the loss is {loss_value} at step {step + 1}: stopping (nothing written; "
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
            bar.set_postfix(loss=f"{loss_value:.3f}", top1=f"{stats['top1']:.2f}")
            history.append({"step": step, "seconds": round(trained + time.time() - clock, 1), "loss": loss_value,
                            **stats})
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
