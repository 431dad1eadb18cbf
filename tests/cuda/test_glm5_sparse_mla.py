"""GLM-5.3's indexed MLA on the shared sparse attention kernel (`kernels/sparse_attention.py`,
pooled mode) and the indexer's paged key pooling (`kernels/compressor.py`, paged mode) against
plain torch over the same selection, in the Triton interpreter on CPU: rows of several shuffled
pages (pools inside a page, pools across pages, and single picked tokens with no tail: DSA
without pools), decode (one query a row, a padding row at position -1) and prefill (several
queries a row), rows that see fewer pools than top-k, -1 padding between the picks, keys wider
than the query (the indexer's channels after the latent), a value narrower than the key (the
latent of `[latent | rope]`), queries in a non-contiguous layout, one split and several, with
and without a sink. float32 and float16 (the attention: the interpreter's `tl.dot` on bfloat16
operands is wrong in Triton 3.9, so bfloat16 runs on the GPU only); the pooling, which has no
dot, in bfloat16 too."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from resin_models_cuda.kernels.compressor import paged_gated_pool
from resin_models_cuda.kernels.sparse_attention import PagedKeys, pooled_sparse_attention

torch.set_num_threads(1)

LATENT, ROPE, EXTRA, HEADS, TOPK = 16, 8, 5, 3, 3
DIM = LATENT + ROPE
LENGTHS = [37, 9, 20, 0]  # tokens each row holds; the last row is padding (no pages)
TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3),
             torch.bfloat16: (2e-2, 2e-2)}  # fmt: skip
ATTENTION_DTYPES = [torch.float32, torch.float16]
if torch.cuda.is_available():
    ATTENTION_DTYPES.append(torch.bfloat16)


def _pages(page: int, gen: torch.Generator) -> dict[str, Any]:
    """Rows of shuffled pages [P, page, DIM + EXTRA] with a page table (starting at page 0)."""
    n_pages = sum(-(-n // page) for n in LENGTHS) + 2
    pages = torch.randn(n_pages, page, DIM + EXTRA, generator=gen)
    order = torch.randperm(n_pages, generator=gen).tolist()
    ids, indptr = [], [0]
    for n in LENGTHS:
        ids += [order.pop() for _ in range(-(-n // page))]
        indptr.append(len(ids))
    return dict(pages=pages, ids=ids, indptr=indptr, start=[0] * len(LENGTHS))


def _token(c: dict, page: int, b: int, p: int) -> torch.Tensor:
    ids = c["ids"][c["indptr"][b] : c["indptr"][b + 1]]
    return c["pages"][ids[p // page], p % page]


def _selection(rows: list[int], positions: list[int], pool: int, gen: torch.Generator):
    """Up to TOPK of each query's visible complete pools, in random order, -1 gaps between."""
    selected = torch.full((len(rows), TOPK + 2), -1, dtype=torch.int32)
    for i, p in enumerate(positions):
        visible = max(p + 1, 0) // pool
        pick = torch.randperm(visible, generator=gen)[:TOPK].tolist()
        slots = torch.randperm(TOPK + 2, generator=gen)[: len(pick)]
        selected[i, slots] = torch.tensor(pick, dtype=torch.int32)
    return selected


def _reference(c, page, pool, rows, positions, q, selected, scale, sinks, dtype):
    outs = []
    for i, (b, p) in enumerate(zip(rows, positions, strict=True)):
        tail = range((p + 1) - (p + 1) % pool, p + 1)
        picked = [w * pool + o for w in selected[i].tolist() if w >= 0 for o in range(pool)]
        keys = [_token(c, page, b, pos) for pos in [*picked, *tail]]
        if not keys:
            outs.append(torch.zeros(HEADS, LATENT))
            continue
        k = torch.stack(keys).to(dtype).float()
        logits = q[i].float() @ k[:, :DIM].T * scale  # [H, N]
        if sinks is not None:
            logits = torch.cat((logits, sinks[:, None]), dim=1)
        probs = logits.softmax(dim=1)[:, : k.shape[0]].to(dtype).float()
        outs.append(probs @ k[:, :LATENT])
    return torch.stack(outs)


@pytest.mark.parametrize("dtype", ATTENTION_DTYPES)
@pytest.mark.parametrize(("page", "pool"), [(8, 4), (4, 8), (4, 1)])  # 1: picked tokens, no tail
def test_pooled_sparse_attention_equals_torch_over_the_same_selection(
    device: str, dtype: torch.dtype, page: int, pool: int
) -> None:
    gen = torch.Generator().manual_seed(page * 10 + pool)
    c = _pages(page, gen)
    decode = ([0, 1, 2, 3], [36, 8, 19, -1])  # each row's last token; row 3 is padding
    prefill = ([0, 0, 0, 0, 1, 1, 2, 2], [3, 15, 16, 36, 0, 8, 7, 19])
    table = [torch.as_tensor(c[n], device=device).int() for n in ("indptr", "ids", "start")]
    keys = PagedKeys(c["pages"].to(device=device, dtype=dtype), *table)
    scale = 0.3
    for rows, positions in (decode, prefill):
        t = len(rows)
        selected = _selection(rows, positions, pool, gen)
        q_heads_first = torch.randn(HEADS, t, DIM, generator=gen)
        sinks = torch.randn(HEADS, generator=gen)
        for transposed in (False, True):
            q = q_heads_first.transpose(0, 1)  # [T, H, D], token stride D, head stride T D
            q = q if transposed else q.contiguous()
            for splits, sink in ((1, None), (3, None), (1, sinks), (2, sinks)):
                got = pooled_sparse_attention(
                    q.to(device=device, dtype=dtype), torch.tensor(rows, device=device).int(),
                    torch.tensor(positions, device=device).int(), keys, selected.to(device),
                    pool, scale, value_dim=LATENT,
                    sinks=None if sink is None else sink.to(device), splits=splits, block_n=16,
                )  # fmt: skip
                assert got.shape == (t, HEADS, LATENT) and got.dtype == dtype
                want = _reference(c, page, pool, rows, positions, q.to(dtype), selected,
                                  scale, sink, dtype)  # fmt: skip
                atol, rtol = TOLERANCE[dtype]
                torch.testing.assert_close(got.float().cpu(), want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("page", "pool"), [(8, 4), (4, 8)])
def test_paged_gated_pool_equals_the_pool_of_gathered_tokens(
    device: str, dtype: torch.dtype, page: int, pool: int
) -> None:
    """Row b's complete pools of its pages' key channels (the gate score the next channels),
    the float32 softmax over each pool's tokens plus `bias`, weights rounded to the pages'
    dtype; zeros past a row's complete pools (a count below the pools held, and the bound
    `pools` past every row's)."""
    gen = torch.Generator().manual_seed(3)
    c = _pages(page, gen)
    width = 6
    pages = c["pages"].to(dtype)
    kv, gate = pages[..., 2 : 2 + width], pages[..., 2 + width : 2 + 2 * width]
    bias = torch.randn(pool, width, generator=gen)
    counts = [n // pool for n in LENGTHS]
    counts[0] -= 1  # a row may hold more tokens than the pools it asks for
    bound = max(counts) + 2
    table = [torch.as_tensor(c[n], device=device).int() for n in ("indptr", "ids", "start")]
    got = paged_gated_pool(PagedKeys(kv.to(device), *table), gate.to(device), bias.to(device),
                           torch.tensor(counts, device=device).int(), bound)  # fmt: skip
    assert got.shape == (len(LENGTHS), bound, width) and got.dtype == dtype
    want = torch.zeros(len(LENGTHS), bound, width)
    for b, count in enumerate(counts):
        for w in range(count):
            tokens = torch.stack([_token(c, page, b, w * pool + s) for s in range(pool)])
            tokens = tokens.to(dtype)
            logits = tokens[:, 2 + width :].float()[:, :width] + bias
            weights = logits.softmax(dim=0).to(dtype).float()
            want[b, w] = (weights * tokens[:, 2 : 2 + width].float()).sum(dim=0)
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(got.float().cpu(), want, atol=atol, rtol=rtol)
    # `first`: only the pools from first[b] on (GLM-5.3's stored pools: those a step completes)
    first = [max(0, n - 1) for n in counts]
    got = paged_gated_pool(PagedKeys(kv.to(device), *table), gate.to(device), bias.to(device),
                           torch.tensor(counts, device=device).int(), 2,
                           torch.tensor(first, device=device).int())  # fmt: skip
    shifted = torch.zeros(len(LENGTHS), 2, width)
    for b, (count, f) in enumerate(zip(counts, first, strict=True)):
        shifted[b, : max(0, min(2, count - f))] = want[b, f : min(f + 2, count)]
    torch.testing.assert_close(got.float().cpu(), shifted, atol=atol, rtol=rtol)
