"""The law test over a grid of K, V and draft mismatch.

For every cell (K, V, requested per-position acceptance) a fresh target/draft pair is drawn,
the draft knob calibrated to the requested acceptance (:func:`experiments.law.synthetic.pick_knob`),
and ``rounds`` verification rounds run (:func:`experiments.law.simulate.run`). The table holds,
per cell: empirical vs analytic mean accepted length, its standard error and z-score, the
chi-square p-value of the accepted-length histogram (on counts, small bins merged), per-position
acceptance (law and empirical) and the TV distance to the law.

The sweep passes when every cell passes at ``alpha / cells`` (Bonferroni) and the p-values,
uniform under a correct sampler, pass a Kolmogorov-Smirnov test of uniformity at ``alpha``.

Cells are computed through any ``concurrent.futures.Executor`` (default: a process pool), so a
cluster's executor (Dask's ``client.get_executor()``, Ray's, ...) runs a large sweep unchanged.
Each cell is cached under ``results/sweep/cells/<key>.json``, keyed by its parameters, so a rerun
only computes what is missing; the table lands in ``results/sweep/<key>/table.csv``.

``python -m experiments.law.sweep`` runs the default grid (K 1..8 x V {256, 32000, 128256} x
acceptance {0.5, 0.7, 0.9}, 2000 rounds per cell) and draws ``media/sweep.png``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import itertools
import json
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np

from .. import paths
from . import simulate, synthetic
from .. import stats as st

EXPERIMENT = "sweep"
GRID = {"k": list(range(1, 9)), "vocab": [256, 32000, 128256], "acceptance": [0.5, 0.7, 0.9]}
ROUNDS = 2000
SEED = 0
ALPHA = 1e-3
_LIST_COLUMNS = ("counts", "law_pmf", "acc_law", "acc_emp")


class SerialExecutor(cf.Executor):
    """Runs each task at submission, in this process (for tests and debugging)."""

    def submit(self, fn, /, *args, **kwargs):
        fut = cf.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            fut.set_exception(exc)
        return fut


def cells(grid: dict) -> list:
    """The grid's cells as dicts, in a fixed order."""
    names = ("k", "vocab", "acceptance")
    missing = set(names) - set(grid)
    if missing:
        raise ValueError(f"grid lacks {sorted(missing)}")
    return [dict(zip(names, vals)) for vals in itertools.product(*(grid[n] for n in names))]


def cell_params(cell: dict, rounds: int, seed: int, *, family=None, temperature=synthetic.TEMPERATURE,
                greedy=False, variant="correct") -> dict:
    """A cell's full parameters. Its seed depends on the cell only, never on scheduling."""
    return {
        "k": int(cell["k"]), "vocab": int(cell["vocab"]), "acceptance": float(cell["acceptance"]),
        "rounds": int(rounds), "seed": [int(seed), int(cell["k"]), int(cell["vocab"]),
                                        int(round(1e6 * float(cell["acceptance"])))],
        "family": family or ("argmax" if greedy else "noise"), "temperature": float(temperature),
        "greedy": bool(greedy), "variant": variant,
    }


def run_cell(params: dict) -> dict:
    """Compute one cell (top-level so that process pools can pickle it). Returns a table row."""
    p = params
    t0 = time.perf_counter()
    res = simulate.run(p["k"], p["vocab"], p["rounds"], p["seed"], acceptance=p["acceptance"],
                       family=p["family"], temperature=p["temperature"], greedy=p["greedy"],
                       variant=p["variant"])
    row = {key: val for key, val in res.items() if key not in ("accepted", "emitted", "draft_tokens")}
    row.update(k=p["k"], vocab=p["vocab"], acceptance=p["acceptance"], seed=p["seed"],
               acc_law_mean=float(np.mean(res["acc_law"])),
               acc_emp_mean=float(np.nanmean(res["acc_emp"])) if np.isfinite(res["acc_emp"]).any() else float("nan"),
               cell_s=time.perf_counter() - t0)
    return row


def law_test(table, alpha: float = ALPHA) -> dict:
    """Bonferroni-corrected per-cell chi-square test and KS uniformity of the p-values."""
    pv = table["chi2_p"].to_numpy(dtype=np.float64)
    m = pv.size
    ks_stat, ks_p = st.ks_uniform(pv)
    failing = table.loc[pv <= alpha / m, ["k", "vocab", "acceptance", "chi2_p"]]
    return {
        "alpha": alpha, "cells": int(m), "per_cell_alpha": alpha / m, "min_p": float(pv.min()),
        "cells_failing": int(len(failing)), "failing": failing.to_dict("records"),
        "bonferroni_pass": bool(len(failing) == 0),
        "ks_stat": ks_stat, "ks_p": ks_p, "ks_pass": bool(ks_p > alpha),
        "max_abs_z": float(np.abs(table["z"]).max()),
        "passed": bool(len(failing) == 0 and ks_p > alpha),
    }


def default_executor(workers: int | None = None) -> cf.Executor:
    # spawn, not fork: the parent may hold torch/OpenMP thread state that a fork would corrupt
    return cf.ProcessPoolExecutor(max_workers=workers or 2, mp_context=multiprocessing.get_context("spawn"))


def run_cells(fn, all_params: list, cache: list, *, executor: cf.Executor | None = None,
              workers: int | None = None, force: bool = False, progress: bool = False):
    """``fn(params)`` for every parameter set, each result cached as JSON at its ``cache`` path.

    Returns ``(rows, computed indices)``; cached rows are read, not recomputed (unless ``force``).
    ``executor``: any ``concurrent.futures.Executor``; ``None`` makes a process pool of ``workers``
    (default 2) for the missing cells and shuts it down afterwards.
    """
    rows: list = [None] * len(all_params)
    todo = []
    for i, path in enumerate(cache):
        if not force and path.exists():
            rows[i] = paths.read_json(path)["row"]
        else:
            todo.append(i)
    if todo:
        own = executor is None
        ex = default_executor(workers) if own else executor
        try:
            futures = {ex.submit(fn, all_params[i]): i for i in todo}
            done = cf.as_completed(futures)
            if progress:
                from tqdm.auto import tqdm

                done = tqdm(done, total=len(futures), desc="cells", unit="cell")
            for fut in done:
                i = futures[fut]
                rows[i] = fut.result()
                paths.write_json(cache[i], {"params": all_params[i], "row": rows[i]})
        finally:
            if own:
                ex.shutdown()
    return rows, todo


def run_sweep(grid: dict = GRID, rounds: int = ROUNDS, seed: int = SEED, *, family=None,
              temperature: float = synthetic.TEMPERATURE, greedy: bool = False, variant: str = "correct",
              alpha: float = ALPHA, executor: cf.Executor | None = None, workers: int | None = None,
              results_root=None, force: bool = False, progress: bool = False):
    """Run (or reuse) every cell of ``grid``. Returns ``(table, summary, directory)``.

    ``executor``: any ``concurrent.futures.Executor``; ``None`` makes a process pool of
    ``workers`` (default 2) for the missing cells and shuts it down afterwards.
    """
    import pandas as pd

    root = Path(results_root if results_root is not None else paths.RESULTS_DIR)
    all_params = [cell_params(c, rounds, seed, family=family, temperature=temperature, greedy=greedy,
                              variant=variant) for c in cells(grid)]
    cache = [root / EXPERIMENT / "cells" / f"{paths.params_key('sweep-cell', p)}.json" for p in all_params]
    t0 = time.perf_counter()
    rows, todo = run_cells(run_cell, all_params, cache, executor=executor, workers=workers, force=force,
                           progress=progress)
    wall = time.perf_counter() - t0
    table = pd.DataFrame(rows)
    front = ["k", "vocab", "acceptance", "knob", "acc_law_mean", "acc_emp_mean", "rounds", "law_mean",
             "emp_mean", "se", "z", "chi2", "chi2_dof", "chi2_p", "tv"]
    table = table[front + [c for c in table.columns if c not in front]]
    test = law_test(table, alpha)
    sweep_params = {"grid": {k: list(v) for k, v in grid.items()}, "rounds": rounds, "seed": seed,
                    "family": family, "temperature": temperature, "greedy": greedy, "variant": variant}
    directory = root / EXPERIMENT / paths.params_key(EXPERIMENT, sweep_params)
    summary = {"params": sweep_params, "test": test, "computed_cells": len(todo), "wall_s": wall,
               "metadata": paths.run_metadata(), "experiment": EXPERIMENT}
    save_table(table, directory / "table.csv")
    paths.write_json(directory / "summary.json", summary)
    return table, summary, directory


def save_table(table, path: Path) -> None:
    out = table.copy()
    for c in _LIST_COLUMNS + ("seed",):
        if c in out:
            out[c] = out[c].map(json.dumps)
    path.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(path, index=False)


def load(directory: Path):
    """``(table, summary)`` from a sweep results directory."""
    import pandas as pd

    directory = Path(directory)
    table = pd.read_csv(directory / "table.csv")
    for c in _LIST_COLUMNS + ("seed",):
        if c in table:
            table[c] = table[c].map(json.loads)
    return table, paths.read_json(directory / "summary.json")


def figure(directory: Path, out_dir=None, name: str = paths.SWEEP_PNG) -> Path:
    """``media/sweep.png`` (three panels) from a sweep results directory."""
    from .. import plots

    table, summary = load(directory)
    fig = plots.sweep_figure(table, summary["test"]["ks_p"], summary["test"]["alpha"])
    path = Path(out_dir or paths.MEDIA_DIR) / name
    plots.save_figure(fig, path)
    return path


def default_dir(results_root=None) -> Path:
    """The results directory of the default grid (``python -m experiments.law.sweep`` with no options)."""
    params = {"grid": {k: list(v) for k, v in GRID.items()}, "rounds": ROUNDS, "seed": SEED, "family": None,
              "temperature": synthetic.TEMPERATURE, "greedy": False, "variant": "correct"}
    return Path(results_root or paths.RESULTS_DIR) / EXPERIMENT / paths.params_key(EXPERIMENT, params)


def format_summary(table, summary: dict) -> str:
    t = summary["test"]
    cols = ["k", "vocab", "acceptance", "acc_law_mean", "law_mean", "emp_mean", "se", "z", "chi2_p", "tv"]
    with_pd = table[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}")
    return "\n".join([
        with_pd,
        f"{t['cells']} cells, {table['rounds'].iloc[0]} rounds each: min chi-square p = {t['min_p']:.3g} "
        f"(Bonferroni threshold {t['per_cell_alpha']:.2g}), {t['cells_failing']} failing; max |z| = {t['max_abs_z']:.2f}",
        f"KS uniformity of the p-values: D = {t['ks_stat']:.3f}, p = {t['ks_p']:.3f} "
        f"-> {'PASS' if t['passed'] else 'FAIL'} at alpha = {t['alpha']:g}",
    ])


def _parse_list(kind):
    def parse(s):
        return [kind(x) for x in s.replace(",", " ").split()]
    return parse


def _expand_k(s):
    out = []
    for part in s.replace(",", " ").split():
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def build_parser():
    ap = argparse.ArgumentParser(prog="python -m experiments.law.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=_expand_k, default=GRID["k"], help="K values, e.g. '1-8' or '1,2,4'")
    ap.add_argument("--vocab", type=_parse_list(int), default=GRID["vocab"], help="V values, e.g. '256,32000'")
    ap.add_argument("--acceptance", type=_parse_list(float), default=GRID["acceptance"],
                    help="draft mismatch levels as requested per-position acceptance, e.g. '0.5,0.9'")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="rounds per cell (default %(default)s)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--family", choices=synthetic.FAMILIES, default=None)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--variant", choices=simulate.VARIANTS, default="correct",
                    help="deliberately broken verification, for power checks")
    ap.add_argument("--alpha", type=float, default=ALPHA)
    ap.add_argument("--executor", choices=("process", "thread", "serial"), default="process")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--results", type=Path, default=paths.RESULTS_DIR)
    ap.add_argument("--out", type=Path, default=paths.MEDIA_DIR, help="figure directory (default: media/)")
    ap.add_argument("--no-figure", action="store_true")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    grid = {"k": args.k, "vocab": args.vocab, "acceptance": args.acceptance}
    executor = {"process": None, "thread": cf.ThreadPoolExecutor(max_workers=args.workers),
                "serial": SerialExecutor()}[args.executor]
    t0 = time.perf_counter()
    table, summary, directory = run_sweep(grid, args.rounds, args.seed, family=args.family, greedy=args.greedy,
                                          variant=args.variant, alpha=args.alpha, executor=executor,
                                          workers=args.workers, results_root=args.results, force=args.force,
                                          progress=not args.no_progress and sys.stderr.isatty())
    if executor is not None:
        executor.shutdown()
    print(format_summary(table, summary))
    print(f"results: {directory} ({summary['computed_cells']} cells computed, {time.perf_counter() - t0:.1f} s)")
    if not args.no_figure:
        path = figure(directory, args.out)
        print(f"wrote {path}")
    return 0 if summary["test"]["passed"] or args.variant != "correct" else 1


if __name__ == "__main__":
    sys.exit(main())
