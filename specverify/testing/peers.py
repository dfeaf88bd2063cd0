"""Pure-torch re-implementations of other projects' verifier semantics, written from their public
documentation and the shared notes (sections E.1 and E.3), not from their code: evidence that the
harness works on verifiers nobody here wrote, and the other side of the ported peer test suites.

- :func:`flashinfer_style_chain`: FlashInfer's ``chain_speculative_sampling`` semantics with
  explicit uniforms (the older signature): accept iff ``u_i * q(x_i) < p(x_i)`` (strict); at the
  first rejection sample ``relu(p - q)`` at that row; -1 after; a bonus from row n if all n pass.
  ``output_accepted_token_num`` counts the positions passing the ratio test *independently* (not
  tau), ``output_emitted_draft_token_num`` is tau.  Uniform slot ``i`` is position i's coin and
  slot ``i + 1`` draws the token that follows a rejection at i (so the bonus uses slot n): our
  reading, stated because FlashInfer's own indexing is not documented.  ``guard_padding`` ends a
  draft at a -1 id (FlashInfer PR #3551); False reproduces FlashInfer #879.
- :func:`vllm_v1_style_rejection_sample`: vLLM V1's rejection sampler semantics with its own
  randomness: float64 uniforms per draft token, accept iff ``q(x) > 0 and p(x) / q(x) >= u``
  (``p(x) >= u`` without draft probs), the recovered token ``argmax(relu(p - q) / E)`` with one
  ``E ~ Exp(1)^V`` per request (``p`` with ``x`` zeroed without draft probs), the bonus token given
  (sampled outside by vLLM's main sampler), output ``[R, max_spec_len + 1]`` padded with -1.
- :func:`transformers_speculative_sampling`: the installed transformers'
  ``generation.utils._speculative_sampling`` itself.
"""

import numpy as np

__all__ = ["flashinfer_style_chain", "vllm_v1_style_rejection_sample", "transformers_speculative_sampling"]


def _tensor(x, dtype=None):
    import torch

    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))
    return t if dtype is None else t.to(dtype)


def _inverse_cdf(weights, u):
    import torch

    c = torch.cumsum(weights.to(torch.float64), 0)
    return int(min(int(torch.searchsorted(c, torch.tensor([u * float(c[-1])], dtype=torch.float64), right=True)),
                   weights.numel() - 1))


def flashinfer_style_chain(draft_probs, draft_token_ids, uniform_samples, target_probs, guard_padding=True):
    """FlashInfer-style chain speculative sampling (explicit uniforms).

    Args:
        draft_probs: ``[B, n, V]``.  draft_token_ids: ``[B, n]`` (-1: padding).
        uniform_samples: ``[B, n + 1]`` in [0, 1).  target_probs: ``[B, n + 1, V]``.
        guard_padding: treat a -1 draft id as the end of the draft (rejected without a coin).

    Returns:
        ``(output_token_ids [B, n + 1] int64, output_accepted_token_num [B], output_emitted_draft_token_num [B])``.
    """
    import torch

    q = _tensor(draft_probs, torch.float32)
    ids = _tensor(draft_token_ids, torch.int64)
    u = _tensor(uniform_samples, torch.float64)
    p = _tensor(target_probs, torch.float32)
    b, n = ids.shape
    out = torch.full((b, n + 1), -1, dtype=torch.int64)
    accepted_num = torch.zeros(b, dtype=torch.int32)
    emitted_num = torch.zeros(b, dtype=torch.int32)
    for r in range(b):
        stop = None
        for i in range(n):
            x = int(ids[r, i])
            if guard_padding and x < 0:
                passes = False
            else:
                passes = bool(float(u[r, i]) * float(q[r, i, x]) < float(p[r, i, x]))
            accepted_num[r] += int(passes)
            if stop is None and not passes:
                stop = i
        if stop is None:
            out[r, :n] = ids[r]
            out[r, n] = _inverse_cdf(p[r, n], float(u[r, n]))
            emitted_num[r] = n
        else:
            out[r, :stop] = ids[r, :stop]
            residual = torch.clamp(p[r, stop] - q[r, stop], min=0.0)
            if float(residual.sum()) <= 0:
                residual = p[r, stop]
            out[r, stop] = _inverse_cdf(residual, float(u[r, stop + 1]))
            emitted_num[r] = stop
    return out, accepted_num, emitted_num


def vllm_v1_style_rejection_sample(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                                   generator=None):
    """vLLM-V1-style rejection sampling of a flattened batch (its own randomness).

    Args:
        draft_token_ids: ``[T]``.  cu_num_draft_tokens: ``[R]`` inclusive cumulative counts.
        draft_probs: ``[T, V]`` or None.  target_probs: ``[T, V]`` (the verification rows).
        bonus_token_ids: ``[R]`` (sampled outside).  generator: ``torch.Generator`` or None.

    Returns:
        ``[R, max_spec_len + 1]`` int32, -1 placeholders.
    """
    import torch

    ids = _tensor(draft_token_ids, torch.int64)
    cu = _tensor(cu_num_draft_tokens, torch.int64)
    p = _tensor(target_probs, torch.float32)
    q = None if draft_probs is None else _tensor(draft_probs, torch.float32)
    bonus = _tensor(bonus_token_ids, torch.int64).reshape(-1)
    r_count, vocab = cu.numel(), p.shape[1]
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), cu[:-1]])
    k = cu - starts
    max_spec_len = int(k.max()) if r_count else 0
    u = torch.rand(ids.numel(), dtype=torch.float64, generator=generator)  # float64: never exactly 0 in practice
    out = torch.full((r_count, max_spec_len + 1), -1, dtype=torch.int32)
    for r in range(r_count):
        s, kr = int(starts[r]), int(k[r])
        e = torch.empty(vocab, dtype=torch.float32).exponential_(generator=generator) if kr else None
        for i in range(kr):
            x = int(ids[s + i])
            pr = float(p[s + i, x])
            if q is None:
                ok = pr >= float(u[s + i])
            else:
                qr = float(q[s + i, x])
                ok = qr > 0 and pr / qr >= float(u[s + i])
            if ok:
                out[r, i] = x
                continue
            if q is None:
                residual = p[s + i].clone()
                residual[x] = 0.0
            else:
                residual = torch.clamp(p[s + i] - q[s + i], min=0.0)
            out[r, i] = int(torch.argmax(residual / e))
            break
        else:
            out[r, kr] = int(bonus[r])
    return out


def transformers_speculative_sampling():
    """The installed ``transformers.generation.utils._speculative_sampling`` (hf layout)."""
    from transformers.generation import utils

    return utils._speculative_sampling
