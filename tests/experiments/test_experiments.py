"""The experiments package end to end, with small parameters, into temporary directories.

Also: the synthetic families hit their requested acceptance, the draft-token sampler follows
its rows (chi-square on counts, with a power check), and the convergence summary's law test
rejects deliberately broken verification.
"""

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")
pytest.importorskip("imageio")
pytest.importorskip("pandas")

from experiments import convergence, figures, paths  # noqa: E402
from experiments.law import block, simulate, sweep, synthetic  # noqa: E402
from experiments import stats as st  # noqa: E402

ALPHA = 1e-6


# ------------------------------------------------------------------------------------------
# synthetic families
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family,mode,target", [
    ("noise", "sample", 0.68), ("noise", "sample", 0.3), ("mixture", "sample", 0.8),
    ("argmax", "greedy", 0.68), ("argmax", "greedy", 0.95), ("argmax", "sample", 0.15),
])
def test_pick_knob_hits_requested_acceptance(family, mode, target):
    base = synthetic.base_draws(np.random.default_rng(0), 3, 2000)
    knob = synthetic.pick_knob(base, target, family, mode)
    a = synthetic.acceptance(synthetic.target_rows(base), synthetic.draft_rows(base, family, knob), mode)
    assert a.mean() == pytest.approx(target, abs=1e-4)
    assert synthetic.pick_knob(base, target, family, mode) == knob  # deterministic


def test_pick_knob_out_of_reach_is_explained():
    base = synthetic.base_draws(np.random.default_rng(0), 2, 2000)
    with pytest.raises(ValueError, match="out of reach.*argmax"):
        synthetic.pick_knob(base, 0.9, "noise", "greedy")


def test_sample_acceptance_matches_the_package_law():
    import specverify as sv

    pair = synthetic.make_pair(np.random.default_rng(3), 4, 1000, acceptance_target=0.6)
    np.testing.assert_allclose(pair.acceptance, sv.law.acceptance_rates(pair.target, pair.draft), rtol=1e-12)


def test_sample_tokens_follow_their_rows():
    rng = np.random.default_rng(5)
    rows = synthetic.target_rows(synthetic.base_draws(rng, 2, 50, temperature=1.0))[:2]
    rows[1, 7] = 0.0  # a zero-mass token is never drawn
    toks = synthetic.sample_tokens(rows, 20000, np.random.default_rng(6))
    assert not np.any(toks[:, 1] == 7)
    for i in range(2):
        counts = np.bincount(toks[:, i], minlength=50)
        assert st.chisquare_counts(counts, rows[i]).pvalue > ALPHA
    # power check: the same counts against the other row are rejected
    assert st.chisquare_counts(np.bincount(toks[:, 0], minlength=50), rows[1]).pvalue < ALPHA


def test_bigram_continuation_law_is_a_law():
    m = synthetic.BigramModel(synthetic.random_bigram(np.random.default_rng(0), 3))
    law = m.continuation_law(1, 4)
    assert law.shape == (3, 3, 3, 3) and law.sum() == pytest.approx(1.0)
    p = m.table.astype(np.float64) / m.table.astype(np.float64).sum(axis=1, keepdims=True)
    assert law[2, 0, 1, 1] == pytest.approx(np.prod([p[a, b] for a, b in [(1, 2), (2, 0), (0, 1), (1, 1)]]))
    assert m.continuation_index([2, 0, 1, 1]) == np.ravel_multi_index((2, 0, 1, 1), law.shape)


def test_stats_helpers():
    assert st.positionwise_acceptance([2, 3, 5]).tolist() == pytest.approx([8 / 10, 5 / 8])
    assert st.tv_distance([5, 5], [0.5, 0.5]) == 0.0
    assert st.ks_uniform(np.linspace(0.01, 0.99, 50))[1] > 0.9
    assert st.ks_uniform(np.full(50, 1e-4))[1] < ALPHA


# ------------------------------------------------------------------------------------------
# convergence: law test and its power check, then the CLI end to end
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("greedy", [False, True])
def test_convergence_law_test_passes_and_detects_broken_verification(greedy):
    kw = dict(k=4, vocab=2048, rounds=3000, seed=3, acceptance=0.7, greedy=greedy)
    ok = simulate.run(**kw)
    assert ok["chi2_p"] > ALPHA and abs(ok["z"]) < 5
    assert sum(ok["counts"]) == 3000 and ok["chi2_dof"] == 4
    for variant in ("wrong_row",) if greedy else ("wrong_row", "no_draft_probs", "tokens_from_target"):
        bad = simulate.run(**kw, variant=variant)
        assert bad["chi2_p"] < ALPHA, (variant, bad["chi2_p"])


def test_convergence_cli_end_to_end(tmp_path, capsys):
    out, res = tmp_path / "media", tmp_path / "results"
    argv = ["--k", "3", "--vocab", "512", "--rounds", "150", "--frames", "6", "--seed", "1",
            "--out", str(out), "--results", str(res), "--no-progress"]
    assert convergence.main(argv) == 0
    text = capsys.readouterr().out
    assert "mean accepted: empirical" in text and "z = " in text and "p = " in text and "computed in" in text

    gif, png = out / paths.HERO_GIF, out / paths.HERO_PNG
    assert 0 < gif.stat().st_size < 2_000_000 and png.stat().st_size > 0
    import imageio.v3 as iio

    frames = iio.imread(gif, index=None)
    assert frames.ndim == 4 and 2 <= frames.shape[0] <= 6
    np.testing.assert_array_equal(iio.imread(png).shape[:2], frames.shape[1:3])

    (directory,) = (res / "convergence").iterdir()
    rounds, summary = convergence.load(directory)
    assert len(rounds) == 150 and set(rounds.columns) >= {"round", "n_accepted", "emitted_token", "draft_t2"}
    header = [ln for ln in (directory / "rounds.csv").read_text().splitlines() if ln.startswith("#")]
    assert any(ln.startswith("# params:") and '"seed": 1' in ln for ln in header)
    meta = json.loads(next(ln for ln in header if ln.startswith("# metadata:")).split(":", 1)[1])
    assert {"git_revision", "versions"} <= set(meta) and "numpy" in meta["versions"]
    assert summary["params"]["vocab"] == 512 and summary["counts"] == np.bincount(rounds["n_accepted"], minlength=4).tolist()

    # same parameters: the cached results are reused, only the figures are redrawn
    assert convergence.main(argv) == 0
    assert "cached" in capsys.readouterr().out


def test_convergence_greedy_and_mismatch_options(tmp_path, capsys):
    argv = ["--k", "2", "--vocab", "300", "--rounds", "60", "--frames", "3", "--greedy", "--mismatch", "0.4",
            "--out", str(tmp_path), "--results", str(tmp_path / "r"), "--no-progress"]
    assert convergence.main(argv) == 0
    assert "greedy verification (argmax draft, knob 0.4)" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------
# sweep and figures
# ------------------------------------------------------------------------------------------
def test_sweep_cli_caches_and_draws(tmp_path, capsys):
    argv = ["--k", "1,3", "--vocab", "256", "--acceptance", "0.6", "--rounds", "300", "--executor", "serial",
            "--results", str(tmp_path / "r"), "--out", str(tmp_path / "m"), "--no-progress"]
    assert sweep.main(argv) == 0
    text = capsys.readouterr().out
    assert "KS uniformity" in text and "2 cells computed" in text
    assert (tmp_path / "m" / paths.SWEEP_PNG).stat().st_size > 0
    assert sweep.main(argv + ["--no-figure"]) == 0
    assert "0 cells computed" in capsys.readouterr().out


def test_sweep_accepts_any_executor(tmp_path):
    """The default process pool, a thread pool and the serial executor give identical tables."""
    import concurrent.futures as cf

    grid = {"k": [2], "vocab": [256], "acceptance": [0.5, 0.9]}
    tables = []
    for i, ex in enumerate([None, cf.ThreadPoolExecutor(2), sweep.SerialExecutor()]):
        table, summary, _ = sweep.run_sweep(grid, rounds=200, executor=ex, workers=1, results_root=tmp_path / str(i))
        tables.append(table.drop(columns=["cell_s", "setup_s", "verify_s", "us_per_round"]))
        assert summary["computed_cells"] == 2
    for t in tables[1:]:
        assert t.equals(tables[0])


def test_figures_redraw_from_cached_results(tmp_path, capsys):
    res = tmp_path / "results"
    directory, _, cached = convergence.run(convergence.make_params(rounds=convergence.DEFAULTS["rounds"]), res)
    assert not cached
    _, _, sweep_dir = sweep.run_sweep({"k": [1, 2], "vocab": [256], "acceptance": [0.7]}, rounds=200,
                                      executor=sweep.SerialExecutor(), results_root=res)
    _, _, block_dir = block.run_block({"k": [1, 3], "vocab": [256], "acceptance": [0.7]}, rounds=200,
                                      executor=sweep.SerialExecutor(), results_root=res)
    out = tmp_path / "media"
    assert figures.main(["--results", str(res), "--out", str(out), "--sweep-dir", str(sweep_dir),
                         "--block-dir", str(block_dir)]) == 0
    for name in (paths.HERO_GIF, paths.HERO_PNG, paths.SWEEP_PNG, paths.BLOCK_PNG):
        assert (out / name).stat().st_size > 0
    # nothing cached: figures computes nothing and says which command to run
    assert figures.main(["--results", str(tmp_path / "empty"), "--out", str(out)]) == 1
    assert "python -m experiments.convergence" in capsys.readouterr().err


def test_block_experiment_table_and_cache(tmp_path):
    grid = {"k": [1, 3], "vocab": [256], "acceptance": [0.7]}
    table, summary, _ = block.run_block(grid, rounds=300, executor=sweep.SerialExecutor(), results_root=tmp_path)
    assert summary["computed_cells"] == 2 and len(table) == 2
    one = table[table["k"] == 1].iloc[0]
    assert one["gain_law"] == pytest.approx(0.0, abs=1e-12) and one["gain_emp"] == 0.0  # K = 1: identical
    three = table[table["k"] == 3].iloc[0]
    assert three["gain_law"] > 0 and abs(three["block_z"]) < 4 and abs(three["token_z"]) < 4
    again, summary, _ = block.run_block(grid, rounds=300, executor=sweep.SerialExecutor(), results_root=tmp_path)
    assert summary["computed_cells"] == 0
    cols = ["block_emp_mean", "token_emp_mean", "gain_law", "block_chi2_p"]
    assert again[cols].equals(table[cols])
