# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Sparse-attention selection (DeepSeek-V4's Lightning Indexer; GLM-5.3's DSA indexer scores
the same way): query token t against the compressed keys of its row,
`score[t, e] = sum_h w[t, h] * ReLU(q[t, h] . k[e]) * scale`, all in float32, and -inf for an
entry the query may not see yet (`e >= (p + 1) // ratio`, p its position) or past the row's
entries. One program scores one token against a block of entries, every head in one matmul
(`tl.dot` in IEEE float32: the scores' ReLU ties at exactly 0, and a TF32 product would move
the boundary between near ties). `sparse_attention.indexer_topk` keeps each query's `topk`
best visible entries (`torch.topk`; which members of an exact tie it keeps is unspecified, as
in transformers)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2


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
):
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
            BLOCK_E=block_e,
        )  # fmt: skip
    return out


def indexer_select(scores: torch.Tensor, topk: int) -> torch.Tensor:
    """[T, E] bool: each query's `topk` best visible entries (all of them when fewer); the
    mask form of `sparse_attention.indexer_topk`, for a caller that gathers by mask (GLM-5.3's
    pooled MLA selection)."""
    if not scores.shape[1]:
        return torch.zeros_like(scores, dtype=torch.bool)
    chosen = scores.topk(min(topk, scores.shape[1]), dim=-1).indices
    selected = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, chosen, True)
    return selected & (scores > float("-inf"))
