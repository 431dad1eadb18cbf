"""Acceptance: the real SmolLM2-135M-Instruct (the packaged GGUF, converted) answers through the
Engine + reference runner, and its greedy output equals `transformers` on the same weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from resin import Engine, FinishReason, SamplingParams
from resin.tokenizer import Tokenizer
from resin_model.default_model import default_model_dir
from resin_models_torch.registry import load_runner
from tests.conftest import cores_per_test

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
]


def chatml(question: str) -> str:
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.fixture(scope="module")
def folder() -> Path:
    torch.set_num_threads(cores_per_test())
    return default_model_dir()


def _transformers_greedy(model: object, prompt: list[int], new: int, eos: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(  # type: ignore[attr-defined]
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def test_answers_paris_and_equals_transformers(folder: Path) -> None:
    tok = Tokenizer.from_dir(folder)
    eos = tok.token_to_id("<|im_end|>")
    assert eos is not None and eos in tok.eos_token_ids
    prompts = [tok.encode(chatml(q)) for q in QUESTIONS]
    params = SamplingParams(max_output_tokens=20, temperature=0.0, stop_token_ids=[eos])
    with Engine(load_runner(folder), context_length=512) as engine:
        requests = [engine.submit(p, params) for p in prompts]  # one batch
        while engine.has_work():
            engine.step()
        outputs = [r.take_result() for r in requests]
    answer = tok.decode(outputs[0], skip_special_tokens=True)
    assert "Paris" in answer, answer
    assert requests[0].finish_reason is FinishReason.STOP and outputs[0][-1] == eos
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for prompt, got in zip(prompts, outputs, strict=True):
        assert got == _transformers_greedy(reference, prompt, 20, eos), tok.decode(got)
