"""What quantization does to a real model's answers: a folder and its `resin quantize` copies
scored by the reference runner in float32 over one fixed text (teacher-forced, one prefill):
perplexity of the text and top-1 agreement (how often the quantized model's next-token argmax
equals the source model's), per format.

`python tests/models/quant_accuracy.py [default|gemma3 ...]` prints the table of
docs/checkpoints.md; `test_quant_accuracy.py` checks the default model's FP8 rows.
"""

from __future__ import annotations

import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from ref_planner import TinyPlanner

from resin.tokenizer import Tokenizer
from resin_app.quantize import quantize_folder
from resin_models_torch.registry import load_runner

TEXT = Path(__file__).parents[2] / "docs" / "architecture.md"
"""The fixed text: the project's own architecture notes (English prose with code names)."""


@dataclass(frozen=True)
class Score:
    perplexity: float
    top1: torch.Tensor  # [N] next-token argmax at every position but the last


def text_tokens(folder: Path, count: int) -> list[int]:
    tokens = Tokenizer.from_dir(folder).encode(TEXT.read_text(encoding="utf-8"))
    if len(tokens) < count:
        raise ValueError(f"{TEXT} has {len(tokens)} tokens, fewer than {count}")
    return tokens[:count]


def score(folder: Path, tokens: list[int]) -> Score:
    """Perplexity of `tokens[1:]` given their prefixes, and the argmax at each position."""
    pages = 4 * (2 + len(tokens) // 16)  # room for every cache group's pages (Gemma has two)
    runner = load_runner(folder, dtype=torch.float32, num_pages=pages)
    runner.record_logits = True
    TinyPlanner(runner, num_pages=pages).run([tokens], max_new=1, chunk=256)
    logits = torch.cat([step.logits for step in runner.recorded])[: len(tokens) - 1]
    targets = torch.tensor(tokens[1:])
    nll = -torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
    return Score(math.exp(float(nll.mean())), logits.argmax(-1))


def compare(folder: Path, formats: tuple[str, ...], count: int, root: Path) -> list[str]:
    """Markdown rows `| format | perplexity | vs source | top-1 agreement |`."""
    tokens = text_tokens(folder, count)
    base = score(folder, tokens)
    rows = [f"| source (float32) | {base.perplexity:.3f} | | |"]
    for fmt in formats:
        quantized = quantize_folder(folder, root / fmt, fmt)
        got = score(quantized, tokens)
        agree = float((got.top1 == base.top1).float().mean())
        ratio = got.perplexity / base.perplexity
        rows.append(f"| {fmt} | {got.perplexity:.3f} | x{ratio:.4f} | {agree:.1%} |")
    return rows


def main(names: list[str]) -> None:
    from resin_model.default_model import converted_gguf_dir, default_model_dir, gemma3_gguf_path

    for name in names or ["default", "gemma3"]:
        folder = (
            default_model_dir() if name == "default" else converted_gguf_dir(gemma3_gguf_path())
        )
        with tempfile.TemporaryDirectory() as root:
            rows = compare(folder, ("fp8-channel", "fp8-block"), 1024, Path(root))
        print(f"{name} ({folder.name}), {TEXT.name}, 1024 tokens")
        print("| format | perplexity | vs source | top-1 agreement |\n|---|---:|---:|---:|")
        print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
