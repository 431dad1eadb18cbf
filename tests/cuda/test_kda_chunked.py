"""KDA's chunked delta rule (`kda_delta_rule(chunk=16 | 32)`, GLM-5.3's prefill) against its
recurrent kernel: several rows of odd lengths (longer than a chunk, shorter, one token), each
from its own input checkpoint (a page, zeros, an in-place page), prefix-cache checkpoints
inside rows, per-channel decays near 0 (log decays down to -30 a token: exp(-G) would pass
float32's range within a chunk) and near 1, float32 and bfloat16 inputs."""

from __future__ import annotations

import pytest
import torch

from resin_models_cuda.kernels.delta_rule import kda_delta_rule
from resin_models_cuda.step import StateRows
from tests.cuda.test_qwen3_5_kernels import state_rows

LENS = [37, 1, 11, 21]
STATE_IN = [2, -1, 0, 5]
STATE_OUT = [3, 4, 0, 1]  # row 2 updates its checkpoint in place
CHECKPOINTS = {0: [(16, 6), (33, 7)], 3: [(5, 8)]}  # row: [(tokens covered, page)]


def _rows(device: str, region: torch.Tensor) -> StateRows:
    return state_rows(device, region, LENS, STATE_IN, STATE_OUT, CHECKPOINTS)


def _log_decays(t: int, h: int, kd: int, gen: torch.Generator) -> torch.Tensor:
    """Per head: channels near 1 (log decay ~ -1e-3), mixed, and near 0 (down to -30)."""
    g = -torch.rand(t, h, kd, generator=gen) * 0.7
    g[:, 0] = -torch.rand(t, kd, generator=gen) * 1e-3
    g[:, 1, : kd // 2] = -torch.rand(t, kd // 2, generator=gen) * 30.0
    g[:, 2] = torch.where(torch.rand(t, kd, generator=gen) < 0.5, -1e-4, -12.0)
    return g


@pytest.mark.parametrize("chunk", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kda_chunked_equals_recurrent_kernel(device: str, chunk: int, dtype: torch.dtype) -> None:
    # Two value blocks of 16, the second half masked; on a GPU also GLM-5.3's head (K = V =
    # 128), compiled (the interpreter would take minutes).
    shapes = [(3, 16, 24)] + ([(4, 128, 128)] if device == "cuda" else [])
    for h, kd, vd in shapes:
        _check(device, chunk, dtype, h, kd, vd)


def _check(device: str, chunk: int, dtype: torch.dtype, h: int, kd: int, vd: int) -> None:
    gen = torch.Generator().manual_seed(7)
    t = sum(LENS)
    mixed = torch.randn(t, 2 * h * kd + h * vd, generator=gen).to(dtype).to(device)
    g = _log_decays(t, h, kd, gen).to(device)
    b = (torch.randn(t, h + 2, generator=gen) * 2).to(dtype).to(device)[:, 1 : h + 1]
    pages = (torch.randn(9, h, kd, vd, generator=gen) * 0.3).to(device)
    want_pages = pages.clone()
    want = kda_delta_rule(mixed, g, b, want_pages, _rows(device, want_pages))
    got = kda_delta_rule(mixed, g, b, pages, _rows(device, pages), chunk=chunk)
    # float32 within ~1e-4 relative; bfloat16 outputs are rounded once, the states are float32
    # at TF32's rounding (the chunked form multiplies bfloat16 inputs' blocks as TF32 on a GPU,
    # `chunk_precision`, and keeps the decayed q and k in float16, TF32's mantissa, everywhere)
    out_tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=8e-3, rtol=1e-2)
    tf32 = dtype != torch.float32
    state_tol = dict(atol=3e-3, rtol=3e-3) if tf32 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.float(), want.float(), **out_tol)
    torch.testing.assert_close(pages, want_pages, **state_tol)
    assert torch.isfinite(got.float()).all()
