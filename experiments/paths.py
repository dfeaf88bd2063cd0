"""Every path the experiments read or write, cache keys, and run metadata.

Computation writes into ``RESULTS_DIR`` (default ``<repo>/results``, not committed), one folder
per experiment and parameter set; figures go to ``MEDIA_DIR`` (default ``<repo>/media``,
committed). ``SPECVERIFY_RESULTS`` and ``SPECVERIFY_MEDIA`` override the defaults.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
import sys
from importlib import metadata as _md
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(os.environ.get("SPECVERIFY_RESULTS", REPO_ROOT / "results"))
MEDIA_DIR = Path(os.environ.get("SPECVERIFY_MEDIA", REPO_ROOT / "media"))

# Bump when the content or layout of cached results changes: old caches are then ignored.
CACHE_VERSION = 1

HERO_GIF = "hero.gif"
HERO_PNG = "hero.png"
SWEEP_PNG = "sweep.png"
BLOCK_PNG = "block.png"

_PACKAGES = ("specverify", "numpy", "scipy", "torch", "pandas", "matplotlib", "imageio", "pillow")


def params_key(experiment: str, params: dict, versioned: bool = True) -> str:
    """A short stable hash of an experiment's parameters and the package version (the cache key).

    ``versioned=False`` leaves the package version out: for data whose making the parameters
    describe completely (the target's answers), so a release does not throw away hours of shards.
    """
    from specverify import __version__

    blob = json.dumps({"experiment": experiment, "cache": CACHE_VERSION,
                       "specverify": __version__ if versioned else None, "params": params},
                      sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def result_dir(experiment: str, params: dict, root: Path | str | None = None, versioned: bool = True) -> Path:
    """``<root>/<experiment>/<key>``: where one parameter set's results live."""
    return Path(root if root is not None else RESULTS_DIR) / experiment / params_key(experiment, params, versioned)


def git_revision() -> str:
    """``git describe``-like revision of the repository (``+dirty`` if modified), or ``unknown``."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = _md.version(name)
        except _md.PackageNotFoundError:
            mod = sys.modules.get(name)
            out[name] = getattr(mod, "__version__", "not installed")
    return out


def run_metadata() -> dict:
    """Who/what/when of a run: versions, git revision, machine, UTC time."""
    return {
        "git_revision": git_revision(),
        "versions": package_versions(),
        "machine": platform.machine(),
        "platform": platform.platform(),
        "processor": platform.processor() or "unknown",
        "utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, default=_jsonable))
    os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def _jsonable(x):
    import numpy as np

    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serializable: {type(x).__name__}")
