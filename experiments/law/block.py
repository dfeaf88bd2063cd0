"""Block verification against token-wise speculative sampling: empirical vs law, and the gain.

For every cell (K, V, requested per-position token-wise acceptance) a target/draft pair of the
"noise" family is drawn and calibrated (:func:`experiments.law.synthetic.make_pair`); ``rounds``
rounds are verified by both :func:`specverify.accept` and :func:`specverify.accept_block` on the
SAME draft tokens and uniforms (common random numbers, so the empirical gain has a small error).
Per method the table holds the law's mean accepted length (token-wise ``sum_i prod_{j<i} a_j``;
block ``sum_i E[p_i]`` from :func:`specverify.law.block_survival`, with its error bound), the
empirical mean, its standard error, z-score and the chi-square p-value of the accepted-length
histogram against the law's pmf (on counts, small bins merged); and the gain (block minus
token-wise) by law and empirically, with the standard error of the paired differences.

``python -m experiments.law.block`` runs the default grid (K 1..8 x V {256, 32000, 128256} x acceptance
{0.5, 0.7, 0.9}; 3000 rounds per cell), caches every cell under ``results/block/cells/`` and the
table under ``results/block/<key>/``, and draws ``media/block.png`` (also redrawn by
``python -m experiments.figures``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from .. import paths
from . import synthetic
from .. import stats as st
from .sweep import SerialExecutor, cells, load, run_cells, save_table  # noqa: F401 (SerialExecutor: tests)

EXPERIMENT = "block"
GRID = {"k": list(range(1, 9)), "vocab": [256, 32000, 128256], "acceptance": [0.5, 0.7, 0.9]}
ROUNDS = 3000
SEED = 0
METHODS = ("token", "block")


def cell_params(cell: dict, rounds: int, seed: int) -> dict:
    return {"k": int(cell["k"]), "vocab": int(cell["vocab"]), "acceptance": float(cell["acceptance"]),
            "rounds": int(rounds), "family": "noise", "temperature": synthetic.TEMPERATURE,
            "seed": [int(seed), int(cell["k"]), int(cell["vocab"]), int(round(1e6 * float(cell["acceptance"])))]}


def run_cell(params: dict) -> dict:
    """One cell: both methods on the same rounds.  Top-level so that process pools can pickle it."""
    import specverify as sv
    from specverify import law

    p = params
    t0 = time.perf_counter()
    rng = np.random.default_rng(p["seed"])
    pair = synthetic.make_pair(rng, p["k"], p["vocab"], acceptance_target=p["acceptance"], family=p["family"],
                               temperature=p["temperature"])
    tokens = synthetic.sample_tokens(pair.draft, p["rounds"], rng)  # [R, K]
    uniforms = rng.random((p["rounds"], p["k"] + 1))  # [R, K+1]
    ops = {"token": sv.accept_from_uniforms, "block": sv.accept_block_from_uniforms}
    accepted = {m: np.array([ops[m](pair.target, pair.draft, tokens[r], uniforms[r])[0]
                             for r in range(p["rounds"])]) for m in METHODS}
    block = law.block_survival(pair.target, pair.draft)
    pmfs = {"token": law.accepted_length_pmf(pair.acceptance), "block": block.pmf}
    row = {"k": p["k"], "vocab": p["vocab"], "acceptance": p["acceptance"], "knob": pair.knob,
           "rounds": p["rounds"], "seed": p["seed"], "block_law_error": block.error}
    n = np.arange(p["k"] + 1)
    for m in METHODS:
        pmf = pmfs[m]
        mean = float(n @ pmf)
        var = float((n - mean) ** 2 @ pmf)
        counts = st.histogram(accepted[m], p["k"])
        pval = st.chisquare_counts(counts, pmf).pvalue
        row.update({f"{m}_law_mean": mean, f"{m}_emp_mean": float(accepted[m].mean()),
                    f"{m}_se": float(np.sqrt(var / p["rounds"])),
                    f"{m}_z": st.zscore(float(accepted[m].mean()), p["rounds"], mean, var),
                    f"{m}_chi2_p": float(pval)})
    diff = accepted["block"] - accepted["token"]
    row.update(gain_law=row["block_law_mean"] - row["token_law_mean"], gain_emp=float(diff.mean()),
               gain_se=float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else float("nan"),
               cell_s=time.perf_counter() - t0)
    return row


def run_block(grid: dict = GRID, rounds: int = ROUNDS, seed: int = SEED, *, executor=None, workers=None,
              results_root=None, force: bool = False, progress: bool = False):
    """Run (or reuse) every cell.  Returns ``(table, summary, directory)``."""
    import pandas as pd

    root = Path(results_root if results_root is not None else paths.RESULTS_DIR)
    all_params = [cell_params(c, rounds, seed) for c in cells(grid)]
    cache = [root / EXPERIMENT / "cells" / f"{paths.params_key('block-cell', p)}.json" for p in all_params]
    t0 = time.perf_counter()
    rows, todo = run_cells(run_cell, all_params, cache, executor=executor, workers=workers, force=force,
                           progress=progress)
    table = pd.DataFrame(rows)
    params = {"grid": {k: list(v) for k, v in grid.items()}, "rounds": rounds, "seed": seed}
    directory = root / EXPERIMENT / paths.params_key(EXPERIMENT, params)
    pvals = np.concatenate([table[f"{m}_chi2_p"].to_numpy() for m in METHODS])
    summary = {"params": params, "experiment": EXPERIMENT, "computed_cells": len(todo),
               "wall_s": time.perf_counter() - t0, "metadata": paths.run_metadata(),
               "min_chi2_p": float(pvals.min()), "bonferroni_threshold": 1e-3 / pvals.size,
               "max_abs_z": float(np.abs(table[[f"{m}_z" for m in METHODS]].to_numpy()).max()),
               "max_gain_law": float(table["gain_law"].max()),
               "max_block_law_error": float(table["block_law_error"].max())}
    save_table(table, directory / "table.csv")
    paths.write_json(directory / "summary.json", summary)
    return table, summary, directory


def default_dir(results_root=None) -> Path:
    params = {"grid": {k: list(v) for k, v in GRID.items()}, "rounds": ROUNDS, "seed": SEED}
    return Path(results_root or paths.RESULTS_DIR) / EXPERIMENT / paths.params_key(EXPERIMENT, params)


def figure(directory: Path, out_dir=None, name: str = paths.BLOCK_PNG) -> Path:
    """``media/block.png`` from a results directory (reads only)."""
    from .. import plots

    table, _ = load(directory)
    path = Path(out_dir or paths.MEDIA_DIR) / name
    plots.save_figure(plots.block_figure(table), path)
    return path


def format_summary(table, summary: dict) -> str:
    cols = ["k", "vocab", "acceptance", "token_law_mean", "token_emp_mean", "block_law_mean", "block_emp_mean",
            "gain_law", "gain_emp", "gain_se", "token_chi2_p", "block_chi2_p"]
    return "\n".join([
        table[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"),
        f"{len(table)} cells x {summary['params']['rounds']} rounds: min chi-square p = {summary['min_chi2_p']:.3g} "
        f"(Bonferroni threshold at alpha 1e-3: {summary['bonferroni_threshold']:.2g}); max |z| = "
        f"{summary['max_abs_z']:.2f}; largest gain by law {summary['max_gain_law']:.3f} tokens per round; "
        f"block law error bound <= {summary['max_block_law_error']:.1e}",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.law.block", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--k", type=int, nargs="+", default=GRID["k"])
    ap.add_argument("--vocab", type=int, nargs="+", default=GRID["vocab"])
    ap.add_argument("--acceptance", type=float, nargs="+", default=GRID["acceptance"])
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--results", type=Path, default=paths.RESULTS_DIR)
    ap.add_argument("--out", type=Path, default=paths.MEDIA_DIR)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    grid = {"k": args.k, "vocab": args.vocab, "acceptance": args.acceptance}
    table, summary, directory = run_block(grid, args.rounds, args.seed, workers=args.workers,
                                          results_root=args.results, force=args.force, progress=True)
    print(format_summary(table, summary))
    print(f"results in {directory}; wrote {figure(directory, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
