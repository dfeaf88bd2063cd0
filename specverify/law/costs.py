"""Measured costs: what a target pass scoring ``n`` tokens and a draft call cost on one machine.

The speed-up law (:mod:`specverify.law.speedup`) prices a round as ``D + T(n)``: the draft's
calls and one target pass scoring ``n`` tokens, in units of a one-token pass (``T(1) = 1``).
Those ratios belong to a machine, a model and a thread count (on a CPU most of a one-token pass
is fixed per-layer work that extra tokens share; a Pi, more threads or another model move the
curve), so they are measured where the decoder runs
(:mod:`specverify.integrations.calibrate`) and cached as JSON; :class:`MeasuredCosts` reads
them back and is itself a ``target_cost`` the law's functions take::

    costs = load_costs(cost_cache_path("HuggingFaceTB/SmolLM2-135M", threads=1))
    law.speedup_curve(rates, c=costs.draft_costs("learned"), target_cost=costs)

The cache lives under the user's cache directory, never inside the package: ``$SPECVERIFY_CACHE``
if set, else ``$XDG_CACHE_HOME/specverify``, else ``~/.cache/specverify``; one file per
``<machine>-<model>-<threads>.json`` in its ``costs/`` folder.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional, Sequence, Tuple

__all__ = ["MeasuredCosts", "load_costs", "save_costs", "cost_cache_path", "machine_name"]

FORMAT = 1  # the JSON layout's version: a file of another version is refused, not misread


def _cost_tuple(values, name: str, first_is_one: bool = False) -> Tuple[float, ...]:
    """``values`` as a non-empty tuple of finite costs ``>= 0`` (``first_is_one``: ``values[0] == 1``),
    else a ValueError/TypeError naming ``name``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of costs, got {values!r}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name}[{i}] must be a finite number >= 0, got {v!r}")
        out.append(float(v))
    if not out:
        raise ValueError(f"{name} must hold at least one cost")
    if first_is_one and not math.isclose(out[0], 1.0, rel_tol=1e-9):
        raise ValueError(f"{name}[0] must be 1 (costs are relative to a one-token target pass), got {out[0]!r}")
    return tuple(out)


@dataclass(frozen=True)
class MeasuredCosts:
    """Costs relative to a one-token target pass, as measured on one machine.

    ``target``: ``(T(1), ..., T(N))`` with ``T(1) = 1``, the pass scoring ``n`` tokens after a
    cached prefix. ``drafts``: per draft name, ``(D(1), ..., D(K))``, a call that computes ``k``
    draft rows (a learned draft's forwards; prompt lookup's match). ``meta``: how it was
    measured (machine, model, threads, seconds of a one-token pass, ...), kept as given.

    Beyond the lengths measured, costs continue linearly with the slope of the last two (a pass
    grows with its tokens once the matrix kernels are compute-bound; a draft by its steps).
    ``costs(n)`` is ``T(n)``: the object is a ``target_cost`` for
    :func:`specverify.law.speedup_curve`.
    """

    target: Tuple[float, ...]
    drafts: Mapping[str, Tuple[float, ...]] = field(default_factory=dict)
    meta: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "target", _cost_tuple(self.target, "target", first_is_one=True))
        if not isinstance(self.drafts, Mapping):
            raise TypeError(f"drafts must be a mapping of draft names to costs, got {self.drafts!r}")
        drafts = {}
        for name, values in self.drafts.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"drafts: names must be non-empty strings, got {name!r}")
            drafts[name] = _cost_tuple(values, f"drafts[{name!r}]")
        object.__setattr__(self, "drafts", drafts)
        if not isinstance(self.meta, Mapping):
            raise TypeError(f"meta must be a mapping, got {self.meta!r}")
        object.__setattr__(self, "meta", dict(self.meta))

    def __call__(self, n: int) -> float:
        """``T(n)``, a pass scoring ``n >= 1`` tokens."""
        return _extended(self.target, n, "n")

    def draft_cost(self, name: str, k: int) -> float:
        """``D(k)`` of the draft ``name`` (``D(0) = 0``), a KeyError naming the drafts measured if unknown."""
        if name not in self.drafts:
            raise KeyError(f"no draft {name!r} was measured; measured: {sorted(self.drafts)}")
        return 0.0 if k == 0 else _extended(self.drafts[name], k, "k")

    def draft_costs(self, name: str, k_max: Optional[int] = None) -> Tuple[float, ...]:
        """``(D(1), ..., D(k_max))`` of the draft ``name`` (default: the lengths measured), the
        ``c`` argument of :func:`specverify.law.speedup_curve`."""
        k_max = len(self.drafts.get(name, ())) if k_max is None else k_max
        return tuple(self.draft_cost(name, k) for k in range(1, k_max + 1))

    def to_json(self) -> dict:
        return {"format": FORMAT, "target": list(self.target), "drafts": {k: list(v) for k, v in self.drafts.items()},
                "meta": dict(self.meta)}

    @classmethod
    def check(cls, costs, name: str = "costs") -> Optional["MeasuredCosts"]:
        """``costs`` if it is a :class:`MeasuredCosts` or None (learn them online); a TypeError
        naming ``name`` otherwise (the one check of every function taking ``costs=``)."""
        if costs is not None and not isinstance(costs, cls):
            raise TypeError(f"{name} must be a specverify.law.MeasuredCosts or None, got {type(costs).__name__}")
        return costs

    @classmethod
    def from_json(cls, data) -> "MeasuredCosts":
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"not a specverify cost file of format {FORMAT} (format: {got!r})")
        return cls(tuple(data["target"]), {k: tuple(v) for k, v in data.get("drafts", {}).items()},
                   data.get("meta", {}))


def _extended(values: Tuple[float, ...], n, name: str) -> float:
    """``values[n - 1]``, continued linearly past the end with the slope of the last two values."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= 1, got {n!r}")
    n = int(n)
    if n < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
    if n <= len(values):
        return values[n - 1]
    slope = values[-1] - values[-2] if len(values) >= 2 else values[-1]
    return values[-1] + max(slope, 0.0) * (n - len(values))


def machine_name() -> str:
    """The machine part of a cache name: the architecture and the CPU model string (Linux's
    ``/proc/cpuinfo``, else ``platform.processor()``), as a file-name-safe slug."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Model", "Hardware"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return _slug(f"{platform.machine()}-{cpu or platform.processor() or 'cpu'}")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "_", text).strip("_") or "unknown"


def cost_cache_path(model: str, threads: int, machine: Optional[str] = None, cache_dir=None) -> Path:
    """Where the costs of ``model`` (a name or path) with ``threads`` torch threads on ``machine``
    (default :func:`machine_name`) are cached: ``<cache_dir>/costs/<machine>-<model>-<threads>.json``,
    ``cache_dir`` defaulting to ``$SPECVERIFY_CACHE``, ``$XDG_CACHE_HOME/specverify`` or
    ``~/.cache/specverify``."""
    if not isinstance(model, str) or not model:
        raise TypeError(f"model must be a non-empty string (a model name or path), got {model!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    if cache_dir is None:
        cache_dir = os.environ.get("SPECVERIFY_CACHE") or Path(
            os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specverify"
    machine = machine_name() if machine is None else _slug(machine)
    return Path(cache_dir) / "costs" / f"{machine}-{_slug(model)}-{threads}.json"


def save_costs(costs: MeasuredCosts, path) -> Path:
    """Write ``costs`` as JSON to ``path`` (its folders created); returns the path."""
    if not isinstance(costs, MeasuredCosts):
        raise TypeError(f"costs must be a MeasuredCosts, got {type(costs).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(costs.to_json(), indent=1, sort_keys=True))
    tmp.replace(path)  # readers never see half a file
    return path


def load_costs(path) -> Optional[MeasuredCosts]:
    """The costs cached at ``path``, or ``None`` when there is no such file (the decoder then
    learns the costs from its own timings); a ValueError naming the file if it is not one."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        return MeasuredCosts.from_json(json.loads(path.read_text()))
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"{path}: unusable cost file: {error}") from None
