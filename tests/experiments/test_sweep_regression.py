"""Statistical regression over a small sweep (deterministic: fixed seeds).

Every cell's accepted-length histogram must pass the chi-square law test at ALPHA / cells
(Bonferroni), and the cells' p-values -- uniform for a correct sampler -- must pass a KS test of
uniformity at ALPHA. Power check: the same sweep with the draft rows handed to ``accept`` warped
10% differently from the ones the tokens came from (the caller contract broken, mildly) must fail
both, and a grossly broken variant (draft probabilities dropped) must fail every cell.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("pandas")

from experiments.law import sweep  # noqa: E402

ALPHA = 1e-3  # family-wise
GRID = {"k": [1, 2, 4, 8], "vocab": [256, 32000], "acceptance": [0.5, 0.8]}
ROUNDS = 2000
SEED = 0


def run(variant, tmp_path):
    table, summary, _ = sweep.run_sweep(GRID, ROUNDS, SEED, variant=variant, alpha=ALPHA,
                                        executor=sweep.SerialExecutor(), results_root=tmp_path)
    return table, summary["test"]


def test_every_cell_follows_the_law(tmp_path):
    table, test = run("correct", tmp_path)
    assert test["cells"] == 16 and (table["rounds"] == ROUNDS).all()
    assert test["bonferroni_pass"], test["failing"]
    assert test["ks_pass"], test
    assert test["max_abs_z"] < 4.5
    # per-position acceptance is estimated, not assumed: it tracks the law's to a few s.e.
    for _, row in table.iterrows():
        assert abs(row["acc_emp_mean"] - row["acc_law_mean"]) < 0.05


def test_sweep_is_deterministic(tmp_path):
    grid = {"k": [3], "vocab": [256], "acceptance": [0.7]}
    a, _, _ = sweep.run_sweep(grid, 300, SEED, executor=sweep.SerialExecutor(), results_root=tmp_path / "a")
    b, _, _ = sweep.run_sweep(grid, 300, SEED, executor=sweep.SerialExecutor(), results_root=tmp_path / "b")
    assert a["counts"].tolist() == b["counts"].tolist() and a["chi2_p"].tolist() == b["chi2_p"].tolist()


def test_power_mild_warp_mismatch_is_rejected(tmp_path):
    _, test = run("warp_mismatch", tmp_path)
    assert not test["bonferroni_pass"] and test["ks_p"] < ALPHA


def test_power_dropped_draft_probs_fail_every_cell(tmp_path):
    _, test = run("no_draft_probs", tmp_path)
    assert test["cells_failing"] == test["cells"] and test["ks_p"] < ALPHA
