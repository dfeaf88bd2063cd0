"""What the experiments' command lines share: :func:`number`, the argparse type of every numeric option."""

from __future__ import annotations

import argparse
import math


def number(kind, low=None, high=None, low_open=False, high_open=False):
    """An argparse ``type`` reading a finite ``kind`` (int or float) within the bounds (open or
    closed); argparse's error names the option and the bounds (``argument --k: must be an integer
    >= 1, got '0'``)."""
    what = "an integer" if kind is int else "a finite number"

    def parse(text: str):
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
            raise argparse.ArgumentTypeError(f"must be {what} {' and '.join(x for x in (lo, hi) if x)}, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse's fallback message says "invalid int value"
    return parse
