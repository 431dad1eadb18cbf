# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Sparse-attention selection (DeepSeek-V4's Lightning Indexer; GLM-5.3's DSA indexer scores
the same way): query token t against the compressed keys of its row,
`score[t, e] = sum_h w[t, h] * ReLU(q[t, h] . k[e]) * scale`, in float32, and -inf for an
entry the query may not see yet (`e >= (p + 1) // ratio`, p its position) or past the row's
entries; then each query's `topk` best visible entries.

Two forms:

* `indexer_scores` (the gathered form; GLM-5.3 and the old V4 path): keys gathered into a
  contiguous [B, E, D] tensor, one program a (token, block of entries), dots in IEEE float32
  (the keys widened), then `indexer_topk_torch` (`torch.topk`; which members of an exact tie
  it keeps is unspecified, as in transformers).
* `paged_indexer_scores` + `indexer_topk` (DeepSeek-V4's fast path): one program keeps a
  query token's heads resident and streams its row's keys in place from the entry pages
  (no gather copy), stopping at the entries the token sees and writing -inf past them; dots
  in the keys' dtype, bf16 on the tensor cores (a bf16 x bf16 product is exact in float32,
  as transformers' `q.float() @ k.float()`: only the accumulation order differs) or IEEE
  float32 for a float32 model. `indexer_topk` is a radix select on the scores' float32 bits
  with no host read and a fixed output [T, topk]: the picks in ascending entry order, an
  exact tie at the k-th place won by the lowest entry numbers (a stable sort by score,
  descending, then the first k), -1 after the picks of a query that sees fewer than k
  (the sparse attention skips -1). -0.0 and +0.0 (ReLU's zeros under negative weights) tie.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter
from resin_models_cuda.kernels.quant_tiles import INTERPRETED
from resin_models_cuda.kernels.sparse_attention import PagedKeys


@triton.jit
def _indexer_kernel(
    q_ptr,  # [T, H, D] float32
    k_ptr,  # [B, E, D] (any float dtype), contiguous
    w_ptr,  # [T, H] float32
    row_ptr,  # [T] int32: the token's row
    pos_ptr,  # [T] int32: the token's position
    count_ptr,  # [B] int32: entries the row holds
    out_ptr,  # [T, E] float32
    E,
    scale,
    ratio,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_E: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    row = tl.load(row_ptr + t).to(tl.int64)
    visible = tl.minimum(tl.load(count_ptr + row), (tl.load(pos_ptr + t) + 1) // ratio)
    q = tl.load(q_ptr + (t * H + h[:, None]) * D + d[None, :],
                mask=(h[:, None] < H) & (d[None, :] < D), other=0.0)  # fmt: skip
    k = tl.load(k_ptr + (row * E + e[:, None]) * D + d[None, :],
                mask=(e[:, None] < E) & (d[None, :] < D), other=0.0).to(tl.float32)  # fmt: skip
    dots = tl.dot(q, tl.trans(k), input_precision="ieee")  # [BLOCK_H, BLOCK_E]
    w = tl.load(w_ptr + t * H + h, mask=h < H, other=0.0)
    score = tl.sum(tl.maximum(dots, 0.0) * scale * w[:, None], 0)
    score = tl.where(e < visible, score, float("-inf"))
    tl.store(out_ptr + t * E + e, score, mask=e < E)


def indexer_scores(
    q: torch.Tensor,
    keys: torch.Tensor,
    weights: torch.Tensor,
    token_row: torch.Tensor,
    positions: torch.Tensor,
    counts: torch.Tensor,
    ratio: int,
) -> torch.Tensor:
    """[T, E] float32 scores of queries `q` [T, H, D] (float32, rotary applied) against their
    row's `keys` [B, E, D] (entries past `counts[b]` unread), weighted by `weights` [T, H]
    (float32, the head weights already scaled); -inf where not visible (module docstring)."""
    t, heads, dim = q.shape
    b, entries, key_dim = keys.shape
    assert key_dim == dim and weights.shape == (t, heads) and counts.shape == (b,)
    assert q.dtype == torch.float32 and weights.dtype == torch.float32
    out = torch.empty((t, entries), dtype=torch.float32, device=q.device)
    if t and entries:
        block_e = 16 if entries <= 16 else 64
        grid = (t, triton.cdiv(entries, block_e))
        _indexer_kernel[grid](
            q.contiguous(), keys.contiguous(), weights.contiguous(), token_row.int(),
            positions.int(), counts.int(), out, entries, dim**-0.5, ratio,
            H=heads, D=dim, BLOCK_H=max(16, next_pow2(heads)), BLOCK_D=max(16, next_pow2(dim)),
            BLOCK_E=block_e, **pdl_args(),
        )  # fmt: skip
    return out


def indexer_select(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """[T, E] bool: each query's `topk` best visible entries (all of them when fewer); the
    mask form of `indexer_topk_torch`, for a caller that gathers by mask (GLM-5.3's
    pooled MLA selection)."""
    if not scores.shape[1]:
        return torch.zeros_like(scores, dtype=torch.bool)
    chosen = scores.topk(min(topk, scores.shape[1]), dim=-1).indices
    selected = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, chosen, True)
    return selected & (scores > float("-inf"))


# ----- the paged form: scores read in place, a graph-safe top-k -------------------------------


@triton.jit
def _paged_scores_kernel(
    q_ptr,  # [T, H, D] in the keys' dtype, contiguous
    key_ptr,  # pages [P, per page, >= D] (page_stride, slot_stride, 1): the indexer keys
    page_stride,
    slot_stride,
    indptr_ptr,  # int32 [B + 1]: row b's entry pages in ids[indptr[b] : indptr[b + 1]]
    ids_ptr,  # int32: page ids
    w_ptr,  # [T, H] float32
    row_ptr,  # int32 [T]
    pos_ptr,  # int32 [T]
    count_ptr,  # int32 [B]: entries each row holds
    out_ptr,  # [T, E] float32
    E,
    scale,
    ratio,
    per_page,
    H: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_E: tl.constexpr,
    SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    FILL: tl.constexpr,
    PDL: tl.constexpr,
):
    # Program (t, s) holds token t's heads and streams blocks s, s + SPLITS, ... of its row's
    # keys up to the entries t sees, then (FILL) writes -inf over its blocks past them.
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_E)
    row = tl.load(row_ptr + t).to(tl.int64)
    visible = tl.minimum(tl.load(count_ptr + row), (tl.load(pos_ptr + t) + 1) // ratio)
    q = tl.load(q_ptr + (t * H + h[:, None]) * D + d[None, :],
                mask=(h[:, None] < H) & (d[None, :] < D), other=0.0)  # fmt: skip
    w = tl.load(w_ptr + t * H + h, mask=h < H, other=0.0)
    base = tl.load(indptr_ptr + row)
    for at in range(s * BLOCK_E, visible, SPLITS * BLOCK_E):
        e = at + n
        valid = e < visible
        page = tl.load(ids_ptr + base + e // per_page, mask=valid, other=0).to(tl.int64)
        slot = page * page_stride + (e % per_page) * slot_stride
        k = tl.load(key_ptr + slot[:, None] + d[None, :],
                    mask=valid[:, None] & (d[None, :] < D), other=0.0)  # fmt: skip
        if INTERPRETED:  # its dot multiplies bf16's raw bits: widen (exact)
            dots = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            dots = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_H, BLOCK_E]
        score = tl.sum(tl.maximum(dots, 0.0) * scale * w[:, None], 0)
        tl.store(out_ptr + t * E + e, tl.where(valid, score, float("-inf")), mask=e < E)
    if FILL:  # this program's first block at or past the visible ones, then the rest
        seen = tl.cdiv(tl.maximum(tl.cdiv(visible, BLOCK_E) - s, 0), SPLITS)
        for at in range((s + seen * SPLITS) * BLOCK_E, E, SPLITS * BLOCK_E):
            e = at + n
            tl.store(out_ptr + t * E + e, tl.full([BLOCK_E], float("-inf"), tl.float32),
                     mask=e < E)  # fmt: skip


def visible_entries(
    token_row: torch.Tensor, positions: torch.Tensor, counts: torch.Tensor, ratio: int
) -> torch.Tensor:
    """[T] int32: the entries each query token sees, `min(counts[row], (pos + 1) // ratio)`
    (device ops only: no host read)."""
    return torch.minimum(counts[token_row.long()], (positions + 1) // ratio).int()


def paged_indexer_scores(
    q: torch.Tensor,
    keys: PagedKeys,
    weights: torch.Tensor,
    token_row: torch.Tensor,
    positions: torch.Tensor,
    counts: torch.Tensor,
    ratio: int,
    entries: int,
    splits: int = 0,
    block_e: int = 64,
    num_warps: int = 4,
    fill: bool = True,
) -> torch.Tensor:
    """[T, entries] float32: `indexer_scores` with the keys read in place from their pages
    (`keys`: pages [P, per page, >= D], last stride 1, the page table of every row; pass the
    channel slice that holds the indexer key) in `q`'s dtype: bf16 / fp16 dots on the tensor
    cores (products exact in float32, only the accumulation order differs from float32 dots),
    float32 ones in IEEE. `entries` is the output's width (a bound on any row's entries: a
    fixed-shape step's context limit); `splits` programs a token (0: enough to fill the
    device). `fill=False` leaves the columns past each token's visible entries unwritten (a
    caller whose top-k reads only those, `indexer_topk(..., visible)`: at a long context limit
    the -inf fill is most of the kernel's writes)."""
    t, heads, dim = q.shape
    pages = keys.pages
    assert pages.dim() == 3 and pages.stride(-1) == 1 and pages.shape[-1] >= dim
    assert q.dtype == pages.dtype and q.dtype in (torch.bfloat16, torch.float16, torch.float32)
    assert weights.shape == (t, heads) and weights.dtype == torch.float32
    out = torch.empty((t, entries), dtype=torch.float32, device=q.device)
    if not t or not entries:
        return out
    blocks = triton.cdiv(entries, block_e)
    if splits <= 0:
        splits = max(1, min(blocks, triton.cdiv(2 * _num_sms(q.device), t)))
    _paged_scores_kernel[(t, splits)](
        q.contiguous(), pages, pages.stride(0), pages.stride(1), keys.indptr.int(),
        keys.ids.int(), weights.contiguous(), token_row.int(), positions.int(), counts.int(),
        out, entries, dim**-0.5, ratio, pages.shape[1],
        H=heads, D=dim, BLOCK_H=max(16, next_pow2(heads)), BLOCK_D=max(16, next_pow2(dim)),
        BLOCK_E=block_e, SPLITS=splits,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", FILL=fill, num_warps=num_warps,
        **pdl_args(),
    )  # fmt: skip
    return out


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


@triton.jit
def _ordered(x):
    """float32 -> int64 in [0, 2^32), increasing with the value; -0.0 and +0.0 map alike."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return key.to(tl.int64) + tl.full([], 2147483648, tl.int64)


@triton.jit
def _topk_kernel(
    score_ptr,  # [T, E] float32
    vis_ptr,  # int32 [T]: columns worth reading (entries past them are not candidates)
    out_ptr,  # int32 [T, K]
    E,
    K,
    BLOCK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    # Radix select, 8 bits a pass from the top: each pass counts the candidates matching the
    # digits chosen so far by their next digit and keeps the digit that holds the k-th best;
    # then one pass in entry order writes the entries above the threshold and the first
    # `need` equal to it (the lowest entry numbers win a tie), and -1 fills the rest.
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK)
    digits = tl.arange(0, 256)
    visible = tl.minimum(tl.load(vis_ptr + t), E)
    prefix = tl.zeros([], dtype=tl.int64)
    decided = tl.zeros([], dtype=tl.int64)
    need = K + tl.zeros([], dtype=tl.int32)  # picks still to make among the prefix's matches
    for step in tl.static_range(4):
        shift = 24 - 8 * step  # constexpr (step is); an annotated one cannot be reassigned
        hist = tl.zeros([256], dtype=tl.int32)
        for at in range(0, visible, BLOCK):
            e = at + n
            x = tl.load(score_ptr + t * E + e, mask=e < visible, other=float("-inf"))
            key = _ordered(x)
            match = (e < visible) & (x > float("-inf")) & ((key & decided) == prefix)
            hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=match)
        at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # matches with digit >= d
        best = tl.max(tl.where(at_least >= need, digits, 0), 0)
        need -= tl.sum(tl.where(digits > best, hist, 0), 0)
        prefix |= best.to(tl.int64) << shift
        decided |= tl.full([], 255, tl.int64) << shift
    taken = tl.zeros([], dtype=tl.int32)
    ties = tl.zeros([], dtype=tl.int32)
    for at in range(0, visible, BLOCK):
        e = at + n
        x = tl.load(score_ptr + t * E + e, mask=e < visible, other=float("-inf"))
        key = _ordered(x)
        ok = (e < visible) & (x > float("-inf"))
        tie = (ok & (key == prefix)).to(tl.int32)
        pick = (ok & (key > prefix)) | ((tie != 0) & (ties + tl.cumsum(tie, 0) - tie < need))
        picked = pick.to(tl.int32)
        at_out = taken + tl.cumsum(picked, 0) - picked
        tl.store(out_ptr + t * K + at_out, e.to(tl.int32), mask=pick)
        taken += tl.sum(picked, 0)
        ties += tl.sum(tie, 0)
    for at in range(0, K, BLOCK_K):
        j = at + tl.arange(0, BLOCK_K)
        tl.store(out_ptr + t * K + j, tl.full([BLOCK_K], -1, tl.int32), mask=(j >= taken) & (j < K))


def indexer_topk(
    scores: torch.Tensor,
    topk: int,
    visible: torch.Tensor | None = None,
    block: int = 2048,
    num_warps: int = 8,
) -> torch.Tensor:
    """[T, topk] int32: each query's `topk` best entries by `scores` [T, E] (-inf: not
    visible), in ascending entry order, -1 after them when a query sees fewer. An exact tie
    at the k-th place goes to the lowest entry numbers (the order of a stable sort by score,
    descending). `visible` [T] int32 bounds the columns read (`visible_entries`; None: all).
    No host read and a fixed shape: a CUDA graph replays it for any scores."""
    t, entries = scores.shape
    assert scores.dtype == torch.float32 and scores.stride(-1) == 1
    out = torch.empty((t, topk), dtype=torch.int32, device=scores.device)
    if not t or not topk:
        return out
    if visible is None:
        visible = torch.full((t,), entries, dtype=torch.int32, device=scores.device)
    block_k = max(16, min(1024, next_pow2(topk)))
    _topk_kernel[(t,)](scores.contiguous(), visible.int(), out, entries, topk, BLOCK=block,
                       BLOCK_K=block_k, num_warps=num_warps, **pdl_args())  # fmt: skip
    return out


def indexer_topk_torch(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """[T, min(topk, E)] int32: the old path of `indexer_topk` (`torch.topk`: the picks by
    score, descending; which members of an exact tie it keeps is unspecified, as in
    transformers), -1 in the places of invisible picks (a query that sees fewer than k)."""
    k = min(topk, scores.shape[1])
    best = scores.topk(k, dim=-1)
    return torch.where(best.values > float("-inf"), best.indices, -1).to(torch.int32)
