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

The report is printed on stdout (``--json``: one JSON document); what the verifier prints goes to
stderr.  Exit status (``EXIT_STATUSES``): 0 only for a completed check whose verdict is lossless
(catalogue: every entry run is caught, or the listing), 1 only for a proven violation (catalogue: an
entry not caught), 2 for everything else: the verifier misbehaved (verdict "error": raised,
``sys.exit()`` included, hung, ran out of time), its module cannot be imported, an argument is
invalid (the message names the option), or the harness itself failed.  No traceback is printed.
"""

import argparse
import contextlib
import importlib
import json
import re
import sys
import threading

from . import _kinds
from ._args import ArgumentError, seconds
from .report import json_safe

__all__ = ["main", "load_verifier", "build_parser", "EXIT_STATUSES"]

#: The exit statuses of the command line, by what happened.
EXIT_STATUSES = {"lossless": 0, "violation": 1, "error": 2}


def load_verifier(spec, timeout=None):
    """The callable named by ``"package.module:function"`` (or ``"module:object.attribute"``).

    The module is imported in a daemon thread given ``timeout`` seconds (None: no limit), so a
    module that hangs, raises, has a syntax error or calls ``sys.exit()`` at import is reported,
    never run as the harness's own failure or success.

    Raises:
        ValueError: ``spec`` has no ``:``, the module cannot be imported in time, or the attribute
            is missing or not callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"verifier must be 'package.module:function', got {spec!r}")
    box = {}

    def resolve():
        try:
            obj = importlib.import_module(module_name)
        except BaseException as e:  # SystemExit and KeyboardInterrupt raised by the module included
            box["error"] = ValueError(f"cannot import module {module_name!r} of verifier {spec!r}: "
                                      f"{type(e).__name__}: {e}")
            return
        try:
            for part in attr.split("."):
                if not hasattr(obj, part):
                    box["error"] = ValueError(f"{module_name!r} has no attribute {attr!r} (verifier {spec!r})")
                    return
                obj = getattr(obj, part)
        except BaseException as e:  # a module's __getattr__ is the verifier's code too
            box["error"] = ValueError(f"looking up {attr!r} in {module_name!r} raised {type(e).__name__}: {e}")
            return
        box["verifier"] = obj

    thread = threading.Thread(target=resolve, name="specverify.testing import", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ValueError(f"importing module {module_name!r} of verifier {spec!r} did not finish within "
                         f"{timeout:g} s (--time-budget)")
    if "error" in box:
        raise box["error"]
    if not callable(box["verifier"]):
        raise ValueError(f"verifier {spec!r} is a {type(box['verifier']).__name__}, not a callable")
    return box["verifier"]


def build_parser():
    """The ``argparse`` parser of the command line."""
    p = argparse.ArgumentParser(prog="python -m specverify.testing",
                                description="Check a speculative-decoding verifier's losslessness (exact "
                                            "enumeration, sampled chi-square with its power, or greedy equality). "
                                            "Exit status: 0 lossless, 1 violation, 2 error or invalid arguments.")
    p.add_argument("verifier", nargs="?", help="package.module:function of the verifier under test")
    p.add_argument("--catalogue", nargs="?", const="", default=None, metavar="NAME|all",
                   help="without a value: list the catalogue of known-broken rules; with a name (or 'all'): run "
                        "that entry (each must be caught) in --mode")
    p.add_argument("--kind", default="chain", choices=("chain", "block", "tree", "greedy"),
                   help="greedy: a chain greedy verifier (--kind tree --mode greedy for a tree one)")
    p.add_argument("--layout", default="specverify", choices=("specverify", "batch", "vllm", "flashinfer", "hf"))
    p.add_argument("--mode", default=None, choices=("exact", "sampled", "greedy", "both"),
                   help="default: greedy for --kind greedy, exact otherwise (hf layout: sampled); 'both' for "
                        "the catalogue")
    p.add_argument("--drafts", default=None, choices=("stochastic", "deterministic", "both"),
                   help="chain/block draft process: stochastic (drafted rows passed), deterministic "
                        "(draft_probs=None) or both (exact mode's default; sampled mode: stochastic by default, "
                        "one per run)")
    p.add_argument("--vocab", type=int, default=None, help="V (exact mode: 2-5; default 3)")
    p.add_argument("--k", type=int, default=None, help="drafts per round (default 2)")
    p.add_argument("--rounds", type=int, default=None, help="sampled mode: rounds (default 20000)")
    p.add_argument("--cuts", default="bisect", choices=("bisect", "analytic"),
                   help="exact mode: find the change points by bisection or use the standard rule's cuts")
    p.add_argument("--tree-rule", default="without_replacement",
                   choices=("deterministic", "with_replacement", "without_replacement"))
    p.add_argument("--tree-shape", default="depth2",
                   help="depth2, wide, depth3 or comma-separated parents (--tree-shape -1,-1,0,0)")
    p.add_argument("--draws-uniforms", action="store_true",
                   help="sampled mode for a verifier that takes uniforms: draw them from the generator")
    p.add_argument("--ties", default="lowest", choices=("lowest", "any"), help="greedy mode: tie convention")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alpha", type=float, default=1e-6, help="sampled mode: level of the whole check")
    p.add_argument("--call-budget", type=float, default=5.0, help="seconds one call may take (finite, > 0)")
    p.add_argument("--time-budget", type=float, default=600.0,
                   help="seconds for the whole check, and for importing the verifier's module (finite, > 0)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    return p


def _glue_negative_values(argv, parser):
    """``--tree-shape -1,-1,0,0`` as ``--tree-shape=-1,-1,0,0``: argparse takes a value starting
    with ``-`` (other than a plain negative number) for an option and refuses it."""
    takes_value = {s for a in parser._actions if a.option_strings and a.nargs is None for s in a.option_strings}
    out, i = [], 0
    while i < len(argv):
        if argv[i] in takes_value and i + 1 < len(argv) and re.match(r"-\d", argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def _option_message(error, parser):
    """An :class:`ArgumentError` of the Python API worded with the command line's option."""
    name = {"draft_kind": "drafts"}.get(error.argument, error.argument)
    option = "--" + name.replace("_", "-")
    message = str(error)
    if option not in parser._option_string_actions:
        return message
    if message.startswith(error.argument + " "):
        return option + message[len(error.argument):]
    return f"{option}: {message}"


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
            out["tree_shape"] = args.tree_shape
        return out
    out["layout"] = args.layout
    if args.kind == "tree":
        out["tree_rule"], out["tree_shape"] = args.tree_rule, args.tree_shape
    if mode == "exact":
        out["cuts"] = args.cuts
        if args.drafts not in (None, "both"):
            out["drafts"] = args.drafts
    else:
        out["alpha"] = args.alpha
        if args.rounds is not None:
            out["rounds"] = args.rounds
        if args.drafts is not None:
            out["draft_kind"] = args.drafts
    return out


def _mode(args):
    """The check to run, after the combinations of options that name none."""
    mode = args.mode or ("greedy" if args.kind == "greedy" else "sampled" if args.layout == "hf" else "exact")
    if mode == "both":
        raise ValueError("--mode both is for --catalogue; pick exact, sampled or greedy for a verifier")
    if args.kind == "greedy" and mode != "greedy":
        raise ValueError(f"--kind greedy is checked with --mode greedy (or no --mode), got --mode {mode}")
    if mode == "greedy" and args.kind == "block":
        raise ValueError("--mode greedy checks chain (--kind greedy or chain) and tree (--kind tree) verifiers; greedy "
                         "block verification emits what token-wise greedy does: check it as --kind greedy")
    if args.drafts is not None and (mode == "greedy" or args.kind == "tree"):
        raise ValueError("--drafts is for chain and block verifiers in exact or sampled mode (a tree's draft process "
                         "follows --tree-rule; greedy mode passes no draft rows)")
    if mode == "sampled" and args.drafts == "both":
        raise ValueError("--drafts both is for exact mode: sampled mode checks one draft process per run (run "
                         "--drafts stochastic and --drafts deterministic)")
    return mode


def _check(args, out):
    from . import adapters, check_exact, check_greedy, check_sampled

    mode = _mode(args)
    _kinds.tree_parents(args.tree_shape)  # whatever the kind: a typo is refused, not silently ignored
    seconds("time_budget", args.time_budget)  # before the import it bounds
    verifier = load_verifier(args.verifier, timeout=args.time_budget)
    settings = _settings(args, mode)
    if mode == "greedy":
        report = check_greedy(verifier, "tree" if args.kind == "tree" else "chain", **settings)
    elif mode == "exact":
        report = check_exact(verifier, args.kind, **settings)
    else:
        if args.draws_uniforms:
            verifier = adapters.with_generator(verifier, "tree" if args.kind == "tree" else "chain", args.layout)
        report = check_sampled(verifier, args.kind, **settings)
    print(report.to_json(indent=1) if args.json else report, file=out)
    return EXIT_STATUSES[report.verdict]


def _catalogue(args, out):
    from . import adapters, broken, check_exact, check_greedy, check_sampled

    entries = broken.CATALOGUE
    if args.catalogue == "":
        rows = [dict(name=e.name, kind=e.kind, caught_by=["greedy"] if e.kind == "greedy" else
                     ["exact"] + (["sampled"] if e.sampled is not None else []), source=e.source, effect=e.effect)
                for e in entries.values()]
        if args.json:
            print(json.dumps(json_safe({"catalogue": rows}), allow_nan=False, indent=1), file=out)
            return 0
        print(f"{len(entries)} known-broken rules (python -m specverify.testing --catalogue NAME|all [--mode "
              "exact|sampled|both]):", file=out)
        for r in rows:
            print(f"  {r['name']:40s} {r['kind']:6s} caught by: {', '.join(r['caught_by']):16s} {r['source']}",
                  file=out)
            print(f"  {'':40s} {r['effect']}", file=out)
        return 0
    names = list(entries) if args.catalogue == "all" else [args.catalogue]
    for name in names:
        if name not in entries:
            raise ValueError(f"no catalogue entry {name!r}; run --catalogue to list them")
    modes = {"both": ("exact", "sampled"), None: ("exact", "sampled")}.get(args.mode, (args.mode,))
    missed, results = 0, []
    text = out if not args.json else sys.stderr  # --json: stdout holds the one JSON document
    for name in names:
        e = entries[name]
        for mode in ("greedy",) if e.kind == "greedy" else modes:
            if mode == "greedy" and e.kind != "greedy":
                continue
            if mode == "sampled" and e.sampled is None:
                print(f"{name}: sampled mode skipped — {e.note}", file=text)
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
            results.append(dict(name=name, mode=mode, caught=caught, report=report.to_dict()))
            print(f"{name} [{mode}]: {'CAUGHT' if caught else 'NOT CAUGHT'} — {report.verdict}: {report.summary}",
                  file=text)
    if not results:  # "every entry run was caught" of no entry would be a success without a check
        raise ValueError(f"--mode {args.mode} runs no check of {args.catalogue!r} (see --catalogue for the modes that "
                         "catch each entry)")
    print(f"{missed} of the entries run were not caught" if missed else "every entry run was caught", file=text)
    if args.json:
        print(json.dumps(json_safe({"entries": results, "missed": missed}), allow_nan=False, indent=1), file=out)
    return 1 if missed else 0


def main(argv=None, out=None):
    """Run the command line; returns the exit status (``EXIT_STATUSES``: 0 lossless / all
    caught, 1 violation / an entry missed, 2 verifier error, broken module or invalid arguments)."""
    out = sys.stdout if out is None else out
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parser.parse_args(_glue_negative_values(argv, parser))
    except SystemExit as e:  # argparse's own exit: 2 after its usage message, 0 after --help
        return e.code if isinstance(e.code, int) else 2
    try:
        # Only the report goes to stdout: the verifier's prints (at import or in calls) go to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            if args.catalogue is not None:
                if args.verifier:
                    raise ValueError("give either a verifier or --catalogue, not both")
                return _catalogue(args, out)
            if not args.verifier:
                parser.print_usage(sys.stderr)
                print("error: name a verifier (package.module:function) or use --catalogue", file=sys.stderr)
                return 2
            return _check(args, out)
    except ArgumentError as e:
        print(f"error: {_option_message(e, parser)}", file=sys.stderr)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
    except SystemExit as e:  # the harness never exits by itself: this is the verifier's code
        print(f"error: the verifier's code called sys.exit({e.code!r}) outside a guarded call", file=sys.stderr)
    except Exception as e:  # the harness's own failure: a message, never a traceback or status 1
        print(f"error: the harness failed ({type(e).__name__}: {e}); please report it", file=sys.stderr)
    return 2
