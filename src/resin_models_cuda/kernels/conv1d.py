# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Depthwise causal conv1d with its state, then SiLU (Gated DeltaNet's short convolution over
q | k | v), for prefill chunks and decode rows alike.

A row's state is its last W = KW - 1 conv inputs [C, W] (oldest first), kept in a page of the
State region. Input s of row b (s counted from the row's first query token) is `x[start + s]`
when s >= 0, else column W + s of the row's input checkpoint (`state_in`; zeros when -1).
`causal_conv1d` computes every token's `silu(sum_j w[c, j] * input(l - W + j))` (one program
per token and channel block, so a long prefill is parallel); `conv_state_store` then writes
the inputs `L - W .. L - 1` of each row to its checkpoint pages (after its first `ckpt_len`
tokens) and to `state_out` (after all its tokens). Two launches: every output reads the input
checkpoint before any page is written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.paged import next_pow2
from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter
from resin_models_cuda.step import StateRows


@triton.jit
def _conv_input(x_ptr, stride_x, state_ptr, stride_p, stride_c, page, start, s, cc, C,
                W: tl.constexpr):  # fmt: skip
    """float32 input `s` (relative to the row's first token) of channels `cc` (< C). Scalar
    conditions enter the masks as bounds (the interpreter cannot AND a scalar into a mask)."""
    xs = tl.load(x_ptr + tl.maximum(start + s, 0).to(tl.int64) * stride_x + cc,
                 mask=cc < tl.where(s >= 0, C, 0), other=0.0)  # fmt: skip
    col = W + s
    old = tl.where(s >= 0, 0, tl.where(page >= 0, tl.where(col >= 0, C, 0), 0))
    prev = tl.load(
        state_ptr + tl.maximum(page, 0).to(tl.int64) * stride_p + cc * stride_c
        + tl.maximum(col, 0),
        mask=cc < old,
        other=0.0,
    )  # fmt: skip
    return xs.to(tl.float32) + prev.to(tl.float32)


@triton.jit
def _conv_kernel(
    x_ptr,  # [T, C], row stride stride_x, channels contiguous
    w_ptr,  # [C, KW] contiguous
    state_ptr,  # [pages, C, W]: strides (stride_p, stride_c, 1), this layer's view
    out_ptr,  # [T, C] contiguous
    query_indptr_ptr,  # int32 [B + 1]
    token_row_ptr,  # int32 [T]
    state_in_ptr,  # int32 [B]
    stride_x,
    stride_p,
    stride_c,
    C,
    KW: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ROUND: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    t = tl.program_id(0)
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cc < C
    row = tl.load(token_row_ptr + t)
    start = tl.load(query_indptr_ptr + row)
    page = tl.load(state_in_ptr + row)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for j in tl.static_range(KW):
        s = t - start - (KW - 1) + j
        xin = _conv_input(x_ptr, stride_x, state_ptr, stride_p, stride_c, page, start, s, cc,
                          C, KW - 1)  # fmt: skip
        acc += tl.load(w_ptr + cc * KW + j, mask=cmask, other=0.0).to(tl.float32) * xin
    dtype = out_ptr.dtype.element_ty
    if ROUND:
        acc = acc.to(dtype).to(tl.float32)  # the conv's output, rounded as F.conv1d's is
    tl.store(out_ptr + t.to(tl.int64) * C + cc, (acc * tl.sigmoid(acc)).to(dtype), mask=cmask)


@triton.jit
def _store_window(x_ptr, stride_x, state_ptr, stride_p, stride_c, page_in, start, length,
                  page, cc, C, W: tl.constexpr):  # fmt: skip
    """Write the inputs `length - W .. length - 1` of the row into state page `page`."""
    dst = state_ptr + tl.maximum(page, 0).to(tl.int64) * stride_p + cc * stride_c
    for j in tl.static_range(W):
        value = _conv_input(x_ptr, stride_x, state_ptr, stride_p, stride_c, page_in, start,
                            length - W + j, cc, C, W)  # fmt: skip
        tl.store(dst + j, value.to(state_ptr.dtype.element_ty), mask=cc < tl.where(page >= 0, C, 0))


@triton.jit
def _conv_store_kernel(
    x_ptr, state_ptr, query_indptr_ptr, state_in_ptr, state_out_ptr, ckpt_indptr_ptr,
    ckpt_len_ptr, ckpt_page_ptr, stride_x, stride_p, stride_c, C,
    W: tl.constexpr, BLOCK_C: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    row = tl.program_id(0)
    cc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    start = tl.load(query_indptr_ptr + row)
    length = tl.load(query_indptr_ptr + row + 1) - start
    page_in = tl.load(state_in_ptr + row)
    for c in range(tl.load(ckpt_indptr_ptr + row), tl.load(ckpt_indptr_ptr + row + 1)):
        _store_window(x_ptr, stride_x, state_ptr, stride_p, stride_c, page_in, start,
                      tl.load(ckpt_len_ptr + c), tl.load(ckpt_page_ptr + c), cc, C, W)  # fmt: skip
    # Last: the window of the final state may read columns of page_in == state_out, in order.
    _store_window(x_ptr, stride_x, state_ptr, stride_p, stride_c, page_in, start, length,
                  tl.load(state_out_ptr + row), cc, C, W)  # fmt: skip


def _check(x: torch.Tensor, state: torch.Tensor, rows: StateRows) -> None:
    assert x.dim() == 2 and x.stride(1) == 1
    assert state.dim() == 3 and state.shape[1] == x.shape[1] and state.stride(2) == 1
    assert state.dtype == x.dtype
    rows.check()
    assert rows.token_row.shape[0] >= x.shape[0]


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    state: torch.Tensor,
    rows: StateRows,
    round_conv: bool = True,
) -> torch.Tensor:
    """silu(conv) [T, C] of `x` [T, C] with `weight` [C, KW] over each row's inputs after its
    input checkpoint (`state` [pages, C, KW - 1], this layer's view of the State region).
    `round_conv`: the conv's output rounded to x's dtype before the SiLU (Qwen3.5's conv in
    the model dtype); False keeps it float32 to the end (KDA's float32 conv)."""
    _check(x, state, rows)
    t, channels = x.shape
    assert weight.shape == (channels, state.shape[2] + 1) and weight.is_contiguous()
    out = torch.empty((t, channels), dtype=x.dtype, device=x.device)
    block = min(next_pow2(channels), 256)
    if t:
        _conv_kernel[(t, triton.cdiv(channels, block))](
            x, weight, state, out, rows.query_indptr, rows.token_row, rows.state_in,
            x.stride(0), state.stride(0), state.stride(1), channels,
            KW=weight.shape[1], BLOCK_C=block, ROUND=round_conv, num_warps=4, **pdl_args(),
        )  # fmt: skip
    return out


def conv_state_store(x: torch.Tensor, state: torch.Tensor, rows: StateRows) -> None:
    """Write each row's last `KW - 1` conv inputs to its checkpoint pages and `state_out`
    (after `causal_conv1d` of the same step has read the input checkpoints)."""
    _check(x, state, rows)
    channels = x.shape[1]
    block = min(next_pow2(channels), 256)
    batch = rows.state_in.shape[0]
    if batch:
        _conv_store_kernel[(batch, triton.cdiv(channels, block))](
            x, state, rows.query_indptr, rows.state_in, rows.state_out, rows.ckpt_indptr,
            rows.ckpt_len, rows.ckpt_page, x.stride(0), state.stride(0), state.stride(1),
            channels, W=state.shape[2], BLOCK_C=block, num_warps=4, **pdl_args(),
        )  # fmt: skip
