"""Calling a verifier under test: time budgets, input-mutation checks, output validation.

A verifier is someone else's code: it may raise, hang, return the wrong type, tokens out of range,
or write into its inputs.  Every call goes through :class:`Caller`, which names the case when any
of that happens (:class:`VerifierFault`); :func:`run_guarded` runs a whole check in a worker
thread and returns as soon as one call overruns its budget, so the harness never hangs (the stuck
call is left running in its daemon thread: Python cannot stop a thread).
"""

import threading
import time
import traceback

import numpy as np

from . import _args

__all__ = ["VerifierFault", "Caller", "run_guarded", "as_int", "describe"]


FIRST_CALL_BUDGET = 60.0


class VerifierFault(Exception):
    """The verifier under test misbehaved: ``what`` (raised, hung, slow, wrong output, mutated its
    inputs, not a function of its uniforms, not piecewise constant), a message, and the case."""

    def __init__(self, what, message, case=None):
        super().__init__(f"{what}: {message}")
        self.what, self.message, self.case = what, message, case


def describe(value):
    """A printable, re-runnable form of an input (arrays as nested lists)."""
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: describe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    return repr(value)


def as_int(value, name):
    """A Python int from an int, NumPy integer, or 0-d/1-element integer array or tensor."""
    if isinstance(value, (bool, np.bool_)):
        raise VerifierFault("wrong output", f"{name} must be an integer, got bool {value!r}")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iu":
        return int(value.reshape(()))
    raise VerifierFault("wrong output", f"{name} must be an integer, got {type(value).__name__} {value!r}")


def _snapshot(args):
    """Copies of the array arguments (NumPy as bytes, torch as clones; None for the rest)."""
    return [(a.dtype, a.shape, a.tobytes()) if isinstance(a, np.ndarray) else
            (a.detach().clone() if hasattr(a, "detach") else None) for a in args]


def _changed(before, args):
    """Index of the first argument that differs from its snapshot (bit for bit), else None."""
    for i, (b, a) in enumerate(zip(before, args)):
        if b is None:
            continue
        if hasattr(a, "detach"):
            import torch

            if not torch.equal(torch.nan_to_num(b, nan=-7.0), torch.nan_to_num(a, nan=-7.0)):
                return i
        elif (a.dtype, a.shape) != b[:2] or a.tobytes() != b[2]:
            return i
    return None


def _restore(snapshot, arg):
    if isinstance(snapshot, tuple):
        return np.frombuffer(snapshot[2], dtype=snapshot[0]).reshape(snapshot[1])
    return arg if snapshot is None else snapshot


class Caller:
    """Calls ``fn`` with a per-call time budget, checking that it leaves its inputs alone.

    Args:
        fn: the verifier (already adapted to the harness's layout).
        call_budget: seconds one call may take; the first call may take ``max(call_budget,
            FIRST_CALL_BUDGET)`` (60 s: a verifier's first call may import torch or compile).
        arg_names: names of the positional arguments (for messages).
        mutation_checks: for large inputs, check them after this many first calls, then every 64th
            call (inputs of at most 4096 elements are checked after every call).
    """

    def __init__(self, fn, call_budget=5.0, arg_names=(), mutation_checks=256):
        if not callable(fn):
            raise TypeError(f"verifier must be callable, got {type(fn).__name__}")
        self.fn, self.budget, self.arg_names = fn, _args.seconds("call_budget", call_budget), tuple(arg_names)
        self.mutation_checks = mutation_checks
        self.calls = 0
        self.seconds = 0.0  # spent inside the verifier (a time budget may run out in the harness's own work)
        self.current = None  # the case of the call in progress (read by the watchdog)
        self.limit = self.budget  # the budget of the call in progress
        self.started = None

    def case(self, args):
        names = self.arg_names or tuple(f"arg{i}" for i in range(len(args)))
        return {name: describe(a) for name, a in zip(names, args)}

    def __call__(self, *args):
        self.calls += 1
        # Small inputs (exact mode) are checked at every call; large ones at the first calls and then
        # every 64th (a copy of [K+1, 32000] rows per call would dominate a sampled check).
        check = (self.calls <= self.mutation_checks or self.calls % 64 == 0
                 or sum(getattr(a, "size", 0) if isinstance(a, np.ndarray) else 0 for a in args) <= 4096)
        before = _snapshot(args) if check else None
        self.current = args
        self.limit = max(self.budget, FIRST_CALL_BUDGET) if self.calls == 1 else self.budget
        self.started = time.perf_counter()
        try:
            out = self.fn(*args)
        except VerifierFault:
            raise
        # The verifier's own exception, reported with the case; sys.exit() and KeyboardInterrupt too,
        # which would otherwise end the harness (sys.exit(0): with status 0 and no report).
        except (Exception, SystemExit, KeyboardInterrupt) as e:
            tb = traceback.extract_tb(e.__traceback__)
            where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
            raise VerifierFault("raised", f"{type(e).__name__}: {e}{where}", self.case(args)) from e
        finally:
            elapsed = time.perf_counter() - self.started
            self.started = None
            self.seconds += elapsed
        if elapsed > self.limit:
            raise VerifierFault("slow", f"one call took {elapsed:.2f} s, over the budget of {self.limit:g} s",
                                self.case(args))
        if check:
            changed = _changed(before, args)
            if changed is not None:
                name = self.arg_names[changed] if changed < len(self.arg_names) else f"argument {changed}"
                raise VerifierFault("mutated its inputs", f"the call wrote into {name} (vllm-ascend #2881 "
                                    "zeroed target_probs in place): later rounds would read corrupted rows",
                                    {**self.case([_restore(b, a) for b, a in zip(before, args)]),
                                     "after": describe(args[changed])})
        return out


def run_guarded(work, caller, time_budget):
    """Run ``work()`` in a daemon thread; return ``(result, fault)``.

    ``fault`` is a :class:`VerifierFault` if ``work`` raised one, if a single call of ``caller``
    ran past its budget (reported as soon as it does: "hung"), or if the whole check ran past
    ``time_budget`` seconds.  Any other exception of the harness itself is re-raised.
    """
    box = {}

    def target():
        try:
            box["result"] = work()
        except BaseException as e:  # handed to the calling thread
            box["error"] = e

    thread = threading.Thread(target=target, name="specverify.testing check", daemon=True)
    start = time.monotonic()
    thread.start()
    while thread.is_alive():
        thread.join(0.02)
        started, current = caller.started, caller.current
        if started is not None and time.perf_counter() - started > caller.limit and thread.is_alive():
            return None, VerifierFault("hung", f"a call did not return within {caller.limit:g} s (left running "
                                       "in a daemon thread)", caller.case(current) if current else None)
        if time.monotonic() - start > time_budget and thread.is_alive():
            # Say whose time it was: the verifier's calls (one may still be running) or the harness's.
            running = started is not None
            spent = caller.seconds + (time.perf_counter() - started if running else 0.0)
            return None, VerifierFault("time budget", f"the check did not finish within time_budget = "
                                       f"{time_budget:g} s: the verifier's {caller.calls} calls took {spent:.3g} s "
                                       f"of it{' (the last still running)' if running else ''}, the rest was the "
                                       "harness's own work (drawing drafts, enumerating)",
                                       caller.case(current) if running and current else None)
    error = box.get("error")
    if isinstance(error, VerifierFault):
        return None, error
    if isinstance(error, (SystemExit, KeyboardInterrupt)):
        # Only the verifier's code can raise these in the worker thread (in an output's __len__ or
        # __int__, say): never let them end the harness as if it had finished.
        return None, VerifierFault("raised", f"{type(error).__name__}({error}) escaped from the verifier's code "
                                   "(from an object it returned?)", caller.case(caller.current) if caller.current
                                   else None)
    if error is not None:
        raise error
    return box["result"], None
