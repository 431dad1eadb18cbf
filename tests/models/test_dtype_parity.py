"""The dtype parity matrix on the CPU: every reference architecture against `transformers` in
the same dtype, float32 and bfloat16 (torch runs bfloat16 on the CPU), on tiny random models and
on the real default model (SmolLM2-135M-Instruct).

Tolerances, per dtype (the error `err(a, b)` is the mean over positions of the largest
|log-probability difference| over the vocabulary):
- float32: logits within 1e-4 of transformers float32 at every position;
- bfloat16, tiny models: err(resin bf16, transformers fp32) <= BF16_FACTOR x
  err(transformers bf16, transformers fp32) + BF16_SLACK, i.e. no worse than transformers'
  own bfloat16 rounding; and the rotary cos/sin tables of a bfloat16 model are those of the
  float32 model at every position up to 32,768 (frequencies rounded to bfloat16 turn a position
  p by p * 2^-9 of a turn too far or too short: a wrong phase at long context);
- bfloat16, real weights: the same error bound, and greedy continuations equal to
  `transformers.generate` in bfloat16 token for token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from ref_compare import hf_greedy, hf_logits
from ref_hf import ARCHS, checkpoint
from ref_planner import TinyPlanner

from resin.tokenizer import Tokenizer
from resin_model.default_model import default_model_dir
from resin_models_torch.layers import Rotary
from resin_models_torch.registry import load_runner
from tests.conftest import cores_per_test

BF16_FACTOR = 1.5
"""bfloat16: our error against float32 may exceed transformers' own bfloat16 error by this
factor (two implementations round differently: fused attention, matmul blocking)."""
BF16_SLACK = 0.005
"""... plus this much (nats) where transformers' own error is tiny."""
FP32_LOGIT_TOL = 1e-4
PROMPT_LEN = 96


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over positions of max over the vocabulary of |log_softmax(a) - log_softmax(b)|."""
    diff = torch.log_softmax(a.float(), -1) - torch.log_softmax(b.float(), -1)
    return float(diff.abs().amax(-1).mean())


def resin_logits(folder: Path, tokens: list[int], dtype: torch.dtype) -> torch.Tensor:
    """The reference runner's logits at every position of `tokens`, prefilled in chunks of 32
    over 16-token pages (so cached keys are read back from the paged cache)."""
    runner = load_runner(folder, dtype=dtype)
    runner.record_logits = True
    TinyPlanner(runner).run([tokens], max_new=1, chunk=32)
    return torch.cat([step.logits for step in runner.recorded])[: len(tokens)]


def hf_bf16(folder: Path) -> Any:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    return model.eval()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tiny_architecture_in_fp32_and_bf16(arch: str) -> None:
    folder, hf32 = checkpoint(arch)
    tokens = torch.randint(0, 300, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7))
    prompt = tokens.tolist()
    oracle = hf_logits(hf32, prompt)
    fp32 = resin_logits(folder, prompt, torch.float32)
    assert float((fp32 - oracle).abs().max()) < FP32_LOGIT_TOL
    own = err(hf_logits(hf_bf16(folder), prompt), oracle)
    ours = err(resin_logits(folder, prompt, torch.bfloat16), oracle)
    assert ours <= BF16_FACTOR * own + BF16_SLACK, (
        f"{arch}: bf16 error {ours} vs transformers {own}"
    )


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_rotary_tables_do_not_depend_on_the_model_dtype(arch: str) -> None:
    folder, _ = checkpoint(arch)
    positions = torch.arange(0, 32768, 7)
    tables = []
    for dtype in (torch.float32, torch.bfloat16):
        model = load_runner(folder, dtype=dtype).model
        rotaries = [m for m in model.modules() if isinstance(m, Rotary)]
        assert rotaries, arch
        tables.append([r.cos_sin(positions) for r in rotaries])
    for (cos32, sin32), (cos16, sin16) in zip(*tables, strict=True):
        assert cos16.dtype == torch.float32
        assert torch.equal(cos32, cos16) and torch.equal(sin32, sin16), arch


def test_qwen2_5_vl_rotary_frequencies_stay_float32_in_bf16() -> None:
    """Qwen2.5-VL's M-RoPE text rotary and its vision tower's 2-D rotary: float32 and exact."""
    from vision_hf import qwen2_5_vl

    folder, _ = qwen2_5_vl()
    exact = load_runner(folder, dtype=torch.float32).model
    model = load_runner(folder, dtype=torch.bfloat16).model
    for name, buffer in exact.named_buffers():
        if name.endswith("inv_freq"):
            rounded = dict(model.named_buffers())[name]
            assert rounded.dtype == torch.float32 and torch.equal(rounded, buffer), name


SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = ("What is the boiling point of water?", "Who wrote Romeo and Juliet?")
GREEDY_TOKENS = 8
"""Their greedy paths have top-2 gaps above 0.4 nats over these 8 tokens in float32 (no tie
that bfloat16 rounding may break either way)."""


def test_default_model_bf16_matches_transformers_bf16() -> None:
    torch.set_num_threads(cores_per_test())
    folder = default_model_dir()
    tok = Tokenizer.from_dir(folder)
    prompts = [
        tok.encode(
            f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
        for q in QUESTIONS
    ]
    text = tok.encode((Path(__file__).parents[2] / "README.md").read_text())[:128]
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf16 = hf_bf16(folder)
    oracle = hf_logits(hf32, text)
    own = err(hf_logits(hf16, text), oracle)
    ours = err(resin_logits(folder, text, torch.bfloat16), oracle)
    assert ours <= BF16_FACTOR * own + BF16_SLACK, f"bf16 error {ours} vs transformers {own}"

    runner = load_runner(folder, dtype=torch.bfloat16)
    seqs = TinyPlanner(runner).run(prompts, max_new=GREEDY_TOKENS, chunk=24)
    for seq, prompt in zip(seqs, prompts, strict=True):
        expected = hf_greedy(hf16, prompt, GREEDY_TOKENS)
        assert seq.generated == expected, (tok.decode(seq.generated), tok.decode(expected))
