"""The Lightning Indexer's paged form (`kernels/indexer.py`: `paged_indexer_scores` reading
the keys in place from shuffled entry pages, `indexer_topk`'s radix select) against the
gathered kernel (`indexer_scores`) and plain torch, in the Triton interpreter on CPU: float32
scores equal up to the accumulation order, bf16 ones within a stated tolerance of float32
dots over the same bf16 values; picks equal a stable sort's (score descending, entry
ascending: exact ties go to the lowest entries), including ReLU's exact zeros (+0.0 and -0.0
alike), rows that see fewer entries than k, several pages, rows and blocks."""

from __future__ import annotations

import pytest
import torch

from resin_models_cuda.kernels.indexer import (
    indexer_scores,
    indexer_topk,
    indexer_topk_torch,
    paged_indexer_scores,
    visible_entries,
)
from resin_models_cuda.kernels.sparse_attention import PagedKeys

torch.set_num_threads(1)

HEADS, DIM, RATIO, PER_PAGE, OFFSET = 8, 16, 4, 2, 24  # the key after 24 other channels
COUNTS = [37, 2, 0, 21]  # entries each row holds (a row with none)
POSITIONS = [[140, 147, 151, 159], [8], [2, 3], [13, 90, 95]]  # each row's query tokens
BOUND = 44  # the output's width: more than any row holds; blocks of 16 entries (the least a
# compiled dot takes), so rows span several blocks, splits and -inf tails


def _case(dtype: torch.dtype, zeros: bool = False) -> dict[str, torch.Tensor]:
    """Keys [B, BOUND, DIM] and the same keys on shuffled pages [P, PER_PAGE, OFFSET + DIM +
    3]; with `zeros`, every other query all-positive and some keys all-negative, so whole
    entries ReLU to exactly 0 (tied), under weights of both signs."""
    gen = torch.Generator().manual_seed(1)
    b = len(COUNTS)
    keys = torch.randn(b, BOUND, DIM, generator=gen)
    rows = [r for r, ps in enumerate(POSITIONS) for _ in ps]
    q = torch.randn(len(rows), HEADS, DIM, generator=gen)
    w = torch.randn(len(rows), HEADS, generator=gen) * HEADS**-0.5
    if zeros:
        q[::2] = q[::2].abs()
        keys[:, 1::3] = -keys[:, 1::3].abs()
        w[1::3] = -w[1::3].abs()  # every weight negative: -0.0 sums
    keys, q = keys.to(dtype), q.to(dtype)
    per_row = -(-BOUND // PER_PAGE)
    order = torch.randperm(b * per_row + 3, generator=gen)
    pages = torch.randn(b * per_row + 3, PER_PAGE, OFFSET + DIM + 3, generator=gen).to(dtype)
    ids = []
    for r in range(b):
        held = -(-COUNTS[r] // PER_PAGE)  # a row lists the pages its entries use
        mine = order[r * per_row : r * per_row + held]
        for e in range(COUNTS[r]):
            pages[mine[e // PER_PAGE], e % PER_PAGE, OFFSET : OFFSET + DIM] = keys[r, e]
        ids += mine.tolist()
    indptr = torch.tensor([0] + [-(-c // PER_PAGE) for c in COUNTS]).cumsum(0)
    return {
        "q": q, "keys": keys, "w": w, "pages": pages, "ids": torch.tensor(ids),
        "indptr": indptr, "rows": torch.tensor(rows),
        "positions": torch.tensor([p for ps in POSITIONS for p in ps]),
        "counts": torch.tensor(COUNTS),
    }  # fmt: skip


def _reference(c: dict[str, torch.Tensor]) -> torch.Tensor:
    """[T, BOUND]: float32 dots of the (rounded) values, ReLU, weights, -inf where unseen."""
    keys = c["keys"].float()[c["rows"]]  # [T, BOUND, DIM]
    dots = torch.einsum("thd,ted->the", c["q"].float(), keys).relu() * DIM**-0.5
    scores = (dots * c["w"][:, :, None]).sum(1)
    seen = torch.arange(BOUND)[None, :] < visible_entries(c["rows"], c["positions"],
                                                          c["counts"], RATIO)[:, None]  # fmt: skip
    return scores.masked_fill(~seen, float("-inf"))


def _dev(c: dict[str, torch.Tensor], device: str) -> tuple[torch.Tensor, ...]:
    """Each token's row and position, each row's entry count: int32 on `device`."""
    return tuple(c[n].int().to(device) for n in ("rows", "positions", "counts"))


def _paged(
    c: dict[str, torch.Tensor], device: str, splits: int, block_e: int, fill: bool = True
) -> torch.Tensor:
    pages = c["pages"].to(device)[:, :, OFFSET:]  # the indexer key's channels, strided
    keys = PagedKeys(pages, c["indptr"].int().to(device), c["ids"].int().to(device))
    rows, positions, counts = _dev(c, device)
    return paged_indexer_scores(c["q"].to(device), keys, c["w"].to(device), rows, positions,
                                counts, RATIO, BOUND, splits, block_e, fill=fill).cpu()  # fmt: skip


def _stable_topk(scores: torch.Tensor, visible: torch.Tensor, k: int) -> list[list[int]]:
    """A stable sort's first k visible, finite-score entries (score descending, entry
    ascending), listed ascending, -1 after."""
    out = []
    for row, seen in zip(scores.tolist(), visible.tolist(), strict=True):
        cand = [e for e in range(min(seen, len(row))) if row[e] > float("-inf")]
        best = sorted(sorted(cand, key=lambda e: (-row[e], e))[:k])
        out.append(best + [-1] * (k - len(best)))
    return out


@pytest.mark.parametrize("splits", [1, 2, 3])
def test_paged_scores_equal_the_gathered_kernel_in_float32(device: str, splits: int) -> None:
    c = _case(torch.float32)
    got = _paged(c, device, splits, 16)
    rows, positions, counts = _dev(c, device)
    old = indexer_scores(c["q"].to(device), c["keys"].to(device), c["w"].to(device), rows,
                         positions, counts, RATIO).cpu()  # fmt: skip
    torch.testing.assert_close(got, old, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, _reference(c), rtol=1e-6, atol=1e-6)
    assert torch.equal(got == float("-inf"), _reference(c) == float("-inf"))


def test_paged_scores_in_bf16_equal_float32_dots_of_the_same_values(device: str) -> None:
    """bf16 dots: products exact in float32, sums in another order; on the GPU's tensor cores
    within 1e-4 (relative and absolute) of float32 dots over 16 channels and 8 heads."""
    c = _case(torch.bfloat16)
    for splits in (1, 2):
        got = _paged(c, device, splits, 16)
        torch.testing.assert_close(got, _reference(c), rtol=1e-4, atol=1e-4)


def test_topk_takes_a_stable_sorts_picks_with_ties_to_the_lowest_entries(device: str) -> None:
    gen = torch.Generator().manual_seed(2)
    inf = float("-inf")
    rows = [
        [0.0, -0.0, 0.0, 1.0, -0.0, 0.5, 0.0, inf],  # zeros of both signs tie
        [inf, inf, inf, inf, inf, inf, inf, inf],  # sees nothing
        [3.0, inf, 1.0, -2.0, inf, inf, inf, inf],  # fewer than k
        [-1.0, -1.0, -3.0, -1.0, -1.0, -2.0, -1.0, -1.0],  # negatives, tie at the k-th
    ]
    scores = torch.tensor(rows)
    visible = torch.tensor([8, 8, 8, 6])
    for k in (1, 3, 4, 8, 11):
        got = indexer_topk(scores.to(device), k, visible.int().to(device)).cpu()
        assert got.dtype == torch.int32 and got.shape == (4, k)
        assert got.tolist() == _stable_topk(scores, visible, k), k
    # many blocks and ties: values from a small set, visible bounds inside and past blocks
    scores = torch.randint(-3, 4, (6, 300), generator=gen).float() * 0.25
    scores[:, 290:] = inf
    scores[2] = torch.where(scores[2] > 0, scores[2], -0.0)
    visible = torch.tensor([300, 37, 200, 5, 0, 129])
    for k in (1, 16, 37, 64):
        got = indexer_topk(scores.to(device), k, visible.int().to(device), block=64).cpu()
        assert got.tolist() == _stable_topk(scores, visible, k), k
    # no bound: every column read, -inf never picked
    got = indexer_topk(scores.to(device), 16, block=32).cpu()
    assert got.tolist() == _stable_topk(scores, torch.full((6,), 300), 16)


def test_paged_selection_equals_the_stable_reference_with_relu_ties(device: str) -> None:
    c = _case(torch.float32, zeros=True)
    scores = _paged(c, device, 0, 16)
    want = _reference(c)
    torch.testing.assert_close(scores, want, rtol=1e-6, atol=1e-6)
    assert int((want == 0).sum()) >= 8  # whole entries ReLU'd to exactly 0
    visible = visible_entries(c["rows"], c["positions"], c["counts"], RATIO)
    for k in (3, 5, 12, 40):
        got = indexer_topk(scores.to(device), k, visible.to(device), block=16).cpu()
        assert got.tolist() == _stable_topk(want, visible, k)
        # the torch path picks the same entries wherever the k-th place is not a tie
        old = indexer_topk_torch(want, k)
        for t in range(want.shape[0]):
            ranked = want[t].sort(descending=True).values
            n = int(visible[t])
            if n > k and ranked[k - 1] == ranked[k]:
                continue
            assert sorted(e for e in old[t].tolist() if e >= 0) == [
                e for e in got[t].tolist() if e >= 0
            ]


def test_unfilled_scores_keep_the_visible_columns_and_the_selection(device: str) -> None:
    """`fill=False` (DeepSeek-V4's decode) writes only each token's visible columns; a top-k
    bounded by `visible` picks what it picks over the filled scores."""
    c = _case(torch.float32, zeros=True)
    filled = _paged(c, device, 2, 16)
    visible = visible_entries(c["rows"], c["positions"], c["counts"], RATIO)
    for splits in (1, 2, 3):
        raw = _paged(c, device, splits, 16, fill=False)
        for t, n in enumerate(visible.tolist()):
            assert torch.equal(raw[t, :n], filled[t, :n])
        for k in (3, 12):
            got = indexer_topk(raw.to(device), k, visible.to(device), block=16).cpu()
            want = indexer_topk(filled.to(device), k, visible.to(device), block=16).cpu()
            assert torch.equal(got, want)


def test_the_topk_kernel_compiles_for_sm90() -> None:
    """The interpreter ran an annotated constexpr reassigned in each unrolled radix step; the
    compiler refuses that ("constexpr cannot be reassigned"), which the first GPU run found.
    Compiled here for sm_90, the radix select's four passes are in the PTX."""
    from tests.cuda.sm90 import compile_sm90

    ptx, _ = compile_sm90(
        "resin_models_cuda.kernels.indexer", "_topk_kernel",
        {"score_ptr": "*fp32", "vis_ptr": "*i32", "out_ptr": "*i32", "E": "i32", "K": "i32"},
        {"BLOCK": 1024, "BLOCK_K": 512, "PDL": False}, num_warps=8,
    )  # fmt: skip
    assert ".entry _topk_kernel" in ptx
