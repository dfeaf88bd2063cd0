"""``experiments.end_to_end.draft_eval``'s summaries, table and figure on a small made-up run (no model).

The numbers are chosen so that every value the table prints can be checked by hand: the speed-up
of a config is its tokens/s over plain generate's of the same mode (``hf_assisted_ee`` against
greedy ``generate``), the time split sums the parts over the runs, and the figure is drawn from
the cached files alone.
"""

import math

import pytest

pytest.importorskip("matplotlib")

from experiments import paths  # noqa: E402
from experiments.end_to_end import draft_eval, real_model_tables  # noqa: E402

PROMPTS = ("a", "b")


def _run(config, prompt, tokens_per_s, parts=(0.0, 0.0, 0.0, 0.0), same="", drafted=float("nan")):
    seconds = 96 / tokens_per_s
    return dict(config=config, prompt=prompt, repeat=0, mode="sample" if "sample" in config else "greedy",
                new_tokens=96, seconds=seconds, tokens_per_s=tokens_per_s, target_passes=48, drafted=drafted,
                **{part: share * seconds for part, share in zip(draft_eval.ROUND_PARTS, parts)},
                same_as_generate=same)


def _records(k=2):
    out = []
    for mode in ("greedy", "sample"):
        for r in range(10):
            emitted = 2 if r % 2 else 1  # position 1 accepted in every other round
            for i in range(k):
                out.append(dict(mode=mode, prompt="a", round=r, position=i + 1, reached=int(i < emitted),
                                value=float(r % 2 and i == 0), emitted=emitted, gate=0.3 if i == 0 else 0.05))
    return out


@pytest.fixture
def run(tmp_path):
    rows = []
    for prompt in PROMPTS:
        rows += [_run("hf_greedy", prompt, 10.0, same=True), _run("hf_assisted_ee", prompt, 5.0, same=True),
                 _run("sv_greedy_hybrid_auto", prompt, 12.0 if prompt == "a" else 15.0, (0.1, 0.8, 0.01, 0.09), True),
                 _run("hf_sample", prompt, 8.0), _run("sv_sample_learned_drawn_tree", prompt, 8.0, (0.4, 0.5, 0.02, 0.08),
                                                     drafted=120 if prompt == "a" else 168)]
    records = _records()
    summary = draft_eval.acceptance_summary(records, 2)
    speed = draft_eval.speed_summary(rows)
    draft = {"tokens": 5000, "tokens_by_kind": {"answers": 5000, "answers_trained": 3000}, "steps": 40,
             "params": {"vocab": 512, "batch": 8, "epochs": 2}, "vocab_coverage_answers": 0.97}
    meta = dict(paths.run_metadata(), prompt_sets=["heldout"], n_prompts=2, max_new=96, k=2, min_confidence=0.2,
                draft=draft)
    draft_eval._write_csv(tmp_path / "acceptance.csv", records)
    draft_eval._write_csv(tmp_path / "runs.csv", rows)
    paths.write_json(tmp_path / "meta.json", dict(meta, summary=summary, speed=speed))
    return tmp_path, summary, speed, meta


def test_speed_summary_ratios_against_plain_generate_of_the_same_mode(run):
    _, _, speed, _ = run
    by = {s["config"]: s for s in speed}
    assert by["hf_assisted_ee"]["ratio"] == pytest.approx(0.5)  # against greedy generate
    auto = by["sv_greedy_hybrid_auto"]
    assert auto["ratio"] == pytest.approx(192 / (96 / 12 + 96 / 15) / 10)  # pooled: tokens over seconds
    assert auto["min_ratio"] == pytest.approx(1.2) and auto["same"] == "2/2"
    assert auto["shares"] == "0.10/0.80/0.01/0.09" and by["hf_assisted_ee"]["shares"] == ""
    assert by["sv_sample_learned_drawn_tree"]["ratio"] == pytest.approx(1.0)
    assert by["sv_sample_learned_drawn_tree"]["drafted_per_round"] == pytest.approx(288 / 96)  # nodes per pass
    assert math.isnan(by["hf_assisted_ee"]["drafted_per_round"])


def test_speed_summary_from_the_cached_csv_equals_the_run_s(run):
    out_dir, _, speed, _ = run
    again = draft_eval.speed_summary([draft_eval._numbers(r) for r in real_model_tables.read(out_dir / "runs.csv")])
    assert [s["config"] for s in again] == [s["config"] for s in speed]
    for a, b in zip(again, speed):
        for key, value in b.items():
            assert a[key] == value or (isinstance(value, float) and (math.isnan(value) and math.isnan(a[key])
                                                                      or a[key] == pytest.approx(value))), key


def test_acceptance_summary_and_table(run, tmp_path):
    out_dir, summary, speed, meta = run
    assert summary["greedy"]["rates"] == [0.5, 0.0] and summary["greedy"]["measured"] == 1.5
    table = tmp_path / "table.md"
    draft_eval.write_table(summary, speed, meta, table, "python -m experiments.end_to_end.draft_eval")
    text = table.read_text()
    assert "draft / target / verify / other" in text and "| 3.00 |" in text  # the drawn tree's nodes per pass
    assert "Draft: 5000 training tokens" in text and "trained 40 steps of 8 sequences (2 epochs)" in text  # the run's draft
    for config in ("hf_assisted_ee", "sv_greedy_hybrid_auto", "sv_sample_learned_drawn_tree"):
        assert f"| {config} |" in text


def test_round_starts_compare_decoding_with_teacher_forcing_where_rounds_start(run, tmp_path):
    """Position 1 of each greedy round against teacher-forced step 1 at the round's start and at
    every answer position, on the prompts whose decoding is the teacher-forced answer only."""
    def rec(prompt, start, value, mode="greedy", position=1):
        return dict(mode=mode, prompt=prompt, round=0, position=position, reached=1, value=value, emitted=1, gate=0.1,
                    start=start)

    records = [rec("a", 0, 1.0), rec("a", 1, 0.0), rec("a", 1, 1.0, position=2), rec("a", 3, 1.0), rec("a", 9, 1.0),
               rec("a", 2, 0.0, mode="sample"), rec("b", 0, 1.0)]
    answers, first_right = [[1, 2, 3, 4, 5], [7, 8, 9]], [[1, 0, 0, 1, 1], [0, 0, 0]]
    got = draft_eval.round_starts(records, ["a", "b"], answers, first_right, {"a": [1, 2, 3, 4, 5, 6], "b": [7, 8, 0]})
    assert got == {"aligned_prompts": 1, "round_starts": 3, "decoded_at_starts": pytest.approx(2 / 3),
                   "forced_at_starts": pytest.approx(2 / 3), "forced_everywhere": pytest.approx(3 / 5),
                   "answer_positions": 5}  # b's decoding left its answer: not counted; a's start 9 is past it
    out_dir, summary, speed, meta = run
    summary = dict(summary, teacher_forced={"top1": [0.5], "random_top1": 0.1, "only_true": 5, "only_random": 1,
                                            "positions": 5, "round_starts": got})
    draft_eval.write_table(summary, speed, meta, tmp_path / "t.md", "cmd")
    assert "| teacher-forced step 1, where greedy rounds start | 3 | 0.667 |" in (tmp_path / "t.md").read_text()


def test_the_figure_is_drawn_from_the_cached_run(run, tmp_path):
    out_dir, *_ = run
    path = draft_eval.plot(out_dir, tmp_path / "learned_draft.png")
    assert path.is_file() and path.stat().st_size > 10_000
    assert real_model_tables.read(out_dir / "runs.csv")[0]["config"] == "hf_greedy"


def test_planner_rounds_won_and_training_tokens_are_described():
    rows = [{"won": "learned:3;lookup:5;none:2"}, {"won": "lookup:10"}, {"won": ""}]
    assert draft_eval._won(rows) == "learned 0.15, lookup 0.75, none 0.10"
    assert draft_eval._won([{"config": "sv_greedy_lookup"}]) == ""
    info = {"tokens_by_kind": {"answers": 1000, "answers_trained": 600, "documents": 50}}
    assert draft_eval._by_kind(info) == " (1,000 answers, of them 600 trained on, 50 documents)"


@pytest.mark.parametrize("name", ["Planner", "../x", "a b", ""])
def test_a_table_name_outside_media_is_refused(name, capsys):
    with pytest.raises(SystemExit) as info:
        draft_eval.main(["--name", name, "--table-only"])
    assert info.value.code == 2 and "--name" in capsys.readouterr().err


def test_each_mode_takes_its_own_calibration(tmp_path, monkeypatch):
    """Sampling rows are priced with the --sample calibration of the run's warp; without one (or one
    of another warp) with the greedy calibration, and the table says which; none: learned online."""
    from specverify import law
    from specverify.integrations.calibrate import cost_key

    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    costs, sources = draft_eval.planner_cost_files(1)
    assert costs == {"greedy": None, "sample": None} and set(sources.values()) == {"learned online"}
    greedy = law.MeasuredCosts((1.0, 1.1), {"learned": (0.07,)}, {"sampling": None})
    law.save_costs(greedy, law.cost_cache_path(cost_key("smollm2", fast_linears=True), 1))
    costs, sources = draft_eval.planner_cost_files(1)
    assert costs == {"greedy": greedy, "sample": greedy} and sources["sample"].endswith("(no sampling calibration)")
    sample_path = law.cost_cache_path(cost_key("smollm2", fast_linears=True, sample=True), 1)
    other = law.MeasuredCosts((1.0, 1.2), {"learned": (0.1,)}, {"sampling": dict(draft_eval.SAMPLE, temperature=1.0,
                                                                                 min_p=0.0)})
    law.save_costs(other, sample_path)
    assert draft_eval.planner_cost_files(1)[0]["sample"] == greedy  # another warp's costs are not this run's
    sample = law.MeasuredCosts((1.0, 1.2), {"learned": (0.1,)}, {"sampling": dict(draft_eval.SAMPLE, min_p=0.0)})
    law.save_costs(sample, sample_path)
    costs, sources = draft_eval.planner_cost_files(1)
    assert costs == {"greedy": greedy, "sample": sample} and draft_eval.calibrate_args("sample", 1) in sources["sample"]
    assert "greedy: " in draft_eval._costs_text(sources) and draft_eval._costs_text("learned online") == "learned online"


@pytest.mark.parametrize("threads", [1, 2])
def test_the_calibrate_command_the_table_names_writes_the_costs_it_reads(threads):
    """The command printed beside each mode's costs, parsed by calibrate's own parser, times that
    mode with :data:`SAMPLE`'s warp at the table's threads (what planner_cost_files accepts)."""
    from specverify.integrations import calibrate

    for mode in ("greedy", "sample"):
        args = calibrate._parser().parse_args(draft_eval.calibrate_args(mode, threads).split())
        assert (args.sample, args.threads, args.learned, args.fast_linears) == (mode == "sample", threads, True, True)
        if mode == "sample":
            warp = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
            assert warp == draft_eval.SAMPLE | {"min_p": 0.0}
