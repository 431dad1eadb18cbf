"""Quantization on real weights: the default model (SmolLM2-135M-Instruct) written by
`resin quantize` as FP8 per channel and FP8 128x128 blocks, scored by the reference runner in
float32 over a fixed text against the unquantized folder (`quant_accuracy.py`; the full table
over 1,024 tokens is in docs/checkpoints.md).

Margins over the first 256 tokens, where the measured values are: perplexity 89.27 (source),
x1.057 (FP8 per channel), x1.011 (FP8 blocks); top-1 agreement 92.2% and 92.9%. The test asks
for at least 88% agreement and a perplexity at most 8% above the source's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from quant_accuracy import score, text_tokens

from resin_app.quantize import quantize_folder
from resin_model.default_model import default_model_dir
from tests.conftest import cores_per_test

TOKENS = 256
MIN_TOP1 = 0.88
MAX_PERPLEXITY_RATIO = 1.08


@pytest.fixture(scope="module")
def source() -> tuple[Path, list[int], object]:
    torch.set_num_threads(cores_per_test())
    folder = default_model_dir()
    tokens = text_tokens(folder, TOKENS)
    return folder, tokens, score(folder, tokens)


@pytest.mark.parametrize("fmt", ["fp8-channel", "fp8-block"])
def test_fp8_keeps_the_default_models_answers(
    fmt: str, source: tuple[Path, list[int], object], tmp_path: Path
) -> None:
    folder, tokens, base = source
    got = score(quantize_folder(folder, tmp_path / fmt, fmt), tokens)
    agree = float((got.top1 == base.top1).float().mean())  # type: ignore[attr-defined]
    ratio = got.perplexity / base.perplexity  # type: ignore[attr-defined]
    assert agree >= MIN_TOP1, f"{fmt}: top-1 agreement {agree:.3f}"
    assert ratio <= MAX_PERPLEXITY_RATIO, f"{fmt}: perplexity x{ratio:.4f}"
