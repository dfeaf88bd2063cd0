"""What the harness does with bad input (issue 53, items 4-9): the command line's exit statuses as a
table (0 only for a completed lossless check, 1 only for a proven violation, 2 for everything else),
every bad argument named (the option on the command line, the argument in Python) before any
work, a verifier that calls ``sys.exit`` or cannot be imported never reported as a success or a
violation, ``--drafts``, tree greedy verifiers, ``--json`` as one strict JSON document on a stdout
of its own.  In process (``cli.main``), plus one real ``python -m``.  Model-free, tiny sizes."""

import io
import json
import math
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import specverify as sv
from specverify import testing
from specverify.testing import cli

ROOT = Path(__file__).resolve().parents[2]
ME = __name__


# -- verifiers under test ---------------------------------------------------------------------------
def exits_zero(target_probs, draft_probs, draft_tokens, uniforms):
    sys.exit(0)


class _ExitsWhenPrinted:
    def __repr__(self):
        sys.exit(0)


def returns_an_object_that_exits(target_probs, draft_probs, draft_tokens, uniforms):
    """The harness formats a wrong output for its message: the verifier's code runs there too."""
    return _ExitsWhenPrinted()


def hangs(target_probs, draft_probs, draft_tokens, uniforms):
    import time

    time.sleep(3600)


def drafted_rows_only(target_probs, draft_probs, draft_tokens, uniforms):
    """Written from the paper for drafted rows: ``draft_probs=None`` (deterministic drafts) fails."""
    draft_probs = draft_probs * 1.0
    return sv.accept_from_uniforms(target_probs, draft_probs, draft_tokens, uniforms)


def skipped_residual(target_probs, draft_probs, draft_tokens, uniforms):
    from specverify.testing.broken import chain_rule

    return chain_rule(target_probs, draft_probs, draft_tokens, uniforms, residual="p")


def chatty_impossible(target_probs, draft_probs, draft_tokens, generator):
    """Prints on every call and always emits token 1, of target probability 0 in row 0 of the
    sampled case: the chi-square statistic is infinite."""
    print("verifier noise {")
    return 0, 1


def _module(tmp_path, monkeypatch, source):
    """A verifier module written to ``tmp_path`` (a fresh name each time: never cached)."""
    name = f"verifier_{uuid.uuid4().hex}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def run(*argv):
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


# -- the exit statuses, as documented in docs/reliability.md ------------------------------------------
EXIT_TABLE = [
    # (what happened, argv, status)
    ("lossless", ["specverify:accept_from_uniforms", "--k", "1", "--cuts", "analytic"], 0),
    ("catalogue listed", ["--catalogue"], 0),
    ("violation", [f"{ME}:skipped_residual", "--k", "1", "--cuts", "analytic"], 1),
    ("verifier raised", [f"{ME}:drafted_rows_only", "--k", "1", "--cuts", "analytic"], 2),
    ("verifier called sys.exit(0)", [f"{ME}:exits_zero", "--k", "1"], 2),
    ("sys.exit(0) in an output's repr", [f"{ME}:returns_an_object_that_exits", "--k", "1"], 2),
    ("verifier hung", [f"{ME}:hangs", "--k", "1", "--call-budget", "0.2", "--time-budget", "0.5"], 2),
    ("invalid argument", ["specverify:accept_from_uniforms", "--vocab", "9"], 2),
    ("unparsable argument", ["specverify:accept_from_uniforms", "--call-budget", "abc"], 2),
    ("missing module", ["nomodule_xyz:f"], 2),
    ("catalogue entry with no check in the mode", ["--catalogue", "residual_skipped", "--mode", "greedy"], 2),
]


@pytest.mark.parametrize("what,argv,status", EXIT_TABLE, ids=[row[0] for row in EXIT_TABLE])
def test_exit_status_table(what, argv, status, capsys):
    code, _ = run(*argv)
    assert code == status
    assert "Traceback" not in capsys.readouterr().err


# -- item 4: a verifier never makes the harness succeed; budgets finite and positive -----------------
@pytest.mark.parametrize("source", ["import sys\nsys.exit(0)\n", "raise RuntimeError('broken at import')\n",
                                    "def f(:\n", "import sys\nprint('hello')\nsys.exit(1)\n"])
def test_a_module_that_exits_raises_or_does_not_parse_at_import_exits_two(source, tmp_path, monkeypatch, capsys):
    name = _module(tmp_path, monkeypatch, source + "\ndef verify(t, d, x, u):\n    return 0, 0\n")
    code, text = run(f"{name}:verify", "--k", "1")
    err = capsys.readouterr().err
    assert code == 2 and text == "" and "cannot import module" in err and "Traceback" not in err


def test_sys_exit_in_a_call_is_the_verifiers_error():
    code, text = run(f"{ME}:exits_zero", "--k", "1")
    assert code == 2 and "ERROR" in text and "SystemExit" in text
    report = testing.check_greedy(lambda scores, tokens: sys.exit(0), random_cases=0)
    assert report.verdict == "error" and "SystemExit" in report.summary


@pytest.mark.parametrize("option,value", [("--time-budget", "nan"), ("--time-budget", "inf"), ("--time-budget", "0"),
                                          ("--call-budget", "inf"), ("--call-budget", "-1")])
def test_budgets_must_be_finite_and_positive(option, value, capsys):
    code, _ = run(f"{ME}:hangs", option, value, "--call-budget" if option == "--time-budget" else "--time-budget",
                  "inf")
    assert code == 2 and "--" in capsys.readouterr().err
    code, _ = run(f"{ME}:hangs", option, value)  # alone: the one named
    assert code == 2 and f"{option} must be a finite number of seconds" in capsys.readouterr().err


# -- items 5 and 6: every argument checked before any work, named --------------------------------------
@pytest.mark.parametrize("argv,option", [
    (["--kind", "tree", "--tree-shape", "bogus"], "--tree-shape"),
    (["--tree-shape", "bogus"], "--tree-shape"),  # ignored by a chain check, but still a typo
    (["--kind", "tree", "--tree-shape", "0"], "--tree-shape"),
    (["--kind", "tree", "--tree-shape", "a,b"], "--tree-shape"),
    (["--kind", "tree", "--mode", "sampled", "--tree-shape", "0,0"], "--tree-shape"),
    (["--mode", "sampled", "--draws-uniforms", "--vocab", "0"], "--vocab"),
    (["--mode", "sampled", "--draws-uniforms", "--vocab", "1"], "--vocab"),
    (["--mode", "sampled", "--draws-uniforms", "--vocab", "-1"], "--vocab"),
    (["--mode", "sampled", "--draws-uniforms", "--vocab", str(10 ** 9)], "--vocab"),
    (["--mode", "sampled", "--draws-uniforms", "--rounds", str(10 ** 12)], "--rounds"),
    (["--mode", "sampled", "--draws-uniforms", "--alpha", "2"], "--alpha"),
    (["--seed", "-1"], "--seed"),
    (["--k", "-1"], "--k"),
    (["--mode", "sampled", "--drafts", "both"], "--drafts"),
    (["--kind", "tree", "--drafts", "stochastic"], "--drafts"),
])
def test_bad_arguments_exit_two_naming_the_option(argv, option, capsys):
    code, text = run("specverify:accept_from_uniforms", *argv)
    err = capsys.readouterr().err
    assert code == 2 and text == "" and option in err and "Traceback" not in err
    assert "the verifier" not in err  # the harness's argument, not the verifier's fault


def _never_called(*args):
    raise AssertionError("the harness called the verifier with a bad argument")


@pytest.mark.parametrize("check,kwargs,argument", [
    (testing.check_exact, dict(kind="tree", tree_shape="bogus"), "tree_shape"),
    (testing.check_exact, dict(kind="tree", tree_shape=[]), "tree_shape"),
    (testing.check_exact, dict(seed=-1), "seed"),
    (testing.check_exact, dict(time_budget=math.nan), "time_budget"),
    (testing.check_exact, dict(call_budget="5"), "call_budget"),
    (testing.check_exact, dict(drafts="none"), "drafts"),
    (testing.check_exact, dict(layout="hf"), "layout"),
    (testing.check_exact, dict(full_scan="False"), "full_scan"),
    (testing.check_sampled, dict(vocab=1), "vocab"),
    (testing.check_sampled, dict(vocab=10 ** 9), "vocab"),
    (testing.check_sampled, dict(rounds=10 ** 12), "rounds"),
    (testing.check_sampled, dict(kind="tree", tree_shape=[0]), "tree_shape"),
    (testing.check_sampled, dict(time_budget=math.inf), "time_budget"),
    (testing.check_sampled, dict(power=1.0), "power"),
    (testing.check_sampled, dict(warp="temperature=0.5"), "warp"),
    (testing.check_sampled, dict(target=np.ones((3, 4)), draft=np.zeros((2, 4))), "draft"),
    (testing.check_greedy, dict(kind="tree", tree_shape="-1,5"), "tree_shape"),
    (testing.check_greedy, dict(seed=-1), "seed"),
    (testing.check_greedy, dict(call_budget=math.inf), "call_budget"),
])
def test_the_api_names_a_bad_argument_before_calling_the_verifier(check, kwargs, argument):
    with pytest.raises(ValueError) as e:  # an ArgumentError
        check(_never_called, **kwargs)
    assert getattr(e.value, "argument", None) == argument and argument in str(e.value)


def test_a_time_budget_spent_drawing_drafts_is_not_the_verifiers():
    def first_call_raises(target_probs, draft_probs, draft_tokens, generator):  # ends the stray worker at once
        raise RuntimeError("never reached within the budget")

    report = testing.check_sampled(first_call_raises, vocab=2 ** 16, k=2, rounds=10 ** 6, time_budget=0.01)
    assert report.error["what"] == "time budget" and report.calls == 0
    assert report.summary.startswith("the check ran out of its time budget") and "0 calls took 0 s" in report.summary
    report = testing.check_exact(hangs, k=1, time_budget=0.3)  # here the time is the verifier's
    assert report.error["what"] == "time budget" and "(the last still running)" in report.summary
    assert "target_probs" in report.error["case"]


def test_a_uniform_taking_verifier_in_sampled_mode_is_pointed_to_draws_uniforms():
    code, text = run("specverify:accept_from_uniforms", "--mode", "sampled", "--rounds", "100")
    assert code == 2 and "--draws-uniforms" in text
    code, text = run("specverify:accept_from_uniforms", "--mode", "sampled", "--rounds", "400", "--draws-uniforms")
    assert code == 0


# -- item 7: --drafts ------------------------------------------------------------------------------------
def test_a_verifier_for_drafted_rows_only_is_told_of_drafts_stochastic_and_proven_with_it():
    code, text = run(f"{ME}:drafted_rows_only", "--k", "1", "--cuts", "analytic")
    assert code == 2 and "draft_probs=None" in text and "--drafts stochastic" in text
    code, text = run(f"{ME}:drafted_rows_only", "--k", "1", "--cuts", "analytic", "--drafts", "stochastic")
    assert code == 0 and "LOSSLESS" in text and "'deterministic'" not in text
    code, text = run("specverify:accept_from_uniforms", "--k", "1", "--cuts", "analytic", "--drafts",
                     "deterministic", "--json")
    assert code == 0 and json.loads(text)["settings"]["drafts"] == ["deterministic"]
    code, text = run("specverify:accept_from_uniforms", "--mode", "sampled", "--draws-uniforms", "--rounds", "400",
                     "--drafts", "deterministic", "--json")
    assert code == 0 and json.loads(text)["settings"]["draft_kind"] == "deterministic"


# -- item 8: tree greedy verifiers, comma-separated parents ---------------------------------------------
def test_a_tree_greedy_verifier_is_checked_from_the_command_line():
    code, text = run("specverify:verify_tree_greedy", "--kind", "tree", "--mode", "greedy", "--tree-shape", "-1,-1",
                     "--vocab", "2")
    assert code == 0 and "tree verifier" in text and "LOSSLESS" in text
    code, text = run("specverify:verify_tree_greedy", "--kind", "greedy", "--vocab", "2", "--k", "1")
    assert code == 2 and "--kind tree" in text


def test_comma_separated_parents_parse_with_a_space_or_an_equals_sign():
    for argv in (["--tree-shape", "-1,0"], ["--tree-shape=-1,0"]):
        code, text = run("specverify:accept_tree_from_uniforms", "--kind", "tree", "--cuts", "analytic", "--json",
                         *argv)
        assert code == 0 and json.loads(text)["settings"]["tree_shape"] == [-1, 0]


# -- item 9: --json is strict JSON, alone on stdout ---------------------------------------------------
def _strict(text):
    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_is_strict_and_the_verifiers_prints_go_to_stderr(tmp_path, monkeypatch, capsys):
    code, text = run(f"{ME}:chatty_impossible", "--mode", "sampled", "--rounds", "100", "--json")
    report = _strict(text)
    assert code == 1 and report["verdict"] == "violation" and report["positions"][0]["statistic"] == "inf"
    assert "verifier noise" in capsys.readouterr().err
    name = _module(tmp_path, monkeypatch, "print('imported {')\nfrom specverify import accept_from_uniforms\n")
    code, text = run(f"{name}:accept_from_uniforms", "--k", "1", "--cuts", "analytic", "--json")
    assert code == 0 and _strict(text)["verdict"] == "lossless" and "imported {" in capsys.readouterr().err


def test_catalogue_json_is_one_document():
    code, text = run("--catalogue", "--json")
    assert code == 0 and any(e["name"] == "residual_skipped" for e in _strict(text)["catalogue"])
    code, text = run("--catalogue", "bonus_from_wrong_row", "--mode", "exact", "--json")
    doc = _strict(text)
    assert code == 0 and doc["missed"] == 0 and doc["entries"][0]["caught"] is True


def test_python_dash_m_exits_two_when_the_verifier_calls_sys_exit_zero():
    proc = subprocess.run([sys.executable, "-m", "specverify.testing", "tests.testing.test_cli_reliability:exits_zero",
                           "--k", "1", "--json"], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 2 and _strict(proc.stdout)["error"]["what"] == "raised", proc.stderr
