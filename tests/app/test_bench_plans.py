"""The benchmark's page planner (`resin_app.bench.plans`) with a runner's declared groups: a
Window group holds only the pages of the window its rows still see (released pages come
back, the page table maps every position of the window to the slot it was written at), a
Compressed group the pages of its complete entries, and `group_pages` sizes the arena so:
DeepSeek-V4-Flash at 8 layers, batch 64 decoding at 32k, needs ~19.5 GB of pages (the
window group's share drops from a third to almost nothing) instead of ~52 GB."""

from __future__ import annotations

import numpy as np

from resin.plan import Phase
from resin.protocols import Compressed, State, Window
from resin_app.bench.plans import PagedPlanner, group_pages

PAGE = 4
SPECS = (Window(6), Compressed(2), Compressed(8), State(64))


def test_window_rows_hold_only_the_window_and_map_every_position_to_its_slot() -> None:
    sizes = group_pages(SPECS, PAGE, rows=3, decode_tokens=40, prefill_tokens=0, spare=0)
    # the window: 6 tokens up to the query's in at most 3 pages of 4 (not the context's 10);
    # Compressed(2): 2 entries a page, 20 entries; Compressed(8): 1 entry a page, 5 entries
    assert sizes == (3 * 3, 3 * 10, 3 * 5)
    planner = PagedPlanner(sum(sizes), PAGE, specs=SPECS, max_rows=3, group_pages=sizes)
    seqs = [planner.new_sequence(list(range(40))) for _ in range(3)]
    for seq, cached in zip(seqs, (0, 5, 13), strict=True):
        seq.cached = cached  # contexts whose earlier tokens are not in the window's pages
    written: dict[tuple[int, int], int] = {}  # (row, position) -> window slot
    for _ in range(40 - 13):
        rows = [(s, 1) for s in seqs]
        plan = planner.plan(rows, Phase.DECODE)
        win, csa, hca = plan.cache_groups[:3]
        assert win.page_start is not None and win.append_slots is not None
        for r, (seq, _) in enumerate(rows):
            p = seq.cached
            written[r, p] = int(win.append_slots[r])
            lo, hi = int(win.page_indptr[r]), int(win.page_indptr[r + 1])
            table, first = win.page_ids[lo:hi].tolist(), int(win.page_start[r])
            assert first == max(0, p - 6 + 1) // PAGE and len(table) <= 3
            assert all(0 <= page < sizes[0] for page in table)  # the window group's range
            for q in range(max(0, p - 6 + 1), p + 1):  # what the query reads
                if (r, q) in written:
                    page = table[q // PAGE - first]
                    assert page * PAGE + q % PAGE == written[r, q]
            for group, ratio, per_page in ((csa, 2, 2), (hca, 8, 1)):
                assert group.entry_slots is not None
                used = -(-((p + 1) // ratio) // per_page)
                pages = group.page_ids[group.page_indptr[r] : group.page_indptr[r + 1]]
                assert len(pages) == used
        # in flight, the window slots of different rows never coincide
        assert len(set(win.append_slots.tolist())) == 3
        planner.commit(rows)
    for seq in seqs:
        planner.free(seq)
    assert [len(planner._group_free[g]) for g in (0, 1, 2)] == list(sizes)


def test_deepseek_v4_8l_batch_64_at_32k_fits_in_about_20_gb_of_pages() -> None:
    """V4-Flash's first 8 layers (2 sliding, 3 CSA, 3 HCA), bf16, pages of 16 tokens: the
    arena's page is the Window group's (8 layers x 16 tokens x 512 x 2 bytes = 128 KiB)."""
    layers, d, idx, size, ps = 8, 512, 128, 2, 16
    specs = (
        Window(128, layers * ps * d * size),
        Compressed(4, 3 * 4 * (d + idx) * size),
        Compressed(128, 3 * 1 * d * size),
        State(1),
        State(1),
    )
    page_bytes = max(g.bytes_per_page for g in specs if not g.state_region)
    steps = 2 + 5  # warmup + iters of the documented command
    sizes = group_pages(specs, ps, rows=64, decode_tokens=32768 + steps + 1, prefill_tokens=4096)
    window, csa, hca = sizes
    assert window == 64 * 10 + 4096 // ps + 8  # 9-10 pages a decode row, the prompt's pages
    assert csa == 64 * 2049 + 4096 // 4 // 4 + 8
    assert hca == 64 * 256 + 4096 // 128 + 8
    new = sum(sizes) * page_bytes / 1e9
    old = 3 * (64 * -(-(32768 + steps + 1) // ps) + 4096 // ps + 8) * page_bytes / 1e9
    assert 19 < new < 20 and 51 < old < 53
    assert np.isclose(new / old, 0.377, atol=0.01)
