"""Real weights (SmolLM2-135M-Instruct, CPU): `resin serve --speculative ngram|draft` builds
the engine's speculation, and on a prompt whose answer copies from it, n-gram drafts are
accepted and the greedy text is identical to a plain run in fewer steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from resin import Engine, SamplingParams
from resin.engine.proposers import DraftModelProposer, NgramProposer
from resin.tokenizer import Tokenizer
from resin_app.loading import LoadOptions, speculation_for
from resin_model.default_model import DEFAULT_MODEL_NAME, default_model_dir
from resin_models_torch.registry import load_runner
from tests.conftest import cores_per_test

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, "
    "polished the great lens until it shone, and watched the ships pass safely along the rocky "
    "coast until dawn."
)


@pytest.fixture(scope="module")
def folder() -> Path:
    torch.set_num_threads(cores_per_test())
    return default_model_dir()


def _run(
    folder: Path, prompt: list[int], speculation: object, new: int = 40
) -> tuple[list[int], int, Engine]:
    params = SamplingParams(max_output_tokens=new, temperature=0.0)
    engine = Engine(load_runner(folder), context_length=512, speculation=speculation)  # type: ignore[arg-type]
    request = engine.submit(prompt, params)
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
    return request.take_result(), steps, engine


def test_ngram_copies_faster_with_identical_greedy_text(folder: Path) -> None:
    tok = Tokenizer.from_dir(folder)
    prompt = tok.encode(
        "<|im_start|>user\nRepeat this paragraph exactly:\n"
        f"{PARAGRAPH}<|im_end|>\n<|im_start|>assistant\n"
    )
    plain, plain_steps, _ = _run(folder, prompt, None)
    spec = speculation_for(LoadOptions(speculative="ngram", num_draft_tokens=6), 512)
    assert isinstance(spec.proposer, NgramProposer)
    fast, fast_steps, engine = _run(folder, prompt, spec)
    assert fast == plain, tok.decode(fast)
    assert "lighthouse keeper" in tok.decode(plain)
    snap = engine.metrics
    assert snap is not None and snap.spec_decode_num_accepted_tokens >= 10
    assert fast_steps < plain_steps * 0.7


def test_draft_model_option_loads_a_second_runner(folder: Path) -> None:
    spec = speculation_for(
        LoadOptions(speculative="draft", draft_model=DEFAULT_MODEL_NAME, num_draft_tokens=3), 512
    )
    assert isinstance(spec.proposer, DraftModelProposer) and spec.num_draft_tokens == 3
    tok = Tokenizer.from_dir(folder)
    prompt = tok.encode("<|im_start|>user\nCount to ten.<|im_end|>\n<|im_start|>assistant\n")
    plain, _, _ = _run(folder, prompt, None, new=12)
    fast, _, engine = _run(folder, prompt, spec, new=12)
    assert fast == plain
    snap = engine.metrics
    assert snap is not None
    assert snap.spec_decode_num_accepted_tokens == snap.spec_decode_num_draft_tokens > 0
