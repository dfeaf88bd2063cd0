"""specverify.testing on verifiers nobody here wrote: verdicts, power and cost, as a table.

Runs the harness on transformers' installed ``_speculative_sampling`` (hf layout, sampled mode),
the vLLM-V1-style and FlashInfer-style re-implementations of ``specverify.testing.peers`` and
specverify's own ops, at small V (3) and large V (32000), and the exact-mode timing the issue
asks for (a chain rule at V = 4, K = 3, two rounds, by bisection).  Every row states the verdict,
the detectable total variation at that sample size (power 0.99, alpha 1e-6 for the whole check)
and the wall time; the header states the machine, its load, the date and the command.

``python -m experiments.law.harness_peers`` writes ``media/testing_peers.md`` (``--rounds`` sets
the large-V rounds, default 100000; ``--quick`` runs a small smoke version into the same table
format).  Torch runs on one thread (``torch.set_num_threads(1)``): the issue's budget is per core.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time

from .. import paths


def _rows(rounds_large, rounds_small):
    import specverify as sv
    from specverify.testing import adapters, peers

    hf = peers.transformers_speculative_sampling()

    def accept(target_probs, draft_probs, draft_tokens, generator):
        return sv.accept(target_probs, draft_probs, draft_tokens, generator)

    return [
        # (label, mode, verifier, kwargs)
        ("transformers _speculative_sampling (installed)", "sampled", hf,
         dict(kind="chain", layout="hf", vocab=32000, k=3, rounds=rounds_large)),
        ("transformers _speculative_sampling (installed)", "sampled", hf,
         dict(kind="chain", layout="hf", vocab=3, k=3, rounds=rounds_small)),
        ("specverify accept behind the hf signature", "sampled", adapters.specverify_as_hf(),
         dict(kind="chain", layout="hf", vocab=3, k=3, rounds=rounds_small)),
        ("vLLM-V1-style rejection sampler (peers.py)", "sampled", peers.vllm_v1_style_rejection_sample,
         dict(kind="chain", layout="vllm", vocab=3, k=3, rounds=max(rounds_small // 4, 500))),
        ("FlashInfer-style chain (peers.py)", "exact", peers.flashinfer_style_chain,
         dict(kind="chain", layout="flashinfer", vocab=3, k=2, cuts="bisect")),
        ("specverify accept", "sampled", accept, dict(kind="chain", vocab=32000, k=3, rounds=rounds_large)),
        ("specverify accept_from_uniforms (bisection, V=4, K=3, two rounds)", "exact", sv.accept_from_uniforms,
         dict(kind="chain", vocab=4, k=3, cuts="bisect")),
    ]


def run(rounds_large=100_000, rounds_small=20_000):
    """``[dict(verifier, mode, layout, vocab, k, rounds, verdict, detectable_tv, seconds, summary)]``."""
    import torch

    from specverify import testing

    torch.set_num_threads(1)
    out = []
    for label, mode, fn, kw in _rows(rounds_large, rounds_small):
        start, cpu = time.perf_counter(), time.process_time()
        if mode == "exact":
            report = testing.check_exact(fn, **kw, time_budget=1800.0)
        else:
            report = testing.check_sampled(fn, **kw, seed=0, time_budget=1800.0)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        out.append(dict(cpu_seconds=cpu, verifier=label, mode=mode, layout=kw.get("layout", "specverify"), vocab=kw["vocab"],
                        k=kw["k"], rounds=kw.get("rounds"), verdict=report.verdict,
                        detectable_tv=report.detectable_tv, seconds=seconds, summary=report.summary))
        print(f"{label} [{mode}, V={kw['vocab']}]: {report.verdict} in {seconds:.1f} s ({cpu:.1f} s CPU) — "
              f"{report.summary}",
              flush=True)
    return out


def table(rows, command, machine, load_before, load_after):
    lines = [
        "# specverify.testing on other projects' verifiers",
        "",
        f"Written by `{command}` on {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC.",
        f"Machine: {machine.get('cpu')}, {machine.get('cores')} cores, torch {machine.get('torch')} "
        "(one torch thread); a shared machine: load average (1 min) "
        f"{load_before.get('loadavg_1m')} before, {load_after.get('loadavg_1m')} after on 2 cores, so the "
        "wall times are inflated by other jobs; the CPU seconds of the process (one thread) stand for a quiet core.",
        "",
        "Sampled mode: alpha = 1e-6 for the whole check (Bonferroni over positions and the accepted-length test); "
        "'detectable TV' is the smallest total variation between the binned laws at position 0 that the check "
        "detects with probability 0.99 at that number of rounds. Exact mode: TV tolerance 1e-9 on the enumerated "
        "laws (V-token Markov target/draft pairs, every draft path, every uniform cell).",
        "",
        "| verifier | mode | layout | V | K | rounds | verdict | detectable TV | wall s | CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tv = "" if r["detectable_tv"] is None else f"{r['detectable_tv']:.3g}"
        lines.append(f"| {r['verifier']} | {r['mode']} | {r['layout']} | {r['vocab']} | {r['k']} | "
                     f"{r['rounds'] or ''} | {r['verdict']} | {tv} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} |")
    lines += ["", "Summaries:", ""]
    lines += [f"- {r['verifier']} ({r['mode']}, V = {r['vocab']}): {r['summary']}" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.law.harness_peers", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=100_000, help="rounds of the V = 32000 sampled checks")
    p.add_argument("--small-rounds", type=int, default=20_000, help="rounds of the V = 3 sampled checks")
    p.add_argument("--quick", action="store_true", help="smoke run: 2000 / 1000 rounds")
    p.add_argument("--out", default=None, help="output path (default media/testing_peers.md)")
    args = p.parse_args(argv)
    from ..benchmarks import harness

    rounds, small = (2000, 1000) if args.quick else (args.rounds, args.small_rounds)
    load_before = harness.load_snapshot()
    rows = run(rounds, small)
    load_after = harness.load_snapshot()
    command = "python -m experiments.law.harness_peers" + ("" if argv is None and len(sys.argv) <= 1 else " " +
                                                           " ".join(argv if argv is not None else sys.argv[1:]))
    text = table(rows, command, harness.machine_info(), load_before, load_after)
    out = paths.MEDIA_DIR / "testing_peers.md" if args.out is None else args.out
    paths.MEDIA_DIR.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
