"""The harness's own arguments, validated before any work by ``check_exact``, ``check_sampled``
and ``check_greedy`` (the command line goes through them too; tree shapes:
:func:`specverify.testing._kinds.tree_parents`).

A bad argument raises :class:`ArgumentError` (a ``ValueError``) naming it, so the command line can
name its option (``vocab`` -> ``--vocab``) and exit 2 instead of reporting the verifier's fault.
"""

import math

import numpy as np

__all__ = ["ArgumentError", "integer", "number", "seconds", "choice", "flag", "warp", "common"]

# Budgets and sizes beyond these are typos (10**12 rounds would allocate terabytes), not checks.
MAX_ROUNDS = 10 ** 7
MAX_SAMPLED_VOCAB = 2 ** 20


class ArgumentError(ValueError):
    """A harness argument is invalid; ``argument`` is its name in the Python API."""

    def __init__(self, argument, message):
        super().__init__(message)
        self.argument = argument


def integer(name, value, low, high=None):
    """``value`` as an int in ``[low, high]`` (bools and floats refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < low \
            or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ArgumentError(name, f"{name} must be an integer {bounds}, got {value!r}")
    return int(value)


def number(name, value, low, high, *, closed_high=False):
    """``value`` as a finite float in ``(low, high)`` (``(low, high]`` with ``closed_high``)."""
    ok = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating)) \
        and math.isfinite(value) and low < value and (value <= high if closed_high else value < high)
    if not ok:
        raise ArgumentError(name, f"{name} must be a number in ({low:g}, {high:g}{']' if closed_high else ')'}, "
                                  f"got {value!r}")
    return float(value)


def seconds(name, value):
    """A budget: a finite positive number of seconds (NaN or inf would never run out)."""
    try:
        return number(name, value, 0.0, math.inf)
    except ArgumentError:
        raise ArgumentError(name, f"{name} must be a finite number of seconds > 0, got {value!r}") from None


def choice(name, value, choices):
    if not isinstance(value, str) or value not in choices:
        raise ArgumentError(name, f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def flag(name, value):
    if not isinstance(value, (bool, np.bool_)):  # the string "False" would be truthy
        raise ArgumentError(name, f"{name} must be True or False, got {value!r}")
    return bool(value)


def warp(value):
    """``warp``: None or a dict of ``sv.warp`` settings (``sv.warp`` checks their values)."""
    if value is not None and not isinstance(value, dict):
        raise ArgumentError("warp", f"warp must be None or a dict of sv.warp settings (temperature, top_k, top_p, "
                                    f"min_p), got {value!r}")
    return value


def common(verifier, seed, call_budget, time_budget):
    """The arguments every check takes."""
    if not callable(verifier):
        raise TypeError(f"verifier must be callable, got {type(verifier).__name__}")
    integer("seed", seed, 0)  # NumPy's generators take non-negative seeds
    seconds("call_budget", call_budget)
    seconds("time_budget", time_budget)
