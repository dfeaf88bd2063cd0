"""experiments.end_to_end.draft_rows: the modelled value of a chain, and the command's arguments."""

import pytest

from experiments.end_to_end import draft_rows


def test_chain_value_takes_the_best_length():
    # K = 1: 1.5 tokens over 1.2 + 0.1; K = 2: 1.75 over 1.3 + 0.2 (better); K = 3: 1.875 over 2.0 + 0.3
    K, tokens, speed = draft_rows.chain_value([0.5, 0.5, 0.5], [1.0, 1.2, 1.3, 2.0], [0.1, 0.2, 0.3])
    assert (K, tokens) == (2, pytest.approx(1.75)) and speed == pytest.approx(1.75 / 1.5)
    # a draft that is rarely right does not pay: no drafting, a plain step's 1 token a pass
    assert draft_rows.chain_value([0.05, 0.05], [1.0, 1.2, 1.3], [0.1, 0.2]) == (0, 1.0, 1.0)


@pytest.mark.parametrize("argv,words", [
    (["--widths", "many"], "--widths must be comma-separated integers"),
    (["--widths", "0,12288"], "--widths must be positive"),
    (["--tuning", "0"], "--tuning"),
    (["--k", "9"], "--k"),
])
def test_bad_options_are_refused_naming_them(argv, words, capsys):
    with pytest.raises(SystemExit) as info:
        draft_rows.main(argv)
    assert info.value.code == 2 and words in capsys.readouterr().err
