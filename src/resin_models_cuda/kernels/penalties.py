# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""Presence, frequency and repetition penalties applied to logits from per-slot token counts.

One program per (logits row, block of vocabulary ids). The row's count slot selects its rows
of the count tables (`resin_model.penalties.TokenCounts`, kept on the device); a row
without penalties (slot -1) is copied unchanged. The rule is the reference one: for tokens in
the prompt or generated, a positive logit is divided by the repetition penalty and a negative
one multiplied; then `x -= frequency * count + presence * (count > 0)`. Everything the kernel
reads is on the device: no host sync, safe inside a captured step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter


@triton.jit
def _penalty_kernel(
    logits_ptr,  # fp32/bf16 [N, V], row stride stride_l, last dim contiguous
    out_ptr,  # fp32 [N, V], contiguous
    slot_ptr,  # int64 [N]: count slot of the row, -1 = no penalties
    counts_ptr,  # int32 [S, W], row stride stride_c (W >= V)
    prompt_ptr,  # uint8 [S, W], row stride stride_c
    presence_ptr,  # fp32 [N]
    frequency_ptr,  # fp32 [N]
    repetition_ptr,  # fp32 [N]
    stride_l,
    stride_c,
    V,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = idx < V
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_l + idx, mask=mask).to(tl.float32)
    slot = tl.load(slot_ptr + row)
    if slot >= 0:
        base = slot * stride_c
        count = tl.load(counts_ptr + base + idx, mask=mask, other=0)
        prompt = tl.load(prompt_ptr + base + idx, mask=mask, other=0)
        rep = tl.load(repetition_ptr + row)
        seen = (prompt != 0) | (count > 0)
        x = tl.where(seen, tl.where(x > 0, x / rep, x * rep), x)
        freq = tl.load(frequency_ptr + row)
        pres = tl.load(presence_ptr + row)
        x = x - freq * count.to(tl.float32) - pres * (count > 0).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * V + idx, x, mask=mask)


def apply_penalties(
    logits: torch.Tensor,
    slots: torch.Tensor,
    counts: torch.Tensor,
    prompt: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> torch.Tensor:
    """Penalized float32 copy of `logits` [N, V]; `slots` int64 [N] (-1: unchanged),
    `counts` int32 / `prompt` bool [S, W >= V], penalties float32 [N]."""
    assert logits.dim() == 2 and logits.stride(1) == 1
    n, vocab = logits.shape
    assert slots.dtype == torch.int64 and slots.shape == (n,)
    assert counts.dtype == torch.int32 and prompt.dtype == torch.bool
    assert counts.shape == prompt.shape and counts.shape[1] >= vocab and counts.is_contiguous()
    assert prompt.is_contiguous()
    for t in (presence, frequency, repetition):
        assert t.dtype == torch.float32 and t.shape == (n,)
    out = torch.empty((n, vocab), dtype=torch.float32, device=logits.device)
    block = 1024
    if n:
        _penalty_kernel[(n, triton.cdiv(vocab, block))](
            logits, out, slots, counts, prompt.view(torch.uint8), presence, frequency,
            repetition, logits.stride(0), counts.stride(0), vocab, BLOCK=block, num_warps=4,
            **pdl_args(),
        )  # fmt: skip
    return out
