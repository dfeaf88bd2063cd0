"""The main job: watch the accepted-length histogram of repeated ``accept`` rounds converge on
the analytic law of rejection sampling.

``python -m experiments.convergence`` (no arguments) runs the hero experiment: K = 4,
V = 32000, 600 rounds of ``sv.accept`` with a deliberately imperfect draft whose per-position
acceptance is about 0.68, seed 0. It writes

- ``results/convergence/<key>/rounds.csv`` -- one row per round (accepted length, emitted token,
  draft tokens), with the parameters and run metadata in ``#`` header lines;
- ``results/convergence/<key>/summary.json`` -- parameters, law, statistics, metadata;
- ``media/hero.gif`` (animated histogram with the law and its ±2 s.e. band, and the running
  mean against the law's mean) and ``media/hero.png`` (its last frame);

and prints empirical vs law mean, the z-score and the chi-square p-value of the histogram.
Results are cached by parameters: a rerun with the same parameters only redraws.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from . import paths
from .cli import number
from .law import simulate, synthetic

EXPERIMENT = "convergence"
DEFAULTS = {
    "k": 4,
    "vocab": 32000,
    "rounds": 600,
    "acceptance": 0.68,
    "mismatch": None,
    "family": None,
    "temperature": synthetic.TEMPERATURE,
    "seed": 0,
    "greedy": False,
}


def make_params(**overrides) -> dict:
    """Complete, normalized parameters (the cache key is computed from these)."""
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown parameters: {sorted(unknown)}")
    p = {**DEFAULTS, **{k: v for k, v in overrides.items() if v is not None or k == "mismatch"}}
    if p["mismatch"] is not None:
        p["acceptance"] = None
    if p["family"] is None:
        p["family"] = "argmax" if p["greedy"] else "noise"
    if p["k"] < 1 or p["vocab"] < 2 or p["rounds"] < 1:
        raise ValueError(f"need k >= 1, vocab >= 2, rounds >= 1; got {p}")
    return p


# ------------------------------------------------------------------------------------------
# computation
# ------------------------------------------------------------------------------------------
def compute(params: dict, progress: bool = False) -> dict:
    """Run the experiment (no caching, no files). Returns :func:`experiments.law.simulate.run`'s dict."""
    p = params
    return simulate.run(p["k"], p["vocab"], p["rounds"], p["seed"], acceptance=p["acceptance"],
                        mismatch=p["mismatch"], family=p["family"], temperature=p["temperature"],
                        greedy=p["greedy"], progress=progress)


def save(result: dict, params: dict, directory: Path, wall_s: float) -> dict:
    """Write ``rounds.csv`` and ``summary.json`` into ``directory``; returns the summary."""
    import pandas as pd

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = paths.run_metadata()
    arrays = ("accepted", "emitted", "draft_tokens")
    summary = {key: val for key, val in result.items() if key not in arrays}
    summary.update(params=params, metadata=meta, compute_s=wall_s, experiment=EXPERIMENT,
                   key=paths.params_key(EXPERIMENT, params))
    draft_tokens = np.asarray(result["draft_tokens"])  # [rounds, k]
    # one frame from one block: adding the k draft columns one at a time costs O(k^2) in pandas
    df = pd.concat([pd.DataFrame({"round": np.arange(1, len(result["accepted"]) + 1),
                                  "n_accepted": result["accepted"], "emitted_token": result["emitted"]}),
                    pd.DataFrame(draft_tokens, columns=[f"draft_t{i}" for i in range(draft_tokens.shape[1])])],
                   axis=1)
    tmp = directory / "rounds.csv.tmp"
    with open(tmp, "w") as fh:
        fh.write("# specverify convergence experiment: one row per verification round\n")
        fh.write("# params: " + json.dumps(params, sort_keys=True) + "\n")
        fh.write("# metadata: " + json.dumps(meta, sort_keys=True) + "\n")
        df.to_csv(fh, index=False)
    tmp.replace(directory / "rounds.csv")
    paths.write_json(directory / "summary.json", summary)  # written last: marks the cache complete
    return summary


def load(directory: Path):
    """``(rounds DataFrame, summary dict)`` from a results directory."""
    import pandas as pd

    directory = Path(directory)
    return pd.read_csv(directory / "rounds.csv", comment="#"), paths.read_json(directory / "summary.json")


def run(params: dict, results_root=None, force: bool = False, progress: bool = False):
    """Compute (or reuse) the results for ``params``. Returns ``(directory, summary, cached)``."""
    directory = paths.result_dir(EXPERIMENT, params, results_root)
    if not force and (directory / "summary.json").exists():
        return directory, paths.read_json(directory / "summary.json"), True
    t0 = time.perf_counter()
    result = compute(params, progress=progress)
    summary = save(result, params, directory, time.perf_counter() - t0)
    return directory, summary, False


# ------------------------------------------------------------------------------------------
# figures (read the results directory only)
# ------------------------------------------------------------------------------------------
def render(directory: Path, out_dir: Path, frames: int = 60, gif_name: str = paths.HERO_GIF,
           png_name: str = paths.HERO_PNG) -> dict:
    """Draw the GIF and the last-frame PNG from a results directory."""
    from . import plots

    rounds, summary = load(directory)
    out_dir = Path(out_dir)
    imgs = list(plots.convergence_frames(rounds["n_accepted"].to_numpy(), summary, frames))
    gif = out_dir / gif_name
    size = plots.write_gif(imgs, gif)
    png = out_dir / png_name
    plots.write_png(imgs[-1], png)
    return {"gif": gif, "png": png, "gif_bytes": size, "frames": len(imgs)}


def format_summary(s: dict) -> str:
    p = s["params"]
    a = np.asarray(s["acc_law"])
    knob = f"{s['family']} draft, knob {s['knob']:.4g}"
    lines = [
        f"K = {p['k']}, V = {p['vocab']}, {s['rounds']} rounds, seed {p['seed']}, "
        f"{'greedy' if p['greedy'] else 'sampled'} verification ({knob})",
        f"per-position acceptance: law {np.array2string(a, precision=3)}  "
        f"empirical {np.array2string(np.asarray(s['acc_emp']), precision=3)}",
        f"accepted length: histogram {s['counts']} vs law {np.round(np.asarray(s['law_pmf']) * s['rounds'], 1).tolist()}",
        f"mean accepted: empirical {s['emp_mean']:.4f} vs law {s['law_mean']:.4f} "
        f"(s.e. {s['se']:.4f}, z = {s['z']:+.2f}); tokens per round {s['emp_mean'] + 1:.3f} vs {s['law_mean'] + 1:.3f}",
        f"chi-square on counts: {s['chi2']:.2f} on {s['chi2_dof']} dof, p = {s['chi2_p']:.3f}; "
        f"TV = {s['tv']:.4f}",
        f"verification: {s['us_per_round']:.1f} us/round (incl. Python overhead)",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m experiments.convergence", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    ap.add_argument("--k", type=number(int, 1), default=d["k"],
                    help="draft tokens per round, >= 1 (default %(default)s)")
    ap.add_argument("--vocab", type=number(int, 2), default=d["vocab"],
                    help="vocabulary size V, >= 2 (default %(default)s)")
    ap.add_argument("--rounds", type=number(int, 1), default=d["rounds"],
                    help="verification rounds, >= 1 (default %(default)s)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--acceptance", type=number(float, 0.0, 1.0, True, True), default=d["acceptance"],
                   help="target mean per-position acceptance in (0, 1); the draft knob is calibrated "
                        "(default %(default)s)")
    g.add_argument("--mismatch", type=number(float, 0.0), default=None,
                   help="the draft family's knob directly: noise sigma >= 0, or a weight in [0, 1] "
                        "(mixture, argmax)")
    ap.add_argument("--family", choices=synthetic.FAMILIES, default=None,
                    help="draft family (default: noise; argmax with --greedy)")
    ap.add_argument("--temperature", type=number(float, 0.0, low_open=True),
                    default=d["temperature"], help="target logit temperature, > 0")
    ap.add_argument("--seed", type=number(int, 0), default=d["seed"],
                    help="seed, an integer >= 0 (default %(default)s)")
    ap.add_argument("--greedy", action="store_true", help="verify_greedy instead of accept")
    ap.add_argument("--frames", type=number(int, 1), default=60,
                    help="GIF frames, >= 1 (1: a still GIF; default %(default)s)")
    ap.add_argument("--out", type=Path, default=paths.MEDIA_DIR, help="figure directory (default: media/)")
    ap.add_argument("--results", type=Path, default=paths.RESULTS_DIR, help="results cache (default: results/)")
    ap.add_argument("--force", action="store_true", help="recompute even if cached")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def _writable_directory(path: Path) -> Optional[str]:
    """Why ``path`` cannot be a directory to write into (``None``: it can); creates it if needed."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None


def parse_args(argv=None) -> argparse.Namespace:
    """Parsed and checked options: every bad value is an argparse error naming its option,
    before anything is computed (the output directories included)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    family = args.family or ("argmax" if args.greedy else "noise")
    if args.mismatch is not None and family != "noise" and args.mismatch > 1.0:
        ap.error(f"--mismatch is the {family} draft's weight, which must be in [0, 1], got {args.mismatch}")
    for option, path in (("--out", args.out), ("--results", args.results)):
        problem = _writable_directory(path)
        if problem is not None:
            ap.error(f"{option} {str(path)!r} is not a writable directory: {problem}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    params = make_params(k=args.k, vocab=args.vocab, rounds=args.rounds, acceptance=args.acceptance,
                         mismatch=args.mismatch, family=args.family, temperature=args.temperature,
                         seed=args.seed, greedy=args.greedy)
    t0 = time.perf_counter()
    progress = not args.no_progress and params["rounds"] >= 5000 and sys.stderr.isatty()
    directory, summary, cached = run(params, args.results, force=args.force, progress=progress)
    t1 = time.perf_counter()
    fig = render(directory, args.out, frames=args.frames)
    t2 = time.perf_counter()
    print(format_summary(summary))
    print(f"results: {directory} ({'cached' if cached else f'computed in {t1 - t0:.2f} s'})")
    frames = f"{fig['frames']} frame{'s' if fig['frames'] != 1 else ''}"
    print(f"wrote {fig['gif']} ({fig['gif_bytes'] / 1024:.0f} KiB, {frames}) and {fig['png']} "
          f"in {t2 - t1:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
