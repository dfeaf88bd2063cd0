"""The command line: ``python -m specverify.testing``.

Check a verifier named by ``package.module:function`` (a dotted attribute path after the colon is
allowed)::

    python -m specverify.testing specverify:accept_from_uniforms --kind chain --mode exact
    python -m specverify.testing mypkg.rules:my_verify --kind chain --layout flashinfer --mode exact
    python -m specverify.testing specverify:verify_greedy --kind greedy
    python -m specverify.testing mypkg.rules:sampled_verify --mode sampled --rounds 20000

or list and run the catalogue of known-broken rules (each must be caught)::

    python -m specverify.testing --catalogue
    python -m specverify.testing --catalogue residual_skipped --mode exact
    python -m specverify.testing --catalogue all --mode sampled

The report is printed (``--json`` prints it as JSON).  Exit status: 0 when the verifier is
lossless (catalogue: when every entry run is caught), 1 on a violation (catalogue: an entry not
caught), 2 when the verifier misbehaved (verdict "error") or the arguments are invalid.
"""

import argparse
import importlib
import json
import sys

__all__ = ["main", "load_verifier", "build_parser"]


def load_verifier(spec):
    """The callable named by ``"package.module:function"`` (or ``"module:object.attribute"``).

    Raises:
        ValueError: ``spec`` has no ``:``, the module cannot be imported, or the attribute is
            missing or not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"verifier must be 'package.module:function', got {spec!r}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import module {module_name!r} of verifier {spec!r}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module_name!r} has no attribute {attr!r} (verifier {spec!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"verifier {spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def build_parser():
    """The ``argparse`` parser of the command line."""
    p = argparse.ArgumentParser(prog="python -m specverify.testing",
                                description="Check a speculative-decoding verifier's losslessness (exact "
                                            "enumeration, sampled chi-square with its power, or greedy equality).")
    p.add_argument("verifier", nargs="?", help="package.module:function of the verifier under test")
    p.add_argument("--catalogue", nargs="?", const="", default=None, metavar="NAME|all",
                   help="without a value: list the catalogue of known-broken rules; with a name (or 'all'): run "
                        "that entry (each must be caught) in --mode")
    p.add_argument("--kind", default="chain", choices=("chain", "block", "tree", "greedy"))
    p.add_argument("--layout", default="specverify", choices=("specverify", "batch", "vllm", "flashinfer", "hf"))
    p.add_argument("--mode", default=None, choices=("exact", "sampled", "greedy", "both"),
                   help="default: greedy for --kind greedy, exact otherwise (hf layout: sampled); 'both' for "
                        "the catalogue")
    p.add_argument("--vocab", type=int, default=None, help="V (exact mode: 2-5; default 3)")
    p.add_argument("--k", type=int, default=None, help="drafts per round (default 2)")
    p.add_argument("--rounds", type=int, default=None, help="sampled mode: rounds (default 20000)")
    p.add_argument("--cuts", default="bisect", choices=("bisect", "analytic"),
                   help="exact mode: find the change points by bisection or use the standard rule's cuts")
    p.add_argument("--tree-rule", default="without_replacement",
                   choices=("deterministic", "with_replacement", "without_replacement"))
    p.add_argument("--tree-shape", default="depth2", help="depth2, wide, depth3 or comma-separated parents")
    p.add_argument("--draws-uniforms", action="store_true",
                   help="sampled mode for a verifier that takes uniforms: draw them from the generator")
    p.add_argument("--ties", default="lowest", choices=("lowest", "any"), help="greedy mode: tie convention")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alpha", type=float, default=1e-6, help="sampled mode: level of the whole check")
    p.add_argument("--call-budget", type=float, default=5.0, help="seconds one call may take")
    p.add_argument("--time-budget", type=float, default=600.0, help="seconds for the whole check")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def _shape(text):
    if "," in text or text.lstrip("-").isdigit():
        return [int(x) for x in text.split(",")]
    return text


def _settings(args, mode):
    out = {}
    if args.vocab is not None:
        out["vocab"] = args.vocab
    if args.k is not None and args.kind != "tree":
        out["k"] = args.k
    out["seed"] = args.seed
    out["call_budget"], out["time_budget"] = args.call_budget, args.time_budget
    if mode == "greedy":
        out["ties"] = args.ties
        if args.kind == "tree":
            out["tree_shape"] = _shape(args.tree_shape)
        return out
    out["layout"] = args.layout
    if args.kind == "tree":
        out["tree_rule"], out["tree_shape"] = args.tree_rule, _shape(args.tree_shape)
    if mode == "exact":
        out["cuts"] = args.cuts
    else:
        out["alpha"] = args.alpha
        if args.rounds is not None:
            out["rounds"] = args.rounds
    return out


def _print(report, as_json, out):
    if as_json:
        print(json.dumps(report.to_dict(), default=str, indent=1), file=out)
    else:
        print(report, file=out)


def _check(args, out):
    from . import adapters, check_exact, check_greedy, check_sampled

    verifier = load_verifier(args.verifier)
    mode = args.mode or ("greedy" if args.kind == "greedy" else "sampled" if args.layout == "hf" else "exact")
    if mode == "both":
        raise ValueError("--mode both is for --catalogue; pick exact, sampled or greedy for a verifier")
    if (args.kind == "greedy") != (mode == "greedy"):
        raise ValueError("greedy verifiers are checked with --kind greedy and --mode greedy (or no --mode); "
                         f"got --kind {args.kind} --mode {mode}")
    settings = _settings(args, mode)
    if mode == "greedy":
        report = check_greedy(verifier, "chain" if args.kind == "greedy" else args.kind, **settings)
    elif mode == "exact":
        report = check_exact(verifier, args.kind, **settings)
    else:
        if args.draws_uniforms:
            verifier = adapters.with_generator(verifier, "tree" if args.kind == "tree" else "chain",
                                               "flashinfer" if args.layout == "flashinfer" else "specverify")
        report = check_sampled(verifier, args.kind, **settings)
    _print(report, args.json, out)
    return {"lossless": 0, "violation": 1, "error": 2}[report.verdict]


def _catalogue(args, out):
    from . import adapters, broken, check_exact, check_greedy, check_sampled

    entries = broken.CATALOGUE
    if args.catalogue == "":
        print(f"{len(entries)} known-broken rules (python -m specverify.testing --catalogue NAME|all [--mode "
              "exact|sampled|both]):", file=out)
        for e in entries.values():
            modes = "greedy" if e.kind == "greedy" else "exact" + (", sampled" if e.sampled is not None else "")
            print(f"  {e.name:40s} {e.kind:6s} caught by: {modes:16s} {e.source}", file=out)
            print(f"  {'':40s} {e.effect}", file=out)
        return 0
    names = list(entries) if args.catalogue == "all" else [args.catalogue]
    for name in names:
        if name not in entries:
            raise ValueError(f"no catalogue entry {name!r}; run --catalogue to list them")
    modes = {"both": ("exact", "sampled"), None: ("exact", "sampled")}.get(args.mode, (args.mode,))
    missed = 0
    for name in names:
        e = entries[name]
        for mode in ("greedy",) if e.kind == "greedy" else modes:
            if mode == "greedy" and e.kind != "greedy":
                continue
            if mode == "sampled" and e.sampled is None:
                print(f"{name}: sampled mode skipped — {e.note}", file=out)
                continue
            if mode == "greedy":
                report = check_greedy(e.fn, **e.exact)
            elif mode == "exact":
                report = check_exact(e.fn, **e.exact)
            else:
                kw = dict(e.sampled)
                layout = e.exact.get("layout", "specverify")
                fn = adapters.with_generator(e.fn, e.kind if e.kind == "tree" else "chain", layout)
                report = check_sampled(fn, **kw)
            caught = not report.passed
            missed += not caught
            print(f"{name} [{mode}]: {'CAUGHT' if caught else 'NOT CAUGHT'} — {report.verdict}: {report.summary}",
                  file=out)
            if args.json:
                _print(report, True, out)
    print(f"{missed} of the entries run were not caught" if missed else "every entry run was caught", file=out)
    return 1 if missed else 0


def main(argv=None, out=None):
    """Run the command line; returns the exit status (0 lossless / all caught, 1 violation /
    an entry missed, 2 verifier error or invalid arguments)."""
    out = sys.stdout if out is None else out
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.catalogue is not None:
            if args.verifier:
                raise ValueError("give either a verifier or --catalogue, not both")
            return _catalogue(args, out)
        if not args.verifier:
            parser.print_usage(sys.stderr)
            print("error: name a verifier (package.module:function) or use --catalogue", file=sys.stderr)
            return 2
        return _check(args, out)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
