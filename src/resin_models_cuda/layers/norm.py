"""RMSNorm as a layer, with the residual stream written out: `x = norm(x)` alone, or
`x, residual = norm(x, residual)` at a pre-norm boundary (`residual += x; x = norm(residual)`,
one fused kernel), or `x, residual = norm(x, residual, sublayer_norm=post)` at a post-norm
boundary (Gemma 3: `residual += post(x); x = norm(residual)`, one kernel). The fused forms work
in place: the tensors returned are the arguments' storage, so a CUDA graph replays them."""

from __future__ import annotations

from typing import overload

import torch

from resin_models_cuda.kernels.rmsnorm import fused_add_rmsnorm, rmsnorm
from resin_models_cuda.layers.weights import WeightSource


class RMSNorm:
    """`unit_offset`: Gemma's `(1 + w)` weight (stored as w, initialised at zero)."""

    def __init__(
        self, weights: WeightSource, name: str, dim: int, eps: float, unit_offset: bool = False
    ) -> None:
        self.weight = weights.get(name, (dim,), "zeros" if unit_offset else "ones")
        self.eps, self.unit_offset = eps, unit_offset

    @overload
    def __call__(self, x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor: ...

    @overload
    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor, *, sublayer_norm: RMSNorm | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def __call__(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
        *,
        sublayer_norm: RMSNorm | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`norm(x)` (`out` may be `x` itself; rows may be strided), or the fused residual
        boundary `(x, residual)` described in the module docstring."""
        if residual is None:
            return rmsnorm(x, self.weight, self.eps, out, unit_offset=self.unit_offset)
        x_weight = None if sublayer_norm is None else sublayer_norm.weight
        fused_add_rmsnorm(
            x, residual, self.weight, self.eps, x_weight=x_weight, unit_offset=self.unit_offset
        )
        return x, residual
