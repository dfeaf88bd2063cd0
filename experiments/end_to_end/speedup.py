"""Choosing K on synthetic rows: the speed-up model against measured rounds, and the adaptive K.

``python -m experiments.end_to_end.speedup`` runs, for each scenario (a homogeneous acceptance a, or
position-dependent rates), rounds of the real op ``sv.accept`` on synthetic target/draft rows
(:mod:`experiments.law.synthetic`), at every fixed K = 1..k_max and with
:class:`specverify.decoding.adaptive.AdaptiveK`. Time is not slept or read from a clock: a cost model
charges each round ``c`` per drafted token plus ``T(m + 1) = 1 + beta m`` for the target pass
scoring ``m + 1`` tokens (units of a one-token target pass), so the measured speed-up is
``emitted tokens / charged time`` and is compared with :func:`specverify.law.speedup`, whose
only input from the rows is their per-position acceptance ``a_i = sum min(p_i, q_i)``.

Rows: per scenario a pool of ``pool`` independent target/draft pairs of ``k_max`` positions
(draft family ``noise``; the knob of each position calibrated once to the scenario's rate);
round r uses pair ``r mod pool`` (its first K positions) with fresh draft tokens ``t_i ~ q_i``
and fresh verification uniforms. The model's prediction averages the law's tokens per round
over the pool, so predicted and measured differ only by sampling noise (standard errors from
the per-round tokens). Writes ``results/speedup/<key>/results.json``; :func:`plot` draws
``media/speedup.png`` from it (``python -m experiments.figures`` redraws it too).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from .. import paths
from ..law import synthetic

EXPERIMENT = "speedup"
FIGURE = "speedup.png"
SCENARIOS = {  # name -> per-position acceptance targets (a scalar: the same at every position)
    "a = 0.5": 0.5,
    "a = 0.7": 0.7,
    "a = 0.8": 0.8,
    "a = 0.9": 0.9,
    "a_i 0.95 -> 0.6": "decaying",
}
DEFAULTS = {"k_max": 12, "c": 0.05, "beta": 0.02, "vocab": 4096, "pool": 32, "rounds": 640,
            "adaptive_rounds": 3000, "seed": 0, "scenarios": list(SCENARIOS)}


def make_params(**overrides) -> dict:
    unknown = set(overrides) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown parameters: {sorted(unknown)}")
    p = {**DEFAULTS, **{k: v for k, v in overrides.items() if v is not None}}
    if p["k_max"] < 1 or p["pool"] < 1 or p["rounds"] < p["pool"] or p["rounds"] % p["pool"]:
        raise ValueError(f"need k_max >= 1 and rounds a positive multiple of pool; got {p}")
    return p


def scenario_rates(name: str, k_max: int) -> np.ndarray:
    spec = SCENARIOS[name]
    if spec == "decaying":
        return np.linspace(0.95, 0.6, k_max)
    return np.full(k_max, float(spec))


def target_cost(beta: float):
    """``T(n) = 1 + beta (n - 1)``: a target pass scoring n tokens, in one-token passes."""
    return lambda n: 1.0 + beta * (n - 1)


def make_pool(rates, vocab, pool, rng, calibration_rows=64):
    """``pool`` pairs (target ``[k+1, V]``, draft ``[k, V]``, acceptance ``[k]``), position i's knob
    calibrated (on ``calibration_rows`` rows of their own) to mean acceptance ``rates[i]``."""
    k = len(rates)
    calibration = synthetic.base_draws(rng, calibration_rows, vocab)
    knob_of = {a: synthetic.pick_knob(calibration, float(a), "noise", tol=1e-4) for a in set(rates.tolist())}
    knobs = [knob_of[a] for a in rates.tolist()]
    out = []
    for _ in range(pool):
        base = synthetic.base_draws(rng, k, vocab)
        target = synthetic.target_rows(base)
        draft = np.stack([synthetic.draft_rows(base, "noise", kn)[i] for i, kn in enumerate(knobs)])
        out.append((target, draft, synthetic.acceptance(target, draft)))
    return out


def one_round(pair, k, rng_tokens, rng_verify):
    import specverify as sv

    target, draft, _ = pair
    tokens = synthetic.sample_tokens(draft[:k], 1, rng_tokens)[0] if k else np.empty(0, np.int64)
    n, _ = sv.accept(target[: k + 1], draft[:k], tokens, generator=rng_verify)
    return int(n)


def run_scenario(name, p, seed: np.random.SeedSequence, log=print) -> dict:
    from specverify import law
    from specverify.decoding.adaptive import AdaptiveK, RoundRecord

    rng_rows, rng_tokens, rng_verify = (np.random.default_rng(s) for s in seed.spawn(3))
    k_max, c, cost = p["k_max"], p["c"], target_cost(p["beta"])
    pool = make_pool(scenario_rates(name, k_max), p["vocab"], p["pool"], rng_rows)
    acc = np.array([pr[2] for pr in pool])  # [pool, k_max]
    time_of = lambda k: c * k + cost(k + 1)  # noqa: E731  charged time of a round of k drafts (all proposed)
    ks = list(range(1, k_max + 1))
    predicted, measured, se = [], [], []
    for k in ks:
        tokens = np.array([one_round(pool[r % len(pool)], k, rng_tokens, rng_verify) + 1 for r in range(p["rounds"])])
        measured.append(tokens.mean() / time_of(k))
        se.append(tokens.std(ddof=1) / np.sqrt(tokens.size) / time_of(k))
        predicted.append(float(np.mean([law.expected_tokens_per_round(a[:k]) for a in acc])) / time_of(k))
    # the pool-averaged survival P(N >= i) is the model's input for the optimum
    survival = np.cumprod(acc, axis=1).mean(axis=0)
    opt = law.optimal_k(None, c, cost, survival=survival)
    policy = AdaptiveK(k_max=k_max, draft_cost=c, target_cost=cost)
    tokens_total = time_total = 0.0
    chosen = []
    for r in range(p["adaptive_rounds"]):
        k = policy.draft_length(k_max)
        n = one_round(pool[r % len(pool)], k, rng_tokens, rng_verify)
        policy.observe(RoundRecord(k, k, n, float("nan"), float("nan")))
        tokens_total += n + 1
        time_total += time_of(k)
        chosen.append(k)
    log(f"{name}: model optimum K = {opt.k} (f = {opt.speedup:.3f}); best measured K = "
        f"{ks[int(np.argmax(measured))]} ({max(measured):.3f}); adaptive {tokens_total / time_total:.3f}")
    return dict(name=name, k=ks, predicted=predicted, measured=measured, se=se,
                rates=acc.mean(axis=0).tolist(), optimum_k=opt.k, optimum_speedup=opt.speedup,
                adaptive_speedup=tokens_total / time_total,
                adaptive_k_counts=np.bincount(chosen, minlength=k_max + 1).tolist())


def compute(params: dict, log=print) -> dict:
    seeds = np.random.SeedSequence(params["seed"]).spawn(len(params["scenarios"]))
    t0 = time.perf_counter()
    scenarios = [run_scenario(name, params, s, log) for name, s in zip(params["scenarios"], seeds)]
    return dict(experiment=EXPERIMENT, params=params, scenarios=scenarios, compute_s=time.perf_counter() - t0,
                metadata=paths.run_metadata())


def results_path(params: dict, root=None) -> Path:
    return paths.result_dir(EXPERIMENT, params, root) / "results.json"


def run(params: dict, root=None, log=print) -> Path:
    """Compute (unless cached) and return the results path."""
    path = results_path(params, root)
    if not path.exists():
        paths.write_json(path, compute(params, log))
    return path


def plot(results_file, out_path=None) -> Path:
    """``media/speedup.png``: model vs measured speed-up over K per scenario, and their ratio."""
    from ..plots import plt, save_figure

    res = paths.read_json(results_file)
    p = res["params"]
    fig, (ax, ax_r) = plt.subplots(1, 2, figsize=(12.5, 4.6), dpi=110, gridspec_kw=dict(width_ratios=[1.5, 1]))
    for j, s in enumerate(res["scenarios"]):
        color = f"C{j}"
        k = np.array(s["k"])
        pred, meas, se = (np.array(s[key]) for key in ("predicted", "measured", "se"))
        ax.plot(k, pred, color=color, lw=1.4, label=f"{s['name']}: K* = {s['optimum_k']}")
        ax.errorbar(k, meas, yerr=2 * se, fmt="o", ms=3.5, color=color, capsize=2, lw=1)
        ax.plot([s["optimum_k"]], [s["optimum_speedup"]], marker="*", ms=13, color=color, mec="black", mew=0.6)
        ax.axhline(s["adaptive_speedup"], color=color, ls=":", lw=1.2)
        ax_r.errorbar(k + (j - 2) * 0.08, meas / pred, yerr=2 * se / pred, fmt="o", ms=3, color=color, capsize=2,
                      lw=1, label=s["name"])
    ax.set_xlabel("draft length K")
    ax.set_ylabel("speed-up over plain decoding")
    ax.set_ylim(top=ax.get_ylim()[1] * 1.12)  # room for the legend
    ax.set_title(f"model (lines) vs measured rounds of sv.accept (points, ±2 s.e.)\n"
                 f"c = {p['c']}, T(n) = 1 + {p['beta']}(n-1); star: model optimum; dotted: AdaptiveK", fontsize=10)
    ax.legend(fontsize=8, frameon=False, loc="upper left", ncol=2)
    ax_r.axhline(1.0, color="black", lw=1)
    ax_r.set_xlabel("draft length K")
    ax_r.set_ylabel("measured / model (±2 s.e.)")
    ax_r.set_title(f"{p['rounds']} rounds per point, V = {p['vocab']}", fontsize=10)
    fig.tight_layout()
    out_path = Path(out_path or paths.MEDIA_DIR / FIGURE)
    save_figure(fig, out_path)
    return out_path


def table(results_file) -> str:
    """The README table (markdown) and a line on the z-scores of measured against the model."""
    res = paths.read_json(results_file)
    lines = ["| scenario | model K* | model f(K*) | measured f(K*) | best measured K | best measured f | AdaptiveK |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for s in res["scenarios"]:
        meas = np.array(s["measured"])
        best = int(np.argmax(meas))
        at_opt = meas[s["optimum_k"] - 1] if s["optimum_k"] >= 1 else 1.0
        lines.append(f"| {s['name']} (measured mean a_i {np.mean(s['rates']):.3f}) | {s['optimum_k']} | {s['optimum_speedup']:.2f} | {at_opt:.2f} | "
                     f"{s['k'][best]} | {meas[best]:.2f} | {s['adaptive_speedup']:.2f} |")
    z = zscores(res)
    lines.append(f"\n{z.size} (scenario, K) points: z = (measured - model) / s.e. has mean {z.mean():+.2f}, "
                 f"sd {z.std(ddof=1):.2f}, max |z| {np.abs(z).max():.2f}")
    return "\n".join(lines)


def zscores(res) -> np.ndarray:
    """``(measured - model) / s.e.`` at every (scenario, K) point."""
    return np.concatenate([(np.array(s["measured"]) - np.array(s["predicted"])) / np.array(s["se"])
                           for s in res["scenarios"]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.end_to_end.speedup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="rounds per (scenario, K)")
    ap.add_argument("--adaptive-rounds", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--pool", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--no-figure", action="store_true")
    args = ap.parse_args(argv)
    params = make_params(rounds=args.rounds, adaptive_rounds=args.adaptive_rounds, vocab=args.vocab, pool=args.pool,
                         seed=args.seed)
    path = run(params)
    print(table(path))
    print(f"results: {path}")
    if not args.no_figure:
        print(f"figure: {plot(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
