"""The real default model (SmolLM2-135M-Instruct, the packaged GGUF converted by Resin, or
`$RESIN_DEFAULT_GGUF`) in bfloat16 on the GPU: the reference runner and the fast runner, each
through the Engine, write the same greedy text as `transformers` in bfloat16 on the same
device, for five chat prompts (docs/gpu.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from resin import Engine, SamplingParams
from resin_app.bench.serve_parity import NEW_TOKENS, chat_prompts, transformers_greedy

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model() -> tuple[Path, Any, list[list[int]], int]:
    from resin.tokenizer import Tokenizer
    from resin_model.default_model import default_model_dir

    folder = default_model_dir()
    tok = Tokenizer.from_dir(folder)
    eos = tok.token_to_id("<|im_end|>")
    assert eos is not None
    prompts = chat_prompts(tok)
    return folder, tok, prompts, eos


def _engine_greedy(runner: Any, prompts: list[list[int]], eos: int) -> list[list[int]]:
    params = SamplingParams(max_output_tokens=NEW_TOKENS, temperature=0.0, stop_token_ids=[eos])
    with Engine(runner, context_length=256, max_sequences=8) as engine:
        requests = [engine.submit(p, params) for p in prompts]
        while engine.has_work():
            engine.step()
        return [list(r.take_result()) for r in requests]


def test_reference_and_fast_runner_bf16_write_transformers_bf16_text(
    model: tuple[Path, Any, list[list[int]], int],
) -> None:
    from resin_models_cuda import RunnerOptions
    from resin_models_cuda import load_runner as load_fast
    from resin_models_torch.registry import load_runner as load_reference

    folder, tok, prompts, eos = model
    want = transformers_greedy(folder, prompts, "cuda", eos)
    reference = _engine_greedy(load_reference(folder, "cuda", torch.bfloat16), prompts, eos)
    options = RunnerOptions(page_size=16, max_batch=8, max_context=256)
    fast = _engine_greedy(load_fast(folder, options, "cuda", torch.bfloat16), prompts, eos)
    texts = [[tok.decode(t) for t in side] for side in (want, reference, fast)]
    print(*zip(*texts, strict=True), sep="\n")
    assert texts[1] == texts[0]
    assert texts[2] == texts[0]
