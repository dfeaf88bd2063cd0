"""Adapters: re-shape arguments between specverify's layout and the layouts verifiers use.

The harness speaks specverify's layout (:mod:`specverify.testing._kinds`).  :func:`adapt` wraps a
verifier written for another layout so the harness can call it; the adapters only re-shape (and,
where a layout draws its bonus outside the verifier, draw it), never verify anything themselves.

Layouts (``layout=`` of the checks and the CLI):

- ``"specverify"``: the harness's own, one round per call (see ``_kinds``).
- ``"batch"``: specverify's ragged :func:`specverify.verify_batch` layout:
  ``fn(target_probs [sum K_r + R, V], draft_probs [sum K_r, V] or None, draft_tokens [sum K_r],
  cu_num_draft_tokens [R + 1], uniforms)`` (sampled mode: ``generator`` in place of ``uniforms``)
  ``-> (output_token_ids [R, K_max + 1] padded with -1, num_accepted [R])``.  The round under test
  is request 1 of 3 (K = 1 before it, K = 0 after it), so the offsets are exercised.
- ``"vllm"``: vLLM V1's flattened batch (notes E.1; rows normalized to probabilities first, as
  vLLM's are): ``fn(draft_token_ids [T], cu_num_draft_tokens
  [R] (inclusive, no leading 0), draft_probs [T, V] or None, target_probs [T, V], bonus_token_ids [R],
  uniform_samples [T], recovery_uniforms [R]) -> output [R, max_spec_len + 1]`` padded with -1
  (sampled mode: ``fn(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs,
  bonus_token_ids, generator)``).  As in vLLM, the bonus token is sampled outside the verifier (here
  by the adapter, from the bonus row with the round's last uniform).
- ``"flashinfer"``: FlashInfer's dense chain signature with explicit uniforms (notes E.3; rows
  normalized to probabilities first):
  ``fn(draft_probs [B, n, V], draft_token_ids [B, n], uniform_samples [B, n + 1], target_probs
  [B, n + 1, V]) -> output_token_ids [B, n + 1]`` (or a tuple starting with it), -1 after the
  emitted tokens (sampled mode: ``fn(draft_probs, draft_token_ids, target_probs, generator)``).  The
  round under test is request 0, padded with one trailing -1 draft (draft row zeros, target row
  repeated): a correct verifier ends the draft there (FlashInfer #879 read -1 as a token id).
  Deterministic drafts are passed as one-hot draft rows.  Slots K and K + 1 of the request's
  uniforms both carry the round's last uniform.
- ``"hf"``: transformers' ``_speculative_sampling(candidate_input_ids [1, 1 + K], candidate_logits
  [1, K, V], candidate_length, new_logits [1, K + 1, V]) -> (valid_tokens [1, n + 1], n_matches)``;
  logits are ``log`` of the rows.  It draws its own randomness (torch's default generator): sampled
  mode only, chain only.

And the other direction, to run specverify's ops through other projects' test scenarios:
:func:`specverify_as_flashinfer`, :func:`specverify_as_vllm`, :func:`specverify_as_hf`.
"""

import numpy as np

from ._calls import VerifierFault, as_int
from .models import inverse_cdf

__all__ = ["LAYOUTS", "KIND_NAMES", "adapt", "with_generator", "specverify_as_flashinfer", "specverify_as_vllm", "specverify_as_hf",
           "draw_uniforms"]

LAYOUTS = ("specverify", "batch", "vllm", "flashinfer", "hf")
KIND_NAMES = ("chain", "block", "tree", "greedy")

_NAMES = {
    ("chain", "exact"): ("target_probs", "draft_probs", "draft_tokens", "uniforms"),
    ("chain", "sampled"): ("target_probs", "draft_probs", "draft_tokens", "generator"),
    ("tree", "exact"): ("target_probs", "draft_probs", "draft_tokens", "parents", "uniforms"),
    ("tree", "sampled"): ("target_probs", "draft_probs", "draft_tokens", "parents", "generator"),
}


def draw_uniforms(generator, n):
    """``[n]`` float64 uniforms in [0, 1) from a torch or NumPy generator (one call)."""
    if isinstance(generator, np.random.Generator):
        return generator.random(n)
    import torch

    return torch.rand(n, dtype=torch.float64, generator=generator).numpy()


def adapt(verifier, kind, layout, mode):
    """``(fn, arg_names)``: ``verifier`` (written for ``layout``) as a function of the harness's
    layout for ``kind`` and ``mode`` ("exact": uniforms in, "sampled": a generator in)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if kind not in KIND_NAMES:
        raise ValueError(f"kind must be one of {KIND_NAMES}, got {kind!r}")
    if not callable(verifier):
        raise TypeError(f"verifier must be callable, got {type(verifier).__name__}")
    names = _NAMES[("tree" if kind == "tree" else "chain", mode)]
    if layout == "specverify":
        return verifier, names
    if kind == "tree":
        raise ValueError(f"layout {layout!r} is a chain layout; tree verifiers use layout='specverify'")
    if layout == "hf" and mode == "exact":
        raise ValueError("the hf layout (transformers' _speculative_sampling) draws its own randomness: "
                         "use mode='sampled'")
    wrap = {"batch": _from_batch, "vllm": _from_vllm, "flashinfer": _from_flashinfer, "hf": _from_hf}[layout]
    return wrap(verifier, mode), names


def _randomness(mode, last):
    """The final uniform of a round: given (exact) or drawn (sampled)."""
    return last


def _array(x):
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _parse_padded_row(row, tokens, vocab, layout):
    """``(n, next_token)`` from an output row: emitted tokens, then -1 only."""
    row = [as_int(x, "output_token_ids[...]") for x in _array(row).tolist()]
    k = len(tokens)
    end = row.index(-1) if -1 in row else len(row)
    if any(x != -1 for x in row[end:]):
        raise VerifierFault("wrong output", f"output row {row} has tokens after a -1 placeholder: was a -1 padded "
                            "draft read as a token (FlashInfer #879)?")
    if end == 0:
        raise VerifierFault("wrong output", f"output row {row} emits no token")
    n = end - 1
    if n > k:
        raise VerifierFault("wrong output", f"output row {row} emits {n} drafts but the request has K = {k}: "
                            "padding read as a token?")
    if list(row[:n]) != [int(t) for t in tokens[:n]]:
        raise VerifierFault("wrong output", f"output row {row} does not start with the accepted drafts "
                            f"{[int(t) for t in tokens[:n]]}")
    if not 0 <= row[n] < vocab:
        raise VerifierFault("out-of-range token", f"output row {row}: token {row[n]} is outside [0, V = {vocab})")
    return n, row[n]


def _normalized(rows):
    """Rows as probabilities (float32, each row divided by its mass): the vLLM and FlashInfer
    layouts carry normalized probabilities; the harness's rows have any mass (a power of 2 in
    exact mode, so the division is exact)."""
    if rows is None:
        return None
    rows = np.asarray(rows, dtype=np.float32)
    mass = rows.astype(np.float64).sum(axis=-1, keepdims=True)
    return (rows / np.where(mass > 0, mass, 1.0)).astype(np.float32)


def _dummy_rows(count, vocab, dtype):
    return np.full((count, vocab), 1.0 / vocab, dtype=dtype)


def _from_batch(fn, mode):
    def call(target_probs, draft_probs, draft_tokens, randomness):
        k, vocab = len(draft_tokens), target_probs.shape[1]
        dt = target_probs.dtype
        target = np.concatenate([_dummy_rows(2, vocab, dt), target_probs, _dummy_rows(1, vocab, dt)])
        draft = None if draft_probs is None else np.concatenate(
            [_dummy_rows(1, vocab, dt), np.asarray(draft_probs).reshape(k, vocab)])
        tokens = np.concatenate([[0], draft_tokens]).astype(np.int64)
        cu = np.array([0, 1, 1 + k, 1 + k], dtype=np.int64)
        if mode == "exact":
            u = np.concatenate([[0.5, 0.5], randomness, [0.5]])
            out, accepted = fn(target, draft, tokens, cu, u)
        else:
            out, accepted = fn(target, draft, tokens, cu, randomness)
        out = _array(out)
        if out.ndim != 2 or out.shape[0] != 3:
            raise VerifierFault("wrong output", f"output_token_ids must be [R = 3, K_max + 1], got shape {list(out.shape)}")
        n, token = _parse_padded_row(out[1], draft_tokens, vocab, "batch")
        if as_int(_array(accepted)[1], "num_accepted[1]") != n:
            raise VerifierFault("wrong output", f"num_accepted[1] = {_array(accepted)[1]} disagrees with the output row "
                                f"{out[1].tolist()}")
        return n, token

    return call


def _from_vllm(fn, mode):
    def call(target_probs, draft_probs, draft_tokens, randomness):
        target_probs, draft_probs = _normalized(target_probs), _normalized(draft_probs)
        k, vocab = len(draft_tokens), target_probs.shape[1]
        dt = target_probs.dtype
        # Requests: K = 1 (dummy), the round (K), K = 0 (dummy).  vLLM's target rows are the
        # verification rows only; the bonus rows go to its main sampler (here: this adapter).
        target = np.concatenate([_dummy_rows(1, vocab, dt), np.asarray(target_probs)[:k]])
        draft = None if draft_probs is None else np.concatenate(
            [_dummy_rows(1, vocab, dt), np.asarray(draft_probs).reshape(k, vocab)])
        tokens = np.concatenate([[0], draft_tokens]).astype(np.int64)
        cu = np.array([1, 1 + k, 1 + k], dtype=np.int64)
        if mode == "exact":
            last = float(randomness[k])
            bonus = np.array([0, inverse_cdf(target_probs[k], last), 0], dtype=np.int64)
            out = fn(tokens, cu, draft, target, bonus, np.concatenate([[0.5], randomness[:k]]),
                     np.array([0.5, last, 0.5]))
        else:
            last = float(draw_uniforms(randomness, 1)[0])
            bonus = np.array([0, inverse_cdf(target_probs[k], last), 0], dtype=np.int64)
            out = fn(tokens, cu, draft, target, bonus, randomness)
        out = _array(out)
        if out.ndim != 2 or out.shape[0] != 3:
            raise VerifierFault("wrong output", f"output must be [R = 3, max_spec_len + 1], got shape {list(out.shape)}")
        return _parse_padded_row(out[1], draft_tokens, vocab, "vllm")

    return call


def _from_flashinfer(fn, mode):
    def call(target_probs, draft_probs, draft_tokens, randomness):
        target_probs, draft_probs = _normalized(target_probs), _normalized(draft_probs)
        k, vocab = len(draft_tokens), target_probs.shape[1]
        n = k + 1  # one trailing -1 pad in request 0
        dt = np.float32
        draft = np.zeros((2, n, vocab), dtype=dt)
        if draft_probs is None:
            draft[0, np.arange(k), draft_tokens] = 1.0
        else:
            draft[0, :k] = np.asarray(draft_probs).reshape(k, vocab)
        draft[1] = 1.0 / vocab
        target = np.empty((2, n + 1, vocab), dtype=dt)
        target[0, : k + 1] = target_probs
        target[0, k + 1] = target_probs[k]
        target[1] = 1.0 / vocab
        ids = np.zeros((2, n), dtype=np.int64)
        ids[0, :k] = draft_tokens
        ids[0, k] = -1
        if mode == "exact":
            u = np.full((2, n + 1), 0.5)
            u[0, :k] = randomness[:k]
            u[0, k:] = randomness[k]
            out = fn(draft, ids, u, target)
        else:
            out = fn(draft, ids, target, randomness)
        if isinstance(out, (tuple, list)):
            out = out[0]
        out = _array(out)
        if out.shape != (2, n + 1):
            raise VerifierFault("wrong output", f"output_token_ids must be [B = 2, n + 1 = {n + 1}], got shape "
                                f"{list(out.shape)}")
        return _parse_padded_row(out[0], draft_tokens, vocab, "flashinfer")

    return call


def _from_hf(fn, mode):
    import torch

    cache = {}

    def logits(rows):
        key = id(rows)
        if key not in cache or cache[key][0] is not rows:
            with np.errstate(divide="ignore"):
                cache.clear() if len(cache) > 8 else None
                cache[key] = (rows, torch.from_numpy(np.log(np.asarray(rows, dtype=np.float32)))[None])
        return cache[key][1]

    def call(target_probs, draft_probs, draft_tokens, generator):
        if draft_probs is None:
            raise VerifierFault("raised", "the hf layout needs the draft's logits (transformers' "
                                "_speculative_sampling has no deterministic-draft path); use draft='stochastic'")
        k = len(draft_tokens)
        ids = torch.from_numpy(np.concatenate([[0], draft_tokens]).astype(np.int64))[None]
        valid, n_matches = fn(ids, logits(draft_probs), k, logits(target_probs))
        valid = _array(valid).reshape(-1)
        n = as_int(_array(n_matches).reshape(-1)[0] if _array(n_matches).size == 1 else n_matches, "n_matches")
        if valid.size != n + 1:
            raise VerifierFault("wrong output", f"valid_tokens has {valid.size} tokens, n_matches = {n} (expected n + 1)")
        if not 0 <= n <= k or list(valid[:n]) != list(draft_tokens[:n]):
            raise VerifierFault("wrong output", f"valid_tokens {valid.tolist()} / n_matches {n} disagree with the "
                                f"drafts {list(draft_tokens)}")
        return n, as_int(valid[n], "valid_tokens[-1]")

    return call


# ---------------------------------------------------------------------------------------------
# specverify's ops in other projects' layouts (for their test scenarios).
# ---------------------------------------------------------------------------------------------

def specverify_as_flashinfer(method="token"):
    """specverify's ``verify_batch`` behind FlashInfer's explicit-uniform chain signature:
    ``f(draft_probs [B, n, V] or None, draft_token_ids [B, n], uniform_samples [B, n + 1],
    target_probs [B, n + 1, V]) -> (output_token_ids [B, n + 1] int32, emitted_draft_num [B])``.

    Request b's drafts end at its first -1 (``specverify.verify.batch.from_flashinfer``); it uses
    ``uniform_samples[b, :K_b]`` as coins and ``uniform_samples[b, n]`` for the final draw.
    FlashInfer's ``output_accepted_token_num`` (independent passes, accumulated) is not produced.
    """
    import specverify as sv
    from specverify.verify import batch

    def f(draft_probs, draft_token_ids, uniform_samples, target_probs):
        target, draft, tokens, cu = batch.from_flashinfer(draft_probs, draft_token_ids, target_probs)
        u_rows = _array(uniform_samples).astype(np.float64)
        k = np.diff(cu)
        u = np.concatenate([np.concatenate([u_rows[b, : k[b]], u_rows[b, -1:]]) for b in range(k.size)])
        out, accepted = sv.verify_batch(target, draft, tokens, cu, method=method, uniforms=u)
        return batch.to_flashinfer_output(out, accepted, _array(draft_token_ids).shape[1])

    return f


def specverify_as_vllm(method="token"):
    """specverify's ``verify_batch`` behind vLLM V1's layout with explicit uniforms:
    ``f(draft_token_ids [T], cu_num_draft_tokens [R] (inclusive), draft_probs [T, V] or None,
    target_probs [T + R, V] (each request's K_r rows then its bonus row), uniforms, max_spec_len)
    -> output [R, max_spec_len + 1] int32`` padded with -1.

    Difference of convention: vLLM samples the bonus outside its rejection sampler; here the bonus
    row is part of ``target_probs`` and the request's last uniform draws it.
    """
    import specverify as sv
    from specverify.verify import batch

    def f(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, uniforms, max_spec_len, method=method):
        cu_inc = _array(cu_num_draft_tokens).astype(np.int64)
        r = cu_inc.size
        cu = np.concatenate([[0], cu_inc])
        target_index = np.concatenate([np.arange(cu[i], cu[i + 1]) + i for i in range(r)]).astype(np.int64)
        bonus_index = (cu[1:] + np.arange(r)).astype(np.int64)
        t, d, tok, cu2 = batch.from_vllm_v1(target_probs, draft_token_ids, cu_inc, target_index, bonus_index,
                                            draft_probs)
        out, accepted = sv.verify_batch(t, d, tok, cu2, method=method, uniforms=uniforms)
        return batch.to_vllm_v1_output(out, accepted, max_spec_len)

    return f


def specverify_as_hf(generator=None):
    """``sv.accept_logits`` behind transformers' ``_speculative_sampling`` signature:
    ``f(candidate_input_ids [1, L + K], candidate_logits [1, K, V], candidate_length, new_logits
    [1, K + 1, V]) -> (valid_tokens [1, n + 1], n_matches)`` (tensors)."""
    import torch

    import specverify as sv

    def f(candidate_input_ids, candidate_logits, candidate_length, new_logits):
        k = int(candidate_length)
        drafts = candidate_input_ids[0, -k:] if k else candidate_input_ids[0, :0]
        n, token = sv.accept_logits(new_logits[0].float().contiguous(), candidate_logits[0].float().contiguous(),
                                    drafts, generator)
        valid = torch.cat([drafts[:n], torch.tensor([token], dtype=drafts.dtype)])[None]
        return valid, torch.tensor(n)

    return f


def with_generator(fn, kind="chain", layout="specverify"):
    """A sampled-mode verifier from an exact-mode one: draws the uniforms ``fn`` takes from the
    generator (in one call: K + 1 for chains, N + 1 for trees, ``[B, n + 1]`` for the flashinfer
    layout), then calls ``fn``."""
    if layout == "flashinfer":
        def sampled(draft_probs, draft_token_ids, target_probs, generator):
            b, n = np.shape(draft_token_ids)
            return fn(draft_probs, draft_token_ids, draw_uniforms(generator, b * (n + 1)).reshape(b, n + 1), target_probs)
    elif layout != "specverify":
        raise ValueError(f"with_generator supports the specverify and flashinfer layouts, got {layout!r}")
    elif kind == "tree":
        def sampled(target_probs, draft_probs, draft_tokens, parents, generator):
            return fn(target_probs, draft_probs, draft_tokens, parents, draw_uniforms(generator, len(draft_tokens) + 1))
    else:
        def sampled(target_probs, draft_probs, draft_tokens, generator):
            return fn(target_probs, draft_probs, draft_tokens, draw_uniforms(generator, len(draft_tokens) + 1))
    sampled.__name__ = f"{getattr(fn, '__name__', 'verifier')}_with_generator"
    sampled.draws_uniforms = True  # check_sampled's hint about uniform-taking verifiers does not apply
    return sampled
