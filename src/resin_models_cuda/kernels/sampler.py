# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""GPU sampler: greedy, temperature, top-k, top-p and min-p, seeded, with no host sync.

Per row, the kernel takes `argmax(logits * inv_temp + gumbel)` over the tokens whose scaled
logit is at least the row's threshold (Gumbel-max equals sampling from the softmax of the
kept logits). Greedy rows (`temperature == 0`) take the plain argmax. The threshold implements
top-k / top-p / min-p: `filter_thresholds` sorts on the device and finds the smallest kept
scaled logit; rows with no filter get -inf. Randomness is Philox, keyed by a per-row seed the
host derives from (request seed, output index), and indexed by vocabulary id, so a seeded
request draws the same token whatever batch it is in.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
import triton
import triton.language as tl

from resin_models_cuda.kernels.pdl import pdl_args, pdl_enter


@triton.jit
def _sample_kernel(
    logits_ptr,  # fp32/bf16 [B, V], row stride stride_l, last dim contiguous
    temp_ptr,  # fp32 [B]: 0 = greedy
    inv_temp_ptr,  # fp32 [B]: 1 / temperature (1 for greedy rows)
    thresh_ptr,  # fp32 [B]: smallest kept scaled logit (-inf keeps all)
    seed_ptr,  # int64 [B]: Philox seed of the row
    out_ptr,  # int64 [B]
    stride_l,
    V,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0)
    temp = tl.load(temp_ptr + row)
    inv_temp = tl.load(inv_temp_ptr + row)
    thresh = tl.load(thresh_ptr + row)
    seed = tl.load(seed_ptr + row)
    greedy = temp == 0.0
    best_val = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    base = logits_ptr + row.to(tl.int64) * stride_l
    for start in range(0, V, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        mask = idx < V
        x = tl.load(base + idx, mask=mask, other=float("-inf")).to(tl.float32)
        if not greedy:
            x = x * inv_temp
            u = tl.rand(seed, idx)
            u = tl.minimum(tl.maximum(u, 1e-10), 1.0 - 1e-7)
            gumbel = -tl.log(-tl.log(u))
            x = tl.where(x >= thresh, x + gumbel, float("-inf"))
        x = tl.where(mask, x, float("-inf"))
        better = x > best_val
        best_val = tl.where(better, x, best_val)
        best_idx = tl.where(better, idx, best_idx)
    top = tl.max(best_val, 0)
    # Lowest index among the maxima: deterministic ties, like torch.argmax.
    cand = tl.where(best_val == top, best_idx, 2147483647)
    tl.store(out_ptr + row, tl.min(cand, 0).to(tl.int64))


def philox_seeds(
    seed: npt.NDArray[np.int64], output_index: npt.NDArray[np.int32], rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """Per-row sampler seeds: a hash of (seed, output_index) for seeded rows (seed >= 0),
    fresh random values for the others. Host-side, so no device sync is needed."""
    with np.errstate(over="ignore"):
        z = seed.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + output_index.astype(
            np.uint64
        ) * np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(31)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(29)
    hashed = (z >> np.uint64(2)).astype(np.int64)
    fresh = rng.integers(0, 2**61, size=seed.shape[0], dtype=np.int64)
    return np.where(seed >= 0, hashed, fresh)


def filter_thresholds(
    scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """Smallest kept scaled logit per row under top-k (0 = off), top-p and min-p; fp32 [B]."""
    ordered, _ = scaled.sort(dim=-1, descending=True)
    probs = torch.softmax(ordered, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    rank = torch.arange(scaled.shape[1], device=scaled.device)[None, :]
    keep = before < top_p[:, None]
    keep &= (top_k[:, None] <= 0) | (rank < top_k[:, None])
    keep &= probs >= min_p[:, None] * probs[:, :1]
    keep[:, 0] = True
    last = keep.sum(dim=-1, keepdim=True) - 1
    return ordered.gather(1, last).squeeze(1)


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    seeds: torch.Tensor,
    *,
    needs_filter: bool,
) -> torch.Tensor:
    """Sample one token per row of `logits` [B, V]; returns int64 [B] on the device.

    `needs_filter` is known on the host from the plan (any row with top-k, top-p < 1 or
    min-p > 0 that is not greedy); without it the sort is skipped.
    """
    assert logits.dim() == 2 and logits.stride(1) == 1
    batch, vocab = logits.shape
    for t in (temperature, top_p, min_p):
        assert t.dtype == torch.float32 and t.shape[0] == batch
    assert top_k.dtype == torch.int32 and seeds.dtype == torch.int64
    greedy = temperature == 0
    inv_temp = torch.where(greedy, 1.0, 1.0 / torch.where(greedy, 1.0, temperature))
    if needs_filter:
        scaled = logits.float() * inv_temp[:, None]
        thresh = filter_thresholds(scaled, top_k, top_p, min_p)
    else:
        thresh = torch.full((batch,), float("-inf"), device=logits.device)
    out = torch.empty(batch, dtype=torch.int64, device=logits.device)
    if batch:
        _sample_kernel[(batch,)](
            logits, temperature, inv_temp, thresh, seeds, out, logits.stride(0), vocab,
            BLOCK=1024, num_warps=8, **pdl_args(),
        )  # fmt: skip
    return out


@triton.jit
def _argmax_partial_kernel(
    x_ptr, val_ptr, idx_ptr, V, stride_x, CHUNKS, BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    pdl_enter(PDL)
    row = tl.program_id(0)
    c = tl.program_id(1)
    offs = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + offs, mask=offs < V, other=float("-inf"))
    x = x.to(tl.float32)
    top = tl.max(x, 0)
    tl.store(val_ptr + row * CHUNKS + c, top)
    tl.store(idx_ptr + row * CHUNKS + c, tl.min(tl.where(x == top, offs, 2147483647), 0))


@triton.jit
def _argmax_final_kernel(
    val_ptr,
    idx_ptr,
    out_ptr,
    CHUNKS,
    CHUNKS_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_enter(PDL)
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS_PAD)
    mask = c < CHUNKS
    v = tl.load(val_ptr + row * CHUNKS + c, mask=mask, other=float("-inf"))
    i = tl.load(idx_ptr + row * CHUNKS + c, mask=mask, other=2147483647)
    top = tl.max(v, 0)
    tl.store(out_ptr + row, tl.min(tl.where(v == top, i, 2147483647), 0))


def argmax_rows(logits: torch.Tensor, block: int = 4096) -> torch.Tensor:
    """Greedy tokens: the first index of each row's maximum (like `torch.argmax`), int32 [B].

    Two launches: every (row, chunk of `block` ids) program reduces its chunk, then one
    program per row reduces the chunks; the whole vocabulary is read once, in parallel."""
    assert logits.dim() == 2 and logits.stride(1) == 1
    batch, vocab = logits.shape
    chunks = triton.cdiv(vocab, block)
    vals = torch.empty((batch, chunks), dtype=torch.float32, device=logits.device)
    idx = torch.empty((batch, chunks), dtype=torch.int32, device=logits.device)
    out = torch.empty(batch, dtype=torch.int32, device=logits.device)
    if batch:
        _argmax_partial_kernel[(batch, chunks)](
            logits,
            vals,
            idx,
            vocab,
            logits.stride(0),
            chunks,
            BLOCK=block,
            num_warps=8,
            **pdl_args(),
        )
        pad = max(2, 1 << (chunks - 1).bit_length())
        _argmax_final_kernel[(batch,)](
            vals, idx, out, chunks, CHUNKS_PAD=pad, num_warps=1, **pdl_args()
        )
    return out
