"""``python -m experiments.convergence`` under bad and edge-case options (issue 43, item 16).

Before: ``--frames 0/1/-3`` and ``--rounds 1/3`` crashed in Pillow after the results were computed
and cached, ``--seed -1`` came back as numpy's traceback, an unwritable ``--out`` was found only
after the whole computation, and the rounds table was built one draft column at a time. Every bad
value is now an argparse error naming its option, raised before anything is computed; one-frame
output is a still GIF plus the PNG. Runs use a few rounds of a tiny vocabulary.
"""

import contextlib
import io
import math
import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from experiments import paths  # noqa: E402
from experiments import convergence  # noqa: E402

FAST = settings(max_examples=40, derandomize=True, deadline=None, database=None)


def parse_error(argv) -> str:
    """The argparse error message for ``argv`` (which must be refused, with exit status 2)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit) as exited:
        convergence.parse_args(argv)
    assert exited.value.code == 2
    return stderr.getvalue()


@pytest.fixture
def never_compute(monkeypatch):
    """Any computation is a test failure: refusals must come first."""
    def fail(*args, **kwargs):
        raise AssertionError("computed before the options were checked")
    monkeypatch.setattr(convergence, "compute", fail)


# -- every option is checked by argparse, naming it ---------------------------------------------------
INTEGER_OPTIONS = {"--k": 1, "--vocab": 2, "--rounds": 1, "--frames": 1, "--seed": 0}  # option: smallest value


@FAST
@given(option=st.sampled_from(sorted(INTEGER_OPTIONS)), below=st.integers(min_value=1, max_value=10**6))
def test_integer_options_below_their_minimum_are_refused(option, below):
    value = INTEGER_OPTIONS[option] - below
    message = parse_error([f"{option}={value}"])
    assert f"argument {option}: must be an integer >= {INTEGER_OPTIONS[option]}, got '{value}'" in message


NOT_INTEGERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr),
                         st.sampled_from(["", "x", "1e3", "4.0", "0x10", "one"]))


@FAST
@given(option=st.sampled_from(sorted(INTEGER_OPTIONS)), text=NOT_INTEGERS)
def test_integer_options_refuse_non_integers(option, text):
    message = parse_error([f"{option}={text}"])  # "=": "-inf" is not taken for an option
    assert f"argument {option}: must be an integer" in message


@FAST
@given(value=st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0), st.just(math.nan)))
def test_acceptance_must_lie_strictly_between_0_and_1(value):
    assert "argument --acceptance: must be" in parse_error([f"--acceptance={value!r}"])


@FAST
@given(value=st.one_of(st.floats(max_value=0.0), st.just(math.inf), st.just(math.nan)))
def test_temperature_must_be_finite_and_positive(value):
    assert "argument --temperature: must be" in parse_error([f"--temperature={value!r}"])


@FAST
@given(value=st.one_of(st.floats(max_value=-1e-9), st.just(math.inf), st.just(math.nan)))
def test_mismatch_must_be_finite_and_non_negative(value):
    assert "argument --mismatch: must be" in parse_error([f"--mismatch={value!r}"])


@pytest.mark.parametrize("argv", [["--mismatch", "1.5", "--greedy"], ["--mismatch", "2", "--family", "mixture"]])
def test_a_weight_mismatch_above_1_names_the_option(argv):
    assert "--mismatch" in parse_error(argv) and "[0, 1]" in parse_error(argv)


def test_valid_options_parse(tmp_path):
    args = convergence.parse_args(["--k", "3", "--seed", "0", "--frames", "1", "--acceptance", "0.5",
                                   "--temperature", "0.3", "--out", str(tmp_path / "m"),
                                   "--results", str(tmp_path / "r")])
    assert (args.k, args.seed, args.frames, args.acceptance) == (3, 0, 1, 0.5)


# -- the output paths are checked before computing ------------------------------------------------------
@pytest.mark.parametrize("option", ["--out", "--results"])
def test_unwritable_output_is_refused_before_computing(tmp_path, never_compute, option):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    other = "--results" if option == "--out" else "--out"
    argv = ["--rounds", "5", option, str(blocker / "below"), other, str(tmp_path / "ok")]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), pytest.raises(SystemExit):
        convergence.main(argv)
    assert f"{option} " in stderr.getvalue() and "not a writable directory" in stderr.getvalue()


# -- one-frame output -------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["--frames", "1", "--rounds", "20"], ["--rounds", "1"], ["--rounds", "3"]],
                         ids=["one frame", "one round", "three rounds"])
def test_one_frame_output_is_a_still_gif_and_a_png(tmp_path, argv, capsys):
    import imageio.v3 as iio

    out = tmp_path / "media"
    assert convergence.main(argv + ["--k", "2", "--vocab", "64", "--out", str(out),
                                    "--results", str(tmp_path / "r"), "--no-progress"]) == 0
    assert "1 frame)" in capsys.readouterr().out
    gif = iio.imread(out / paths.HERO_GIF, index=None)
    assert gif.shape[0] == 1
    np.testing.assert_array_equal(iio.imread(out / paths.HERO_PNG).shape[:2], gif.shape[1:3])


# -- the rounds table ---------------------------------------------------------------------------------------
def test_rounds_table_is_built_in_one_step_for_many_draft_columns(tmp_path):
    import pandas as pd

    rounds, k = 4, 500  # pandas warns about fragmentation after ~100 column-by-column inserts
    result = {"accepted": np.zeros(rounds, np.int64), "emitted": np.ones(rounds, np.int64),
              "draft_tokens": np.arange(rounds * k, dtype=np.int64).reshape(rounds, k)}
    params = convergence.make_params(k=k, vocab=64, rounds=rounds)
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        convergence.save(result, params, tmp_path, 0.0)
    table, _ = convergence.load(tmp_path)
    assert list(table.columns[:3]) == ["round", "n_accepted", "emitted_token"]
    assert table.shape == (rounds, 3 + k) and table[f"draft_t{k - 1}"].tolist() == result["draft_tokens"][:, -1].tolist()
