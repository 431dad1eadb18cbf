"""`RandomWeights`, the benchmarks' random model source: a tensor larger than one float32 draw
(`DRAW_BYTES`) is drawn a slab of leading rows at a time into its own dtype, so building a
model never holds a float32 copy of its largest tensor (GLM-5.3-Flash's fused expert stack:
18 GiB, which ran an 80 GB card out of memory); smaller tensors are drawn as before."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from resin_models_cuda.layers import RandomWeights


def test_a_small_tensor_is_one_draw_scaled() -> None:
    w = RandomWeights("cpu", torch.bfloat16, seed=3, std=0.02)
    got = w.get("x", (64, 48))
    expected = torch.randn((64, 48), generator=torch.Generator().manual_seed(3)) * 0.02
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, expected.to(torch.bfloat16))


def test_a_large_tensor_is_drawn_in_slabs_of_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RandomWeights, "DRAW_BYTES", 4 * 40 * 16)  # 40 rows of [16] at a time
    draws: list[tuple[int, ...]] = []
    real = torch.randn

    def counting(*args: Any, **kwargs: Any) -> torch.Tensor:
        draws.append(tuple(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "randn", counting)
    w = RandomWeights("cpu", torch.bfloat16, seed=3, std=0.5)
    got = w.get("experts", (7, 20, 16))  # 7 slabs of 20 x 16: two a draw
    assert draws == [(2, 20, 16), (2, 20, 16), (2, 20, 16), (1, 20, 16)]
    assert got.shape == (7, 20, 16) and got.dtype == torch.bfloat16
    # the slabs are the generator's consecutive draws, each scaled: the same as one draw here
    # (the CPU generator continues its stream across calls)
    whole = real((7, 20, 16), generator=torch.Generator().manual_seed(3)) * 0.5
    assert torch.equal(got, whole.to(torch.bfloat16))
    assert 0.45 < got.float().std().item() < 0.55
