"""Paged decode and prefill attention vs plain PyTorch over odd shapes, windows and dtypes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.cuda.paged_ref import make_paged, ref_attention

DTYPES = [(torch.float32, 2e-3, 2e-3), (torch.float16, 2e-2, 2e-2)]
GPU_DTYPES = [(torch.bfloat16, 3e-2, 3e-2), (torch.float16, 1e-2, 1e-2)]


def _decode_case(
    device: str,
    dtype: torch.dtype,
    atol: float,
    rtol: float,
    lens: list[int],
    heads: tuple[int, int],
    window: int,
    splits: int,
    page: int = 16,
) -> None:
    from resin_models_cuda.kernels import decode_attention

    hq, hkv = heads
    head_dim = 32 if device == "cpu" else 128
    first = [max(0, n - window) // page if window else 0 for n in lens]
    case = make_paged(lens, hkv, head_dim, page, dtype, device, first_page=first)
    q = torch.randn((len(lens), hq, head_dim)).to(dtype).to(device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    scale = head_dim**-0.5
    out = decode_attention(
        q, case.kv, seq_lens, scale=scale, splits=splits, window=window,
        block_n=16 if device == "cpu" else 64,
    )  # fmt: skip
    for b, n in enumerate(lens):
        if n == 0:
            assert torch.all(out[b] == 0)
            continue
        pos = torch.tensor([n - 1], device=device)
        ref = ref_attention(q[b : b + 1], case.dense_k[b], case.dense_v[b], pos, scale, window)
        torch.testing.assert_close(out[b].float(), ref[0], atol=atol, rtol=rtol)


@pytest.mark.parametrize(("dtype", "atol", "rtol"), DTYPES)
@pytest.mark.parametrize(
    ("lens", "heads", "window", "splits"),
    [
        ([1, 37, 5], (4, 2), 0, 4),
        ([50, 0, 17], (6, 1), 0, 2),
        ([70, 9], (4, 4), 20, 4),
        ([33], (8, 2), 0, 1),
    ],
)
def test_decode_attention_matches_torch(
    device: str,
    dtype: torch.dtype,
    atol: float,
    rtol: float,
    lens: list[int],
    heads: tuple[int, int],
    window: int,
    splits: int,
) -> None:
    _decode_case(device, dtype, atol, rtol, lens, heads, window, splits)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "atol", "rtol"), GPU_DTYPES)
@pytest.mark.parametrize("splits", [1, 8, 32])
def test_decode_attention_gpu_shapes(
    dtype: torch.dtype, atol: float, rtol: float, splits: int
) -> None:
    _decode_case("cuda", dtype, atol, rtol, [1, 1000, 4097, 333, 0], (32, 8), 0, splits)
    _decode_case("cuda", dtype, atol, rtol, [1, 1000, 4097], (28, 4), 512, splits)


def _prefill_case(
    device: str,
    dtype: torch.dtype,
    atol: float,
    rtol: float,
    cached: list[int],
    q_lens: list[int],
    heads: tuple[int, int],
    window: int,
    block_m: int,
    page: int = 16,
) -> None:
    from resin_models_cuda.kernels import prefill_attention, prefill_blocks

    hq, hkv = heads
    head_dim = 32 if device == "cpu" else 128
    totals = [c + n for c, n in zip(cached, q_lens, strict=True)]
    first = [max(0, c - window) // page if window else 0 for c in cached]
    case = make_paged(totals, hkv, head_dim, page, dtype, device, first_page=first)
    qi = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = torch.randn((int(qi[-1]), hq, head_dim)).to(dtype).to(device)
    rows, offs = prefill_blocks(qi, block_m)
    scale = head_dim**-0.5
    i32 = dict(dtype=torch.int32, device=device)
    out = prefill_attention(
        q, case.kv, torch.tensor(qi, **i32), torch.tensor(cached, **i32),
        torch.tensor(rows, **i32), torch.tensor(offs, **i32), scale=scale, window=window,
        block_m=block_m, block_n=16 if device == "cpu" else 64,
    )  # fmt: skip
    for b, (c, n) in enumerate(zip(cached, q_lens, strict=True)):
        pos = torch.arange(c, c + n, device=device)
        ref = ref_attention(
            q[qi[b] : qi[b + 1]], case.dense_k[b], case.dense_v[b], pos, scale, window
        )
        torch.testing.assert_close(out[qi[b] : qi[b + 1]].float(), ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize(("dtype", "atol", "rtol"), DTYPES)
@pytest.mark.parametrize(
    ("cached", "q_lens", "heads", "window"),
    [
        ([0, 0], [19, 3], (4, 2), 0),
        ([21, 0, 5], [7, 33, 1], (3, 1), 0),
        ([40, 3], [25, 30], (4, 4), 24),
    ],
)
def test_prefill_attention_matches_torch(
    device: str,
    dtype: torch.dtype,
    atol: float,
    rtol: float,
    cached: list[int],
    q_lens: list[int],
    heads: tuple[int, int],
    window: int,
) -> None:
    _prefill_case(device, dtype, atol, rtol, cached, q_lens, heads, window, block_m=16)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "atol", "rtol"), GPU_DTYPES)
@pytest.mark.parametrize("block_m", [64, 128])
def test_prefill_attention_gpu_shapes(
    dtype: torch.dtype, atol: float, rtol: float, block_m: int
) -> None:
    _prefill_case("cuda", dtype, atol, rtol, [0, 700, 3], [1000, 301, 1], (32, 8), 0, block_m)
    _prefill_case("cuda", dtype, atol, rtol, [900, 0], [300, 777], (28, 4), 256, block_m)


def test_prefill_blocks_maps_every_query_once() -> None:
    from resin_models_cuda.kernels import prefill_blocks

    qi = np.array([0, 5, 5, 40, 41], dtype=np.int32)
    rows, offs = prefill_blocks(qi, 16)
    assert rows.tolist() == [0, 2, 2, 2, 3]
    assert offs.tolist() == [0, 0, 16, 32, 0]


@pytest.mark.parametrize(("dtype", "atol", "rtol"), DTYPES)
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("window", [0, 20])
def test_decode_attention_with_sinks_and_one_split(
    device: str, dtype: torch.dtype, atol: float, rtol: float, splits: int, window: int
) -> None:
    """gpt-oss's sinks (one logit per head in the denominator, no value) on both paths: one
    split, where the partial kernel writes the output itself, and split partials merged; a
    padding row (length 0) stays zero on both."""
    from resin_models_cuda.kernels import decode_attention

    lens, (hq, hkv), head_dim = [45, 0, 7, 70], (8, 2), 32
    first = [max(0, n - window) // 16 if window else 0 for n in lens]
    case = make_paged(lens, hkv, head_dim, 16, dtype, device, first_page=first, seed=5)
    q = torch.randn((len(lens), hq, head_dim)).to(dtype).to(device)
    sinks = torch.randn(hq, device=device) * 2
    scale = head_dim**-0.5
    out = decode_attention(
        q, case.kv, torch.tensor(lens, dtype=torch.int32, device=device), scale=scale,
        splits=splits, window=window, sinks=sinks, block_n=16,
    )  # fmt: skip
    for b, n in enumerate(lens):
        if n == 0:
            assert torch.all(out[b] == 0)
            continue
        # The sink joins as one more key whose value is zero: the rows' weights shrink.
        zero = torch.zeros(1, hkv, head_dim, device=device)
        k = torch.cat([case.dense_k[b][:n].float(), zero], 0)
        v = torch.cat([case.dense_v[b][:n].float(), zero], 0)
        group = hq // hkv
        scores = torch.einsum("hd,nhd->hn", q[b].float(), k.repeat_interleave(group, 1)) * scale
        pos = torch.arange(n + 1, device=device)
        keep = (pos < n) & ((pos > n - 1 - window) if window else True)
        scores = scores.masked_fill(~keep[None], float("-inf"))
        scores[:, n] = sinks.float()
        ref = torch.einsum("hn,nhd->hd", scores.softmax(-1), v.repeat_interleave(group, 1))
        torch.testing.assert_close(out[b].float(), ref, atol=atol, rtol=rtol)


def _multi_query_case(
    device: str, dtype: torch.dtype, atol: float, rtol: float, lens: list[int],
    q_lens: list[int], query: int, heads: tuple[int, int], window: int, splits: int,
) -> None:  # fmt: skip
    """Rows of `query` query slots, the last `q_lens[b]` positions of the row real."""
    from resin_models_cuda.kernels import decode_attention

    hq, hkv = heads
    head_dim = 32 if device == "cpu" else 128
    page = 16
    case = make_paged(lens, hkv, head_dim, page, dtype, device, seed=3)
    q = torch.randn((len(lens) * query, hq, head_dim)).to(dtype).to(device)
    out = decode_attention(
        q, case.kv, torch.tensor(lens, dtype=torch.int32, device=device), scale=head_dim**-0.5,
        splits=splits, window=window, block_n=16 if device == "cpu" else 64, query=query,
        q_lens=torch.tensor(q_lens, dtype=torch.int32, device=device),
    )  # fmt: skip
    for b, (n, m) in enumerate(zip(lens, q_lens, strict=True)):
        rows = slice(b * query, b * query + m)
        if n == 0:
            assert torch.all(out[b * query : (b + 1) * query] == 0)
            continue
        pos = torch.arange(n - m, n, device=device)
        ref = ref_attention(q[rows], case.dense_k[b], case.dense_v[b], pos, head_dim**-0.5, window)
        torch.testing.assert_close(out[rows].float(), ref, atol=atol, rtol=rtol)
        if m < query:  # padding slots repeat the last real query's keys
            pad = ref_attention(q[b * query + m : (b + 1) * query], case.dense_k[b],
                                case.dense_v[b], pos[-1:].repeat(query - m), head_dim**-0.5,
                                window)  # fmt: skip
            torch.testing.assert_close(out[b * query + m : (b + 1) * query].float(), pad,
                                       atol=atol, rtol=rtol)  # fmt: skip


@pytest.mark.parametrize(("dtype", "atol", "rtol"), DTYPES)
@pytest.mark.parametrize(
    ("lens", "q_lens", "query", "heads", "window", "splits"),
    [
        ([9, 40, 0], [5, 3, 1], 5, (4, 2), 0, 4),
        ([33, 70], [2, 4], 4, (8, 2), 20, 2),
        ([17], [3], 3, (4, 4), 0, 8),
        ([30, 9], [4, 2], 4, (4, 2), 0, 1),
    ],
)
def test_decode_attention_several_queries_per_row(
    device: str, dtype: torch.dtype, atol: float, rtol: float, lens: list[int],
    q_lens: list[int], query: int, heads: tuple[int, int], window: int, splits: int,
) -> None:  # fmt: skip
    """Speculative verify rows: each query token attends causally up to its own position."""
    _multi_query_case(device, dtype, atol, rtol, lens, q_lens, query, heads, window, splits)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "atol", "rtol"), GPU_DTYPES)
def test_decode_attention_several_queries_gpu_shapes(
    dtype: torch.dtype, atol: float, rtol: float
) -> None:
    _multi_query_case("cuda", dtype, atol, rtol, [1000, 4097, 7, 0], [5, 1, 5, 1], 5, (32, 8), 0, 8)
    _multi_query_case("cuda", dtype, atol, rtol, [1000, 600], [9, 4], 9, (64, 8), 128, 4)
