"""Every Python example in the docs and the README runs.

Each page's ```python blocks run in order in one namespace (a later block may use an earlier
block's names, as a reader would), in a temporary working directory, with results written there.
A block that should not run has no place in the docs: write it as runnable or as ```text.
Shell commands (```bash) are the experiments' and CI's, checked where those run.
"""

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(`{3,}|~{3,})python[ \t]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)


def pages():
    # the reduced source trees of tools/aarch64_check.sh carry no README or docs: nothing to run there
    found = [p for p in [ROOT / "README.md"] if p.exists()] + sorted((ROOT / "docs").rglob("*.md"))
    skip = ("_build", "generated", "notebooks")
    return [p for p in found if not any(part in skip for part in p.relative_to(ROOT).parts[:-1])]


def python_blocks(text):
    return [m.group(2) for m in FENCE.finditer(text)]


def test_fence_reader():
    text = "a\n```python\nx = 1\n```\n```text\nnot run\n```\n````python\ny = '```'\n````\n"
    assert python_blocks(text) == ["x = 1\n", "y = '```'\n"]


def test_pages_found():
    names = {p.name for p in pages()}
    assert {"README.md", "getting_started.md"} <= names


@pytest.mark.parametrize("page", [p for p in pages() if python_blocks(p.read_text())],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECVERIFY_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("SPECVERIFY_MEDIA", str(tmp_path / "media"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.syspath_prepend(str(ROOT))
    namespace = {"__name__": "__docs__"}
    for i, block in enumerate(python_blocks(page.read_text())):
        code = compile(block, f"{page.relative_to(ROOT)} (python block {i + 1})", "exec")
        exec(code, namespace)  # noqa: S102 - the docs' own examples
