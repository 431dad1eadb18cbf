"""RMSNorm as a layer: plain, fused with the residual add before it (pre-norm), or the
post-norm placement (norm the sublayer output, add it, norm the sum for the next sublayer)."""

from __future__ import annotations

import torch

from resin_models_cuda.kernels.rmsnorm import fused_add_rmsnorm, rmsnorm
from resin_models_cuda.layers.weights import WeightSource


class RMSNorm:
    """`unit_offset`: Gemma's `(1 + w)` weight (stored as w, initialised at zero)."""

    def __init__(
        self, w: WeightSource, name: str, dim: int, eps: float, unit_offset: bool = False
    ) -> None:
        self.weight = w.get(name, (dim,), "zeros" if unit_offset else "ones")
        self.eps, self.unit_offset = eps, unit_offset

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """`out` may be `x` itself (in place); rows may be strided."""
        return rmsnorm(x, self.weight, self.eps, out, unit_offset=self.unit_offset)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """Pre-norm boundary, in place: `residual += x; x = norm(residual)`."""
        fused_add_rmsnorm(x, residual, self.weight, self.eps, unit_offset=self.unit_offset)

    def add_post_norm(self, x: torch.Tensor, residual: torch.Tensor, post: RMSNorm) -> None:
        """Post-norm boundary, in place: `residual += post(x); x = norm(residual)`."""
        fused_add_rmsnorm(
            x, residual, self.weight, self.eps, x_weight=post.weight, unit_offset=self.unit_offset
        )
