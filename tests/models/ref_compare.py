"""Comparisons against `transformers`: per-position logits and greedy generation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from resin import Engine, SamplingParams, TokensEvent
from resin_models_torch.runner import RecordedStep


def hf_logits(hf_model: Any, tokens: list[int]) -> torch.Tensor:
    """Full-sequence logits [len(tokens), V] in one causal forward."""
    device = next(hf_model.parameters()).device
    with torch.no_grad():
        return hf_model(torch.tensor([tokens], device=device)).logits[0].float().cpu()  # type: ignore[no-any-return]


def hf_greedy(hf_model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """`transformers.generate` greedy continuation (no EOS, exactly `new_tokens`)."""
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def max_logit_error(
    recorded: list[RecordedStep], sequence_id: int, hf_model: Any, tokens: list[int]
) -> tuple[float, int]:
    """Largest |resin - hf| over every position the runner computed for `sequence_id`,
    and how many positions were compared (a recomputed position is compared each time)."""
    ref = hf_logits(hf_model, tokens)
    worst, count = 0.0, 0
    for step in recorded:
        mask = step.sequence_ids == sequence_id
        if not mask.any():
            continue
        positions = step.positions[mask].astype(np.int64)
        assert step.logits is not None
        diff = (step.logits[torch.from_numpy(mask)] - ref[torch.from_numpy(positions)]).abs()
        worst, count = max(worst, float(diff.max())), count + int(mask.sum())
    return worst, count


def drain(engine: Engine) -> list[TokensEvent]:
    events = []
    while engine.has_work():
        events += [e for e in engine.step() if isinstance(e, TokensEvent)]
    return events


def shared_prefix_hit_ratio(runner: Any) -> float:
    """Prefix-hit ratio of 64 requests sharing a 1,024-token prefix (the first one cached
    before the others arrive): the held-out check hybrid models run against pure attention."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, 300, (1024,), generator=gen).tolist()
    prompts = [prefix + torch.randint(0, 300, (32,), generator=gen).tolist() for _ in range(64)]
    params = SamplingParams(max_output_tokens=1, temperature=0.0)
    with Engine(runner, context_length=2048, prefix_cache=True,
                max_batch_tokens=2048) as engine:  # fmt: skip
        first = engine.submit(prompts[0], params)
        while not first.output_token_ids:
            engine.step()
        for prompt in prompts[1:]:
            engine.submit(prompt, params)
        drain(engine)
        metrics = engine.metrics
    assert metrics is not None and metrics.prefix_cache_queries == 64 * 1056
    return metrics.prefix_cache_hits / metrics.prefix_cache_queries


def run_staggered(
    runner: Any, prompts: list[list[int]], chunk: int, prefix: bool, new_tokens: int
) -> tuple[list[Any], Any]:
    """Greedy requests through the Engine, the first one cached (it has an output token)
    before the others arrive; invariants checked after every step."""
    params = SamplingParams(max_output_tokens=new_tokens, temperature=0.0)
    with Engine(runner, context_length=256, prefix_cache=prefix, prefill_chunk_tokens=chunk,
                max_batch_tokens=max(chunk, 16)) as engine:  # fmt: skip
        requests = [engine.submit(prompts[0], params)]
        while not requests[0].output_token_ids:
            engine.step()
        requests += [engine.submit(p, params) for p in prompts[1:]]
        while engine.has_work():
            engine.step()
            engine.check_invariants()
        return requests, engine.metrics


def assert_engine_matches_hf(
    runner: Any, hf_model: Any, prompts: list[list[int]], *, chunk: int, prefix: bool,
    retract: bool, new_tokens: int,
) -> None:  # fmt: skip
    """The Engine driving a logit-recording runner: the prefix cache hits (>= 40 tokens) when
    on, retraction happens when the pool is small (`retract`), every computed position's
    logits are within 2e-4 of transformers and greedy continuations are equal. Give it a
    runner built with `overlap=False`: an overlapped runner's steps land when its thread is
    done, so on a loaded machine hits and retraction would depend on timing."""
    assert not runner.overlap, "the scenario's counts need steps that land as they are taken"
    runner.record_logits = True
    requests, metrics = run_staggered(runner, prompts, chunk, prefix, new_tokens)
    assert (metrics.prefix_cache_hits > 0) == prefix
    assert (metrics.num_preemptions > 0) == retract
    if prefix:
        assert max(r.cached_tokens for r in requests) >= 40
    for request, prompt in zip(requests, prompts, strict=True):
        generated = request.take_result()
        worst, count = max_logit_error(runner.recorded, request.id, hf_model, prompt + generated)
        assert count >= len(prompt) + len(generated) - 1 - request.cached_tokens
        assert worst < 2e-4, f"logits differ by {worst}"
        assert generated == hf_greedy(hf_model, prompt, new_tokens)


def assert_prompt_logprobs_match_hf(
    runner: Any, hf_model: Any, prompt: list[int], new_tokens: int
) -> None:
    """Prompt logprobs (16-token prefill chunks) within 2e-4 of transformers' log-softmax, and
    the greedy continuation equal."""
    params = SamplingParams(max_output_tokens=new_tokens, temperature=0.0, prompt_logprobs=1)
    with Engine(runner, prefill_chunk_tokens=16) as engine:
        request = engine.submit(prompt, params)
        events = [e for e in drain(engine) if e.request_id == request.id]
    ref = torch.log_softmax(hf_logits(hf_model, prompt), dim=-1)
    lps = events[0].prompt_logprobs
    assert lps is not None and len(lps) == len(prompt) - 1
    assert max(abs(v - float(ref[p, prompt[p + 1]])) for p, v in enumerate(lps)) < 2e-4
    assert request.take_result() == hf_greedy(hf_model, prompt, new_tokens)


def assert_bfloat16_within_hf_error(
    runner: Any, hf_model: Any, folder: Any, prompt: list[int]
) -> None:
    """A bfloat16 runner's prompt logits stay within 3x (+0.01) of how far transformers'
    own bfloat16 model is from its float32 one (`hf_model`)."""
    exact = hf_logits(hf_model, prompt)
    hf16 = type(hf_model).from_pretrained(folder, dtype=torch.bfloat16).eval()
    hf_error = float((hf_logits(hf16, prompt) - exact).abs().max())
    runner.record_logits = True
    requests, _ = run_staggered(runner, [prompt], 16, False, new_tokens=1)
    worst, _ = max_logit_error(runner.recorded, requests[0].id, hf_model, prompt)
    assert worst < 3 * hf_error + 1e-2, (worst, hf_error)


def assert_hits_like_attention(hybrid: Any, attention: Any) -> None:
    """Held out: a hybrid runner's shared-prefix hit ratio within 5 points of a pure-attention
    runner's (which itself resumes nearly every request)."""
    hybrid_ratio, attention_ratio = (
        shared_prefix_hit_ratio(hybrid),
        shared_prefix_hit_ratio(attention),
    )
    assert attention_ratio > 0.9
    assert abs(hybrid_ratio - attention_ratio) <= 0.05, (hybrid_ratio, attention_ratio)


def assert_layout_hits_like_attention(layout: Any) -> None:
    """Held out on a fast runner's cache layout (its `RunnerConfig`, State groups included):
    an engine-driven simulation of that layout hits as often as a pure-attention layout of the
    same History pages and bytes (`assert_hits_like_attention`)."""
    from dataclasses import dataclass, replace

    from resin.protocols import History, RunnerConfig
    from tests.engine.fakes import CacheSimRunner

    @dataclass
    class Sized(CacheSimRunner):
        rc: RunnerConfig | None = None

        @property
        def runner_config(self) -> RunnerConfig:
            assert self.rc is not None
            return replace(self.rc, vocab_size=self.vocab)

    attention = replace(layout, cache_groups=(History(layout.page_bytes),))
    assert_hits_like_attention(
        Sized(layout.cache_groups, 16, None, rc=layout),
        Sized(attention.cache_groups, 16, None, rc=attention),
    )


def generate_twice(
    runner: Any, prompts: list[list[int]], context_length: int
) -> tuple[list[list[int]], int]:
    """Two greedy rounds of the same prompts through one Engine (16-token chunks, prefix
    caching), the second resuming from the first's pages and State checkpoints: the tokens
    (equal in both rounds) and the second round's cached tokens."""
    params = SamplingParams(max_output_tokens=2, temperature=0.0, ignore_stop_tokens=True)
    outputs, reused = [], 0
    with Engine(runner, context_length=context_length, prefix_cache=True, prefill_chunk_tokens=16,
                max_batch_tokens=40, max_sequences=4) as engine:  # fmt: skip
        for _ in range(2):
            requests = [engine.submit(p, params) for p in prompts]
            while engine.has_work():
                engine.step()
                engine.check_invariants()
            outputs.append([list(r.take_result()) for r in requests])
            reused = sum(r.cached_tokens for r in requests)
    assert outputs[0] == outputs[1]
    return outputs[0], reused


def assert_step_logits_equal(
    reference: Any, fast: Any, prompt: list[int], context_length: int
) -> int:
    """The reference runner (recording) and a fast runner (its `model.logits` wrapped) over the
    same request with 16-token chunks: each step that samples has its sampled row's logits
    within 2e-4 of the reference's. Returns how many steps ran."""
    reference.record_logits = True
    params = SamplingParams(max_output_tokens=2, temperature=0.0, ignore_stop_tokens=True)
    steps: list[torch.Tensor] = []
    logits = fast.model.logits

    def recorded(hidden: torch.Tensor) -> torch.Tensor:  # every step's sampled rows
        out = logits(hidden)
        steps.append(out.cpu())
        return out

    fast.model.logits = recorded
    for runner in (reference, fast):
        with Engine(runner, context_length=context_length, prefill_chunk_tokens=16) as engine:
            engine.submit(prompt, params)
            while engine.has_work():
                engine.step()
    assert len(steps) == len(reference.recorded)
    for got, step in zip(steps, reference.recorded, strict=True):
        assert step.logits is not None
        if got.shape[0]:
            torch.testing.assert_close(got[-1], step.logits[-1], rtol=1e-4, atol=2e-4)
    return len(steps)
