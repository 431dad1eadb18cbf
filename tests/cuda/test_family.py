"""The `cuda` runner family, found through its entry point, builds the same `CudaRunner` as
`random_runner` with the request's row cap, longest sequence and dtype."""

from __future__ import annotations

import torch

from resin import Engine, SamplingParams, TokensEvent
from resin.protocols import Runner
from resin_app.runners import build_runner
from resin_model.family import BuildRequest
from resin_model.hf_config import parse_config
from resin_model.presets import TINY


def _greedy(runner: Runner) -> list[int]:
    params = SamplingParams(max_output_tokens=5, temperature=0.0, ignore_stop_tokens=True)
    with Engine(runner, context_length=64, max_sequences=4) as engine:
        request = engine.submit([3, 1, 4, 1, 5], params)
        out: list[int] = []
        while engine.has_work():
            for event in engine.step():
                if isinstance(event, TokensEvent) and event.request_id == request.id:
                    out += event.token_ids
    return out


def test_the_cuda_family_builds_the_fast_runner(device: str) -> None:
    from resin_models_cuda import RunnerOptions, random_runner

    config = parse_config(TINY["llama"])
    request = BuildRequest(device, "float32", seed=1, max_sequences=4, context_length=64)
    built = build_runner(config, "cuda", request)
    assert built.options.max_batch == 4 and built.options.max_context == 64  # type: ignore[attr-defined]
    options = RunnerOptions(max_batch=4, max_context=64)
    direct = random_runner(config, options, device, torch.float32, seed=1)
    assert _greedy(built) == _greedy(direct)
    assert built.options.graph_prefill_tokens == 16  # type: ignore[attr-defined]


def test_graph_prefill_tokens_reaches_the_runner_from_serve_options(device: str) -> None:
    """`resin serve --graph-prefill-tokens 0` -> `LoadOptions` -> `BuildRequest` -> the fast
    runner's `RunnerOptions`: its short prefills stay on the varlen kernels."""
    from resin_app.cli import _build_parser, _options

    args = _build_parser().parse_args(["serve", "--graph-prefill-tokens", "0"])
    assert _options(args).graph_prefill_tokens == 0
    config = parse_config(TINY["llama"])
    request = BuildRequest(device, "float32", max_sequences=4, context_length=64,
                           graph_prefill_tokens=0)  # fmt: skip
    built = build_runner(config, "cuda", request)
    assert built.options.graph_prefill_tokens == 0  # type: ignore[attr-defined]
