"""Overlap with a real model: the reference runner's submit/collect pipeline (tiny random
weights, fp32 CPU) generates exactly what the same engine does one step at a time, greedy and
seeded, under batching, chunked prefill, prefix hits, retraction, stop tokens (stops that land
while the next step is in flight), aborts and max tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from ref_hf import checkpoint

from resin import Engine, FinishedEvent, SamplingParams, TokensEvent
from resin_models_torch.registry import load_runner


def _params(i: int, stop: tuple[int, ...] = (), extra: int = 0) -> SamplingParams:
    if i % 2:  # seeded sampling: tokens depend on (seed, output index) only
        return SamplingParams(
            max_output_tokens=6 + i + extra,
            temperature=0.9,
            top_p=0.95,
            seed=100 + i,
            stop_token_ids=stop,
            logprobs=2 if i == 3 else None,
        )
    return SamplingParams(max_output_tokens=5 + i + extra, temperature=0.0, stop_token_ids=stop)


def _prompts() -> list[list[int]]:
    shared = [(7 * k + 3) % 300 for k in range(13)]
    return [shared + [(11 * i + k) % 300 for k in range(2 + 3 * i)] for i in range(6)] + [
        [(5 * k + 1) % 300 for k in range(9)],
        [*shared, 1, 2, 3],
    ]


def _run(
    folder: object, overlap: bool, params: list[SamplingParams], aborts: dict[int, int], pages: int
) -> tuple[dict[int, list[tuple[object, ...]]], int, int]:
    runner = load_runner(folder, page_size=4, num_pages=pages)
    engine = Engine(
        runner,
        context_length=96,
        prefix_cache=True,
        prefill_chunk_tokens=5,
        max_batch_tokens=16,
        overlap=overlap,
    )
    assert engine.overlap is overlap
    prompts = _prompts()
    streams: dict[int, list[tuple[object, ...]]] = {i: [] for i in range(len(prompts))}
    seen = dict.fromkeys(streams, 0)
    engine.submit(prompts[0], params[0], request_id=0)
    engine.step()  # the others arrive while the first one runs
    for i in range(1, len(prompts)):
        engine.submit(prompts[i], params[i], request_id=i)
    steps = 0
    while engine.has_work():
        steps += 1
        assert steps < 2000, "no progress"
        for e in engine.step():
            if isinstance(e, TokensEvent):
                lps = None if e.logprobs is None else tuple(round(x, 4) for x in e.logprobs)
                streams[e.request_id].append(("tok", e.token_ids, lps))
                seen[e.request_id] += len(e.token_ids)
                if aborts.get(e.request_id) == seen[e.request_id]:
                    engine.abort(e.request_id)
            elif isinstance(e, FinishedEvent):
                streams[e.request_id].append(("end", e.reason, e.num_output_tokens))
        engine.check_invariants()
    preempted = engine._scheduler.num_preemptions
    hits = engine._scheduler.cache.prefix_hits
    engine.close()
    return streams, preempted, hits


@pytest.mark.parametrize("pages", [400, 32], ids=["roomy", "retracting"])
@pytest.mark.parametrize("arch", ["llama3", "gemma3", "lfm2"])
def test_overlap_equals_one_step_at_a_time(arch: str, pages: int) -> None:
    folder, _ = checkpoint(arch)
    n = len(_prompts())
    # Stop tokens that really fire: tokens each request generates without stops, some of them
    # at the first output (a stop seen at once), others later.
    extra = 16 if pages < 100 else 0  # long outputs outgrow the small pool
    free, _, _ = _run(folder, False, [_params(i, extra=extra) for i in range(n)], {}, 400)
    params = []
    for i in range(n):
        toks = [t for ev in free[i] if ev[0] == "tok" for t in ev[1]]  # type: ignore[union-attr]
        stop = (int(toks[min(i % 4 + extra, len(toks) - 1)]),) if i % 3 else ()
        params.append(_params(i, stop, extra))
    aborts = {3: 2, 6: 1}  # requests without stop tokens
    sync, _, _ = _run(folder, False, params, aborts, pages)
    piped, preempted, hits = _run(folder, True, params, aborts, pages)
    assert piped == sync
    assert hits > 0
    if pages == 32:
        assert preempted > 0, preempted
    reasons = {ev[1].value for s in sync.values() for ev in s if ev[0] == "end"}  # type: ignore[union-attr]
    assert {"stop", "length", "abort"} <= reasons, reasons
