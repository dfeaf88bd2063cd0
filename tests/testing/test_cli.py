"""The command line ``python -m specverify.testing``: a lossless verifier exits 0, a broken one 1,
a misbehaving one or bad arguments 2; the catalogue lists and runs.  In process (``cli.main``),
plus one real subprocess for ``-m``."""

import io
import subprocess
import sys
from pathlib import Path

import pytest

from specverify.testing import cli

ROOT = Path(__file__).resolve().parents[2]


def skipped_residual(target_probs, draft_probs, draft_tokens, uniforms):
    """A broken chain rule for the CLI to find (the recovered token drawn from p)."""
    from specverify.testing.broken import chain_rule

    return chain_rule(target_probs, draft_probs, draft_tokens, uniforms, residual="p")


def crashes(target_probs, draft_probs, draft_tokens, uniforms):
    raise RuntimeError("kernel exploded")


def run(*argv):
    out = io.StringIO()
    return cli.main(list(argv), out=out), out.getvalue()


def test_a_lossless_verifier_exits_zero_and_prints_the_verdict():
    code, text = run("specverify:accept_from_uniforms", "--kind", "chain", "--cuts", "analytic")
    assert code == 0 and "LOSSLESS" in text and "worst total variation" in text


def test_a_broken_verifier_exits_one_and_says_where():
    code, text = run(f"{__name__}:skipped_residual", "--cuts", "analytic", "--k", "1")
    assert code == 1 and "VIOLATION" in text and "reproducer" in text


def test_a_crashing_verifier_exits_two_naming_the_case():
    code, text = run(f"{__name__}:crashes")
    assert code == 2 and "kernel exploded" in text and "target_probs" in text


def test_greedy_and_sampled_modes_and_json():
    code, text = run("specverify:verify_greedy", "--kind", "greedy", "--k", "1")
    assert code == 0 and "plain greedy decoding" in text
    code, text = run("specverify:accept_from_uniforms", "--mode", "sampled", "--draws-uniforms", "--rounds", "1000",
                     "--json")
    assert code == 0 and '"detectable_tv"' in text


def test_the_catalogue_lists_and_runs():
    code, text = run("--catalogue")
    assert code == 0 and "residual_skipped" in text and "block_tokenwise_residual" in text
    code, text = run("--catalogue", "bonus_from_wrong_row", "--mode", "both")
    assert code == 0 and text.count("CAUGHT") == 2 and "every entry run was caught" in text


@pytest.mark.parametrize("argv,message", [
    (["nomodule_xyz:f"], "cannot import"),
    (["specverify:no_such_function"], "no attribute"),
    (["specverify"], "package.module:function"),
    (["specverify:accept_from_uniforms", "--vocab", "9"], "vocab"),
    (["--catalogue", "no_such_bug"], "no catalogue entry"),
    (["specverify:verify_greedy", "--kind", "greedy", "--mode", "exact"], "greedy"),
    ([], "name a verifier"),
])
def test_bad_arguments_exit_two_with_a_message(argv, message, capsys):
    code, _ = run(*argv)
    assert code == 2 and message in capsys.readouterr().err


def test_python_dash_m_exit_status():
    env_path = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "specverify.testing", "--catalogue"], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0 and "known-broken rules" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "specverify.testing", "specverify:nothing"], capture_output=True,
                          text=True, cwd=ROOT, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 2 and "no attribute" in proc.stderr
