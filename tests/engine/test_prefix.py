"""Prefix caching: hit rates on shared prefixes (hybrid and History-only), reuse rules."""

from __future__ import annotations

import numpy as np
import pytest

from resin import (
    CacheGroupSpec,
    Compressed,
    Engine,
    History,
    SamplingParams,
    State,
    TokensEvent,
    Window,
)
from tests.engine.fakes import CacheSimRunner, naive_generate

HYBRID: tuple[CacheGroupSpec, ...] = (History(), Window(128), State())
DEEPSEEK_V4: tuple[CacheGroupSpec, ...] = (Window(128), Compressed(4), Compressed(128), State())
"""DeepSeek-V4's cache: a 128-token window, CSA (one entry per 4 tokens), HCA (one per 128) and
the compressors' pending tails in a State group."""


def _shared_prefix_run(groups: tuple[CacheGroupSpec, ...]) -> tuple[list[int], Engine]:
    rng = np.random.default_rng(0)
    prefix = rng.integers(0, 1000, size=1024).tolist()
    runner = CacheSimRunner(groups=groups, page_size=16, num_pages=4096, vocab=1000)
    engine = Engine(runner, context_length=4096, prefix_cache=True, max_batch_tokens=8192)
    params = SamplingParams(max_output_tokens=2, temperature=0.0)
    prompts = [prefix + rng.integers(0, 1000, size=32).tolist() for _ in range(64)]
    first = engine.submit(prompts[0], params)
    while not first.output_token_ids:
        engine.step()
    rest = [engine.submit(p, params) for p in prompts[1:]]
    cached: dict[int, int] = {}
    while engine.has_work():
        for event in engine.step():
            if isinstance(event, TokensEvent):
                cached.setdefault(event.request_id, event.cached_tokens)
        engine.check_invariants()
    for request, prompt in zip([first, *rest], prompts, strict=True):
        want, _ = naive_generate(groups, prompt, params, 1000, 4096)
        assert request.take_result() == want
    assert [r.cached_tokens for r in rest] == [cached[r.id] for r in rest]
    return [r.cached_tokens for r in rest], engine


@pytest.mark.parametrize(
    "groups", [HYBRID, (History(),), DEEPSEEK_V4], ids=["hybrid", "history", "deepseek-v4"]
)
def test_shared_prefix_is_reused_at_least_90_percent(groups: tuple[CacheGroupSpec, ...]) -> None:
    hits, engine = _shared_prefix_run(groups)
    assert sum(hits) >= 0.9 * 63 * 1024
    snap = engine.metrics
    assert snap is not None and snap.prefix_cache_hits == sum(hits)


def test_hybrid_hits_equal_history_hits() -> None:
    assert _shared_prefix_run(HYBRID)[0] == _shared_prefix_run((History(),))[0]


def test_compressed_prefix_hit_ratio_matches_history_only() -> None:
    """64 requests sharing a 1,024-token prefix: a runner with Window + Compressed(4) +
    Compressed(128) (+ its tails' State) reuses as much as a History-only one (within 5
    points of the prefix-hit ratio)."""
    ratios = []
    for groups in (DEEPSEEK_V4, (History(),)):
        engine = _shared_prefix_run(groups)[1]
        snap = engine.metrics
        assert snap is not None and snap.prefix_cache_queries > 0
        ratios.append(snap.prefix_cache_hits / snap.prefix_cache_queries)
    assert ratios[1] > 0.8 and abs(ratios[0] - ratios[1]) <= 0.05, ratios


def test_last_prompt_token_is_always_computed_and_prompt_logprobs_skip_the_cache() -> None:
    runner = CacheSimRunner(groups=(History(),), page_size=4, num_pages=64, vocab=50)
    engine = Engine(runner, context_length=64, prefix_cache=True)
    prompt = list(range(1, 13))  # exactly 3 pages
    a = engine.submit(prompt, SamplingParams(max_output_tokens=1))
    while engine.has_work():
        engine.step()
    b = engine.submit(prompt, SamplingParams(max_output_tokens=1))
    c = engine.submit(prompt, SamplingParams(max_output_tokens=1, prompt_logprobs=0))
    runner.keep_plans = True
    while engine.has_work():
        engine.step()
    assert b.cached_tokens == 8  # 3 full pages cached, but the last token must be computed
    assert c.cached_tokens == 0
    assert a.take_result() == b.take_result()


def test_unreferenced_entries_are_evicted_when_live_requests_need_pages() -> None:
    runner = CacheSimRunner(groups=(History(),), page_size=2, num_pages=12, vocab=50)
    engine = Engine(runner, context_length=64, prefix_cache=True)
    for start in range(0, 40, 10):
        r = engine.submit(list(range(start, start + 9)), SamplingParams(max_output_tokens=3))
        while engine.has_work():
            engine.step()
            engine.check_invariants()
        assert (
            r.take_result()
            == naive_generate(
                runner.groups, list(range(start, start + 9)), r.sampling_params, 50, 64
            )[0]
        )
    assert (
        engine._scheduler.cache.prefix is not None
        and engine._scheduler.cache.prefix.trie.num_nodes > 0
    )
    engine._scheduler.cache.drop_prefix_cache()
    assert engine._scheduler.cache.pool.num_free == 12


@pytest.mark.parametrize(
    ("groups", "hit"),
    [(HYBRID, 20), ((History(), State()), 20), ((Window(6), History()), 20), ((History(),), 32)],
    ids=["hybrid", "state", "window", "history"],
)
def test_chat_turns_hit_only_where_every_group_can_resume(
    groups: tuple[CacheGroupSpec, ...], hit: int
) -> None:
    """Turn 2's prompt = turn 1's prompt + answer + more: the trie path runs into turn 1's
    decode pages, where no State checkpoint (and maybe no Window page) exists."""
    runner = CacheSimRunner(groups=groups, page_size=4, num_pages=256, vocab=1000)
    engine = Engine(runner, context_length=256, prefix_cache=True)
    params = SamplingParams(max_output_tokens=13, temperature=0.0)
    prompt = list(range(100, 122))  # 5.5 pages
    turn1 = engine.submit(prompt, params)
    while engine.has_work():
        engine.step()
    history = prompt + turn1.take_result() + [7, 8, 9, 10, 11]
    turn2 = engine.submit(history, params)
    while engine.has_work():
        engine.step()
        engine.check_invariants()
    assert turn2.take_result() == naive_generate(groups, history, params, 1000, 256)[0]
    # Turn 1 published 8 full pages (34 tokens computed). State checkpoints exist only at its
    # prompt pages (20 tokens); Window(6) pages of its decode region had slid out before they
    # were published (a hit at h needs the pages of (h - 6, h)); History has all 8.
    assert turn2.cached_tokens == hit


def test_identical_prompts_in_one_step_share_pages() -> None:
    runner = CacheSimRunner(groups=(History(),), page_size=4, num_pages=64, vocab=50)
    engine = Engine(runner, context_length=64, prefix_cache=True)
    prompt = list(range(1, 18))  # 4 full pages + 1 token
    a = engine.submit(prompt, SamplingParams(max_output_tokens=3))
    b = engine.submit(prompt, SamplingParams(max_output_tokens=3))
    engine.step()  # both prefill together: neither could hit the other
    assert a.cached_tokens == b.cached_tokens == 0
    # b's 4 full pages were swapped for a's: 4 shared + one partial page each.
    assert engine._scheduler.cache.pool.num_used == 4 + 2
    while engine.has_work():
        engine.step()
        engine.check_invariants()
    assert a.take_result() == b.take_result()


@pytest.mark.parametrize(
    "groups", [HYBRID, (History(),), DEEPSEEK_V4], ids=["hybrid", "history", "deepseek-v4"]
)
def test_cached_prefix_predicts_the_hit_and_changes_nothing(
    groups: tuple[CacheGroupSpec, ...],
) -> None:
    """`Engine.cached_prefix` (the data-parallel front's routing hint) reports what admission
    will find, and touching the cache with it evicts, locks or counts nothing."""
    runner = CacheSimRunner(groups=groups, page_size=4, num_pages=64, vocab=50)
    engine = Engine(runner, context_length=64, prefix_cache=True)
    prompt = list(range(1, 23))
    assert engine.cached_prefix(prompt) == 0
    engine.submit(prompt, SamplingParams(max_output_tokens=1))
    while engine.has_work():
        engine.step()
    before = engine.metrics
    other = [*prompt[:10], 49, 48, 47, 46, 45]
    hints = [engine.cached_prefix(p) for p in (prompt, other, prompt[:3], [7, 7, 7, 7, 7])]
    assert engine.metrics == before  # no query or hit counted
    engine.check_invariants()
    second = engine.submit(prompt, SamplingParams(max_output_tokens=1))
    third = engine.submit(other, SamplingParams(max_output_tokens=1))
    while engine.has_work():
        engine.step()
    assert hints == [second.cached_tokens, third.cached_tokens, 0, 0]
    assert hints[0] == 20 and hints[1] == 8
    plain = CacheSimRunner(groups=groups, page_size=4, num_pages=64, vocab=50)
    assert Engine(plain, context_length=64).cached_prefix(prompt) == 0  # no prefix cache


V4_TINY: tuple[CacheGroupSpec, ...] = (Window(16), Compressed(4), Compressed(16), State(), State())
"""The groups of tests/models/test_deepseek_v4.py's tiny model (16-token window, CSA, HCA shrunk
to 16, the compressors' tails in two State groups)."""


def test_a_tight_pool_runs_window_prefix_hits_without_retraction() -> None:
    """56 pages hold one 364-token sequence of V4_TINY (a Window never holds more than 3
    pages), but not its whole path of Window pages: the trie keeps those that slid out, and a
    request's lock on its own path must not pin them, or it runs out of pages and retracts
    itself forever (it once did, with prefix caching on: 3,000 steps and no end)."""
    rng = np.random.default_rng(0)
    first = rng.integers(0, 300, 300).tolist()
    prompts = [first[:256] + rng.integers(0, 300, 100).tolist(), rng.integers(0, 300, 300).tolist()]
    runner = CacheSimRunner(groups=V4_TINY, page_size=16, num_pages=56, vocab=300)
    engine = Engine(
        runner,
        context_length=512,
        prefill_chunk_tokens=16,
        max_batch_tokens=32,
        prefix_cache=True,
    )
    params = SamplingParams(max_output_tokens=8, temperature=0.0)
    steps = 0
    requests = [engine.submit(first, params)]
    for batch in ([], prompts):
        requests += [engine.submit(p, params) for p in batch]
        while engine.has_work():
            engine.step()
            engine.check_invariants()
            steps += 1
            assert steps < 200, "the engine does not make progress"
    snap = engine.metrics
    assert snap is not None and snap.num_preemptions == 0
    assert requests[1].cached_tokens == 256
    for request, prompt in zip(requests, [first, *prompts], strict=True):
        assert request.take_result() == naive_generate(V4_TINY, prompt, params, 300, 512)[0]
    assert engine._scheduler.cache.drop_prefix_cache() > 0
    assert engine._scheduler.cache.pool.num_free == 56
