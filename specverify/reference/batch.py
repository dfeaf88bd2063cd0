"""Slow reference of ``specverify.verify_batch`` (explicit uniforms): one reference call per
request on its slice of specverify's ragged layout (:mod:`specverify.verify.batch` states it).

Request r has ``K_r = cu[r+1] - cu[r]`` drafts ``draft_tokens[cu[r]:cu[r+1]]``, the target rows
``target_probs[cu[r] + r : cu[r+1] + r + 1]`` and, when it has draft rows,
``draft_probs[cu[r]:cu[r+1]]``; its method is ``"greedy"`` (:func:`~specverify.reference.verify_greedy`,
no uniforms), ``"token"`` (:func:`~specverify.reference.accept`) or ``"block"``
(:func:`~specverify.reference.accept_block`), each sampled request taking the next ``K_r + 1``
uniforms in request order.
"""

import numpy as np

from .block import accept_block
from .chain import accept, verify_greedy

#: ``verify_batch``'s per-request methods; an integer method is an index here (the kernel's order).
METHODS = ("greedy", "token", "block")


def method_names(method, n_requests):
    """``[R]`` names from one name, a sequence of names or integer codes (indices of ``METHODS``)."""
    if isinstance(method, str):
        return [method] * n_requests
    return [m if isinstance(m, str) else METHODS[int(m)] for m in method]


def verify_batch(target_probs, draft_probs, draft_tokens, cu_num_draft_tokens, method="token",
                 has_draft_probs=None, uniforms=None):
    """``(output [R, K_max + 1] int64, num_accepted [R] int64)``: request r's accepted drafts and
    next token, padded with -1, as ``specverify.verify_batch`` returns them."""
    cu = np.asarray(cu_num_draft_tokens, dtype=np.int64)
    tokens = np.asarray(draft_tokens, dtype=np.int64)
    n_requests = cu.size - 1
    names = method_names(method, n_requests)
    if has_draft_probs is None:
        has_draft_probs = np.full(n_requests, draft_probs is not None)
    k = np.diff(cu)
    output = np.full((n_requests, (k.max() if n_requests else 0) + 1), -1, dtype=np.int64)
    accepted = np.zeros(n_requests, dtype=np.int64)
    start = 0
    for r in range(n_requests):
        t = tokens[cu[r]:cu[r + 1]]
        target = np.asarray(target_probs[cu[r] + r:cu[r + 1] + r + 1])
        if names[r] == "greedy":
            n, token = verify_greedy(target, t)
        else:
            draft = np.asarray(draft_probs[cu[r]:cu[r + 1]]) if has_draft_probs[r] else None
            sample = accept_block if names[r] == "block" else accept
            n, token = sample(target, draft, t, np.asarray(uniforms)[start:start + k[r] + 1])
            start += k[r] + 1
        accepted[r] = n
        output[r, :n] = t[:n]
        output[r, n] = token
    return output, accepted
