"""Redraw every figure the README shows, from cached results only.

``python -m experiments.figures`` reads the results of the default hero run
(``python -m experiments.convergence``), of the default sweep (``python -m experiments.law.sweep``) and
of the default block comparison (``python -m experiments.law.block``) and writes ``media/hero.gif``,
``media/hero.png``, ``media/sweep.png`` and ``media/block.png``; and, when
``python -m experiments.end_to_end.speedup`` has been run, ``media/speedup.png``. Nothing is computed
here: a missing result is reported with the command that produces it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import paths
from .law.sweep import default_dir as default_sweep_dir
from .law.sweep import figure as sweep_figure


def hero(results_root=None, out_dir=None, frames: int = 60) -> dict:
    """``media/hero.gif`` + ``media/hero.png`` from the default convergence run's results."""
    from . import convergence

    params = convergence.make_params()
    directory = paths.result_dir(convergence.EXPERIMENT, params, results_root)
    if not (directory / "summary.json").exists():
        raise FileNotFoundError(f"no cached hero results in {directory}; run `python -m experiments.convergence`")
    return convergence.render(directory, Path(out_dir or paths.MEDIA_DIR), frames=frames)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.figures", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=paths.RESULTS_DIR)
    ap.add_argument("--out", type=Path, default=paths.MEDIA_DIR)
    ap.add_argument("--sweep-dir", type=Path, default=None, help="a sweep results directory (default: the default grid's)")
    ap.add_argument("--block-dir", type=Path, default=None,
                    help="an experiments.law.block results directory (default: the default grid's)")
    args = ap.parse_args(argv)
    missing = 0
    try:
        h = hero(args.results, args.out)
        print(f"wrote {h['gif']} ({h['gif_bytes'] / 1024:.0f} KiB) and {h['png']}")
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        missing += 1
    d = args.sweep_dir or default_sweep_dir(args.results)
    if (d / "summary.json").exists():
        print(f"wrote {sweep_figure(d, args.out)}")
    else:
        print(f"no cached sweep results in {d}; run `python -m experiments.law.sweep`", file=sys.stderr)
        missing += 1
    from .law import block

    d = args.block_dir or block.default_dir(args.results)
    if (d / "summary.json").exists():
        print(f"wrote {block.figure(d, args.out)}")
    else:
        print(f"no cached block results in {d}; run `python -m experiments.law.block`", file=sys.stderr)
        missing += 1
    # Choosing K (optional here: its absence does not fail the redraw of the figures above)
    from .end_to_end import speedup

    speedup_results = speedup.results_path(speedup.make_params(), args.results)
    if speedup_results.exists():
        print(f"wrote {speedup.plot(speedup_results, args.out / speedup.FIGURE)}")
    else:
        print(f"no cached speed-up results in {speedup_results.parent}; run `python -m experiments.end_to_end.speedup`",
              file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
