"""Arena sizing: a hybrid model's pages are sized per kind, so its arena holds the sequences
its bytes allow (the state region beside the token region, `resolve_layout`)."""

from __future__ import annotations

import numpy as np
import pytest

from resin import Compressed, Engine, History, RunnerConfig, SamplingParams, State, Window
from resin.cache import CacheManager, OutOfPagesError
from resin.engine.engine_config import EngineConfig, arena_report, resolve_layout
from tests.engine.fakes import CacheSimRunner

MIB = 1 << 20
GIB = 1 << 30
QWEN35_HISTORY = History(bytes_per_page=10 * 2 * 2 * 256 * 2 * 16)
"""10 full-attention layers, K and V, 2 KV heads x 256, bf16, 16 tokens: 320 KiB a page."""
QWEN35_STATE = State(bytes_per_page=30 * (32 * 128 * 128 * 4 + 8192 * 3 * 2))
"""30 Gated DeltaNet layers: fp32 recurrent 32x128x128 plus the bf16 conv (3 x 8192): ~61 MiB."""


def _config(context: int, max_sequences: int = 256) -> EngineConfig:
    return EngineConfig(
        context_length=context,
        prefix_cache=False,
        max_batch_tokens=8192,
        max_sequences=max_sequences,
        prefill_chunk_tokens=2048,
        enable_metrics=False,
        max_retries=0,
    )


def _admit_full_contexts(manager: CacheManager, context: int, max_sequences: int) -> int:
    """Admit sequences and compute `context` tokens each until the arena is full."""
    n = 0
    for slot in range(max_sequences):
        slots = np.asarray([slot], dtype=np.int32)
        cached, totals = np.zeros(1, dtype=np.int32), np.asarray([context], dtype=np.int32)
        need = manager.max_pages_for(context, context) + 0
        if (need > manager.available()).any():
            break
        manager.admit(slot, context)
        try:
            reservation = manager.reserve(slots, cached, totals, prefill=True)
        except OutOfPagesError:
            manager.release(slot)
            break
        manager.commit(reservation, totals)
        n += 1
    manager.check_invariants(list(range(n)))
    return n


@pytest.mark.parametrize("context", [2048, 8192, 32768])
def test_qwen35_shaped_hybrid_holds_the_sequences_its_bytes_allow(context: int) -> None:
    assert QWEN35_HISTORY.bytes_per_page == 320 * 1024
    assert 60 * MIB < QWEN35_STATE.bytes_per_page < 62 * MIB
    rc = RunnerConfig(
        page_size=16, cache_groups=(QWEN35_HISTORY, QWEN35_STATE), cache_bytes=40 * GIB
    )
    config = _config(context)
    layout = resolve_layout(rc, config)
    assert layout.arena_bytes <= rc.cache_bytes
    # What the bytes allow: each sequence's History pages plus its State ring (2 checkpoints).
    pages = -(-(context + 1) // 16)
    per_sequence = pages * QWEN35_HISTORY.bytes_per_page + 2 * QWEN35_STATE.bytes_per_page
    allowed = min(config.max_sequences, rc.cache_bytes // per_sequence)
    report = arena_report(layout, config)
    assert report.sequences >= 0.9 * allowed, str(report)
    manager = CacheManager(layout, config.max_sequences, pages)
    held = _admit_full_contexts(manager, context, config.max_sequences)
    assert held >= 0.9 * allowed, (held, allowed, str(report))
    # One arena of State-sized pages (the largest object) would hold almost nothing.
    assert rc.cache_bytes // QWEN35_STATE.bytes_per_page // (pages + 2) < 0.05 * allowed


def test_the_state_region_fits_max_sequences_and_the_rest_is_token_pages() -> None:
    rc = RunnerConfig(
        page_size=16, cache_groups=(QWEN35_HISTORY, QWEN35_STATE), cache_bytes=40 * GIB
    )
    layout = resolve_layout(rc, _config(2048, max_sequences=8))
    assert layout.state_pages == 8 * 2  # every admitted sequence's ring, no more
    left = rc.cache_bytes - layout.state_pages * layout.state_page_bytes
    assert layout.num_pages == left // layout.page_bytes
    report = arena_report(layout, _config(2048, max_sequences=8))
    assert report.state_sequences == 8 and report.token_sequences > 8
    assert "state pages" in str(report)


def test_token_only_and_exact_layouts() -> None:
    groups = (Window(128, 1024), Compressed(4, 512), Compressed(128, 64))
    layout = resolve_layout(RunnerConfig(cache_groups=groups, cache_bytes=1 << 20), _config(512))
    assert (layout.num_pages, layout.state_pages) == (1024, 0)
    rc = RunnerConfig(cache_groups=(*groups, State(100)), num_pages=50, num_state_pages=7)
    layout = resolve_layout(rc, _config(512))
    assert (layout.num_pages, layout.state_pages, layout.state_page_bytes) == (50, 7, 100)
    with pytest.raises(ValueError, match="state region"):
        resolve_layout(RunnerConfig(cache_groups=(State(),), num_state_pages=1), _config(64))


def test_the_engine_admits_as_many_sequences_as_the_state_region_has_rings() -> None:
    """State pages never grow while decoding: admission keeps no headroom for them, so a
    state region of N rings runs N sequences at once."""
    runner = CacheSimRunner(
        groups=(History(), State()), page_size=4, num_pages=400, num_state_pages=2 * 12
    )
    engine = Engine(runner, max_sequences=12, context_length=64, prefill_chunk_tokens=64)
    assert engine.arena.state_sequences == 12
    for i in range(14):
        engine.submit([i + 1] * 9, SamplingParams(max_output_tokens=20))
    engine.step()
    assert engine._scheduler.num_admitted == 12
    while engine.has_work():
        engine.step()
        engine.check_invariants()
