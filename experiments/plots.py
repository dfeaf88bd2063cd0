"""Figure code. Every function here takes results that were already computed (arrays, tables,
summary dicts) and draws them; nothing here simulates or tests. matplotlib runs headless (Agg).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

LAW_COLOR = "#222222"
BAND_COLOR = "#9e9e9e"
EMP_COLOR = "#1f77b4"
V_COLORS = {256: "#1f77b4", 32000: "#d62728", 128256: "#2ca02c"}


# ------------------------------------------------------------------------------------------
# convergence (hero) animation
# ------------------------------------------------------------------------------------------
def frame_rounds(rounds: int, frames: int, power: float = 1.7) -> np.ndarray:
    """Rounds at which frames are drawn: dense early (where the histogram moves), ending at ``rounds``."""
    j = np.arange(1, frames + 1) / frames
    r = np.unique(np.ceil(rounds * j ** power).astype(np.int64))
    r = r[r >= min(5, rounds)]
    if r.size == 0 or r[-1] != rounds:
        r = np.append(r, rounds)
    return r


def convergence_frames(accepted: np.ndarray, summary: dict, frames: int = 60, *, dpi: int = 96,
                       size=(8.6, 3.5)):
    """Yield RGB frames ``[H, W, 3]`` uint8 of the accepted-length histogram converging on the law.

    ``accepted`` ``[rounds]`` are the per-round accepted lengths; ``summary`` carries ``law_pmf``,
    ``law_mean``, ``law_var``, ``chi2_p`` and the run's parameters (as written by
    :mod:`experiments.convergence`).
    """
    accepted = np.asarray(accepted, dtype=np.int64)
    pmf = np.asarray(summary["law_pmf"], dtype=np.float64)
    k = pmf.size - 1
    mu, var = float(summary["law_mean"]), float(summary["law_var"])
    sd = np.sqrt(var)
    total = accepted.size
    n_axis = np.arange(1, total + 1)
    running = np.cumsum(accepted) / n_axis
    onehot = np.zeros((total, k + 1), dtype=np.int64)
    onehot[np.arange(total), accepted] = 1
    cum_counts = np.cumsum(onehot, axis=0)
    p = summary["params"]
    mode = "greedy" if p.get("greedy") else "sampled"

    fig, (ax_h, ax_m) = plt.subplots(1, 2, figsize=size, dpi=dpi, gridspec_kw={"width_ratios": [1, 1.25]})
    fig.subplots_adjust(left=0.07, right=0.985, bottom=0.15, top=0.80, wspace=0.22)
    xs = np.arange(k + 1)
    # animated artists are left out of the static background and redrawn on every frame
    bands = [ax_h.add_patch(plt.Rectangle((x - 0.4, 0), 0.8, 0, color=BAND_COLOR, alpha=0.45, lw=0,
                                          animated=True)) for x in xs]
    bars = list(ax_h.bar(xs, np.zeros(k + 1), width=0.62, color=EMP_COLOR, alpha=0.85, label="empirical",
                         animated=True))
    law = ax_h.hlines(pmf, xs - 0.4, xs + 0.4, colors=LAW_COLOR, lw=2.2, label="analytic law", animated=True)
    ax_h.add_patch(plt.Rectangle((0, 0), 0, 0, color=BAND_COLOR, alpha=0.45, lw=0, label="law ± 2 s.e."))
    ax_h.set_xticks(xs)
    ax_h.set_xlim(-0.6, k + 0.6)
    ax_h.set_ylim(0, min(1.0, 1.5 * pmf.max() + 0.03))
    ax_h.set_xlabel("accepted draft tokens per round")
    ax_h.set_ylabel("fraction of rounds")
    leg_h = ax_h.legend(loc="upper right", fontsize=8, framealpha=1.0, edgecolor="white")

    ax_m.fill_between(n_axis, mu - 2 * sd / np.sqrt(n_axis), mu + 2 * sd / np.sqrt(n_axis),
                      color=BAND_COLOR, alpha=0.45, lw=0, label="law mean ± 2 s.e.")
    ax_m.axhline(mu, color=LAW_COLOR, lw=1.6, ls="--", label=f"law mean {mu:.3f}")
    (line,) = ax_m.plot([], [], color=EMP_COLOR, lw=1.6, label="running empirical mean", animated=True)
    (dot,) = ax_m.plot([], [], "o", color=EMP_COLOR, ms=4, animated=True)
    ax_m.set_xlim(0, total)
    ax_m.set_ylim(max(0.0, mu - 0.9 * sd), min(float(k), mu + 0.9 * sd))
    ax_m.set_xlabel("round")
    ax_m.set_ylabel("mean accepted length")
    leg_m = ax_m.legend(loc="upper right", fontsize=8, framealpha=1.0, edgecolor="white")
    title = fig.suptitle("", fontsize=11, y=0.975, animated=True)
    knob = f"{summary.get('family', '')} draft, per-position acceptance ≈ {np.mean(summary['acc_law']):.3f}"
    fig.text(0.5, 0.855, f"K = {k}, V = {p['vocab']}, {mode} verification, {knob}, seed {p['seed']}",
             ha="center", fontsize=9, color="#444444")

    canvas = fig.canvas
    canvas.draw()
    background = canvas.copy_from_bbox(fig.bbox)
    legends = [canvas.copy_from_bbox(leg.get_window_extent()) for leg in (leg_h, leg_m)]

    for r in frame_rounds(total, frames):
        freq = cum_counts[r - 1] / r
        se = np.sqrt(pmf * (1 - pmf) / r)
        for b, f in zip(bars, freq):
            b.set_height(f)
        for rect, c, s in zip(bands, pmf, se):
            lo, hi = max(0.0, c - 2 * s), min(1.0, c + 2 * s)
            rect.set_y(lo)
            rect.set_height(hi - lo)
        line.set_data(n_axis[:r], running[:r])
        dot.set_data([r], [running[r - 1]])
        z = (running[r - 1] - mu) / (sd / np.sqrt(r))
        text = f"round {r}/{total}: mean accepted {running[r - 1]:.3f} vs law {mu:.3f} (z = {z:+.2f})"
        if r == total and "chi2_p" in summary:
            text += f", χ² p = {summary['chi2_p']:.2f}"
        title.set_text(text)

        canvas.restore_region(background)
        for a in (*bands, *bars, law):
            ax_h.draw_artist(a)
        ax_m.draw_artist(line)
        ax_m.draw_artist(dot)
        fig.draw_artist(title)
        for region in legends:  # legends stay on top of the moving data
            canvas.restore_region(region)
        yield np.asarray(canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)


def write_gif(frames, path: Path, frame_ms: int = 90, hold_ms: int = 3000) -> int:
    """Write frames as a looping GIF (last frame held ``hold_ms``; one frame is a still GIF);
    returns the file size in bytes."""
    import imageio.v3 as iio
    from PIL import Image

    frames = list(frames)
    # one shared palette, taken from the last (fullest) frame: small files, no colour flicker
    pal = Image.fromarray(frames[-1]).quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    pframes = [np.asarray(Image.fromarray(f).quantize(palette=pal, dither=Image.Dither.NONE)) for f in frames]
    palette = np.asarray(pal.getpalette()[: 3 * 64], dtype=np.uint8).reshape(-1, 3)
    rgb = [palette[f] for f in pframes]
    if not rgb:
        raise ValueError("write_gif needs at least one frame")
    # Pillow takes a list of durations for several frames only: one frame gets one number
    durations = [frame_ms] * (len(rgb) - 1) + [hold_ms] if len(rgb) > 1 else hold_ms
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, np.stack(rgb), extension=".gif", duration=durations, loop=0, optimize=True)
    return path.stat().st_size


def write_png(frame: np.ndarray, path: Path) -> None:
    import imageio.v3 as iio

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, frame, extension=".png")


# ------------------------------------------------------------------------------------------
# sweep
# ------------------------------------------------------------------------------------------
def sweep_figure(table, ks_p: float, alpha: float, *, dpi: int = 100):
    """Three panels from a sweep table: empirical vs law mean (±2 s.e.), z-scores, p-values."""
    from scipy import stats as sst

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), dpi=dpi)
    ax_m, ax_z, ax_p = axes
    n_cells = len(table)
    for j, (v, sub) in enumerate(table.groupby("vocab")):
        c = V_COLORS.get(int(v), f"C{j + 3}")
        ax_m.errorbar(sub["law_mean"], sub["emp_mean"] - sub["law_mean"], yerr=2 * sub["se"], fmt="o",
                      ms=3.5, lw=1, capsize=2, color=c, label=f"V = {int(v)}")
    ax_m.axhline(0, color=LAW_COLOR, lw=1)
    ax_m.set_xlabel("analytic mean accepted length")
    ax_m.set_ylabel("empirical − law mean (±2 s.e.)")
    ax_m.set_title(f"{n_cells} cells: mean accepted length vs law")
    ax_m.legend(fontsize=8, frameon=False)

    z = table["z"].to_numpy()
    lim = max(4.0, np.ceil(np.abs(z).max()))
    ax_z.hist(z, bins=np.linspace(-lim, lim, 17), density=True, color=EMP_COLOR, alpha=0.75, label="cells")
    g = np.linspace(-lim, lim, 200)
    ax_z.plot(g, sst.norm.pdf(g), color=LAW_COLOR, lw=1.5, label="N(0, 1)")
    ax_z.set_xlabel("z = (empirical − law mean) / s.e.")
    ax_z.set_ylabel("density")
    ax_z.set_title(f"z-scores: mean {z.mean():+.2f}, sd {z.std(ddof=1) if z.size > 1 else 0:.2f}")
    ax_z.legend(fontsize=8, frameon=False)

    pv = table["chi2_p"].to_numpy()
    ax_p.hist(pv, bins=np.linspace(0, 1, 11), color=EMP_COLOR, alpha=0.75, label="cells")
    ax_p.axhline(n_cells / 10, color=LAW_COLOR, lw=1.5, ls="--", label="uniform")
    ax_p.set_xlabel(f"p-value of each cell's histogram (min {pv.min():.3g})")
    ax_p.set_ylabel("cells")
    ax_p.set_title(f"chi-square p-values (KS uniformity p = {ks_p:.2f})")
    ax_p.legend(fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------
# block verification vs token-wise
# ------------------------------------------------------------------------------------------
ACCEPTANCE_COLORS = {0.5: "#d62728", 0.7: "#1f77b4", 0.9: "#2ca02c"}


def block_figure(table, *, dpi: int = 100, vocab_main: int = 32000):
    """Two panels from an ``experiments.law.block`` table: mean accepted length vs K for both methods
    (law lines, empirical points ±2 s.e.) at ``vocab_main``, and the gain (block − token-wise) for
    every V.  Each cell is an independent target/draft pair, hence the jagged lines."""
    from matplotlib.lines import Line2D

    fig, (ax_m, ax_g) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=dpi)
    vocabs = sorted(int(v) for v in table["vocab"].unique())
    main = vocab_main if vocab_main in vocabs else vocabs[-1]
    styles = dict(zip([main] + [v for v in vocabs if v != main], ["-", ":", "-."]))
    colors = {}
    for j, (a, sub) in enumerate(table.groupby("acceptance")):
        c = colors[a] = ACCEPTANCE_COLORS.get(round(float(a), 2), f"C{j + 3}")
        m = sub[sub["vocab"] == main].sort_values("k")
        ax_m.plot(m["k"], m["block_law_mean"], color=c, lw=1.8)
        ax_m.plot(m["k"], m["token_law_mean"], color=c, lw=1.2, ls="--")
        ax_m.errorbar(m["k"] + 0.08, m["block_emp_mean"], yerr=2 * m["block_se"], fmt="o", ms=3.5, color=c,
                      capsize=2, lw=1)
        ax_m.errorbar(m["k"] - 0.08, m["token_emp_mean"], yerr=2 * m["token_se"], fmt="o", ms=3.5, mfc="white",
                      color=c, capsize=2, lw=1)
        for v in vocabs:
            g = sub[sub["vocab"] == v].sort_values("k")
            ax_g.plot(g["k"], g["gain_law"], color=c, lw=1.4, ls=styles[v])
            ax_g.errorbar(g["k"], g["gain_emp"], yerr=2 * g["gain_se"], fmt="o", ms=3, color=c,
                          mfc=c if v == main else "white", capsize=2, lw=0.8)
    by_acceptance = [Line2D([], [], color=c, lw=2, label=f"acceptance {a:g}") for a, c in colors.items()]
    ax_m.legend(handles=by_acceptance + [
        Line2D([], [], color="k", lw=1.8, label="block (law)"),
        Line2D([], [], color="k", lw=1.2, ls="--", label="token-wise (law)"),
        Line2D([], [], color="k", marker="o", ls="", label="block (empirical)"),
        Line2D([], [], color="k", marker="o", mfc="white", ls="", label="token-wise (empirical)")],
        fontsize=7, frameon=False, ncol=2)
    ax_m.set_xlabel("draft length K")
    ax_m.set_ylabel("mean accepted drafts per round")
    ax_m.set_title(f"V = {main}: law (lines) and empirical (points, ±2 s.e.)")
    ax_g.legend(handles=by_acceptance + [Line2D([], [], color="k", lw=1.4, ls=styles[v], label=f"V = {v} (law)")
                                         for v in vocabs], fontsize=7, frameon=False, ncol=2)
    ax_g.axhline(0, color=LAW_COLOR, lw=0.8)
    ax_g.set_xlabel("draft length K")
    ax_g.set_ylabel("block − token-wise accepted drafts per round")
    ax_g.set_title("gain of block verification (points: paired rounds, ±2 s.e.)")
    fig.tight_layout()
    return fig


def save_figure(fig, path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
