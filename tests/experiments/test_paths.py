"""Cache keys of experiments' results (``experiments.paths``)."""

import specverify
from experiments import paths


def test_unversioned_keys_survive_a_release(monkeypatch):
    """Data keyed with ``versioned=False`` (the target's answers: hours of shards) keeps its folder
    across a version bump; results keyed with the version do not."""
    params = {"answers": {"seed": 0, "max_new": 96}}
    before = paths.params_key("train_draft", params, versioned=False), paths.params_key("train_draft", params)
    monkeypatch.setattr(specverify, "__version__", specverify.__version__ + ".post1")
    after = paths.params_key("train_draft", params, versioned=False), paths.params_key("train_draft", params)
    assert before[0] == after[0]
    assert before[1] != after[1]
