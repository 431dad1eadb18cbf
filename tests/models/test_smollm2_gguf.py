"""The packaged SmolLM2-135M-Instruct GGUF, converted by Resin, against `transformers`' own GGUF
loading of the same file: identical tensors, identical token ids on a mixed corpus, the same
rendered chat template, and `<|im_end|>` as a stop token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from resin.tokenizer import Tokenizer
from resin_model.default_model import default_gguf_path, default_model_dir
from tests.conftest import cores_per_test

CORPUS = [
    "What is the capital of France?",
    "Hello world! 2024-06-01, 3.14159 and 1,000,000 items.",
    "café naïve résumé Ünïcödé — “quotes” «guillemets» ñ",
    "日本語のテキストと中文字符, 한국어 문장, العربية, русский текст",
    "emoji 😀🧑‍🚀👍🏽🇫🇷 and ZWJ sequences",
    "def f(x):\n    return x ** 2  # square\n\n\tprint(f'{x!r}')\r\n",
    "   leading and trailing spaces   ",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "tabs\tand\nnewlines\n\n\nand <jupyter_code> specials <|endoftext|>",
]


@pytest.fixture(scope="module")
def folder() -> Path:
    return default_model_dir()


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    return default_gguf_path()


def test_tensors_equal_transformers_gguf_loading(folder: Path, gguf_file: Path) -> None:
    torch.set_num_threads(cores_per_test())
    pytest.importorskip("accelerate", reason="transformers loads GGUF weights only with it")
    reference = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    ours = AutoModelForCausalLM.from_pretrained(folder)
    ref, got = reference.state_dict(), ours.state_dict()
    assert set(ref) == set(got)
    for name in ref:
        assert torch.equal(ref[name], got[name]), name
    for field in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "vocab_size"):
        assert getattr(ours.config, field) == getattr(reference.config, field), field
    assert ours.config.tie_word_embeddings


def test_token_ids_equal_transformers(folder: Path, gguf_file: Path) -> None:
    reference = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    ours = Tokenizer.from_dir(folder)
    assert ours.vocab_size == len(reference)
    for text in CORPUS:
        ids = ours.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text, text
    assert ours.encode("<|im_start|>") == [1]


def test_chat_template_and_stop_tokens(folder: Path, gguf_file: Path) -> None:
    reference = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    ours = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    rendered = ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert rendered.endswith("<|im_start|>assistant\n")
    tok = Tokenizer.from_dir(folder)
    assert tok.token_to_id("<|im_end|>") in tok.eos_token_ids
    assert tok.info.eos_token == "<|im_end|>"
    assert tok.chat_template == ours.chat_template
