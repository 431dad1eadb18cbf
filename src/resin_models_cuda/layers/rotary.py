"""Rotary embedding as a layer: cos/sin tables of one `RopeConfig` (default, linear, Llama-3,
YaRN), applied in place to q and k (half-split layout) in one launch, with the per-head q/k
RMS norms fused in when the model has them."""

from __future__ import annotations

import torch

from resin_models_cuda.kernels.rope import apply_rope, rope_cache
from resin_models_cuda.layers.norm import RMSNorm
from resin_models_torch.config import RopeConfig


class Rotary:
    def __init__(
        self, rope: RopeConfig, head_dim: int, max_positions: int, device: torch.device
    ) -> None:
        self.cos, self.sin = rope_cache(rope, head_dim, max_positions, device)

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor,
        norms: tuple[RMSNorm, RMSNorm] | None = None,
    ) -> None:
        """Rotate in place; `norms` (per-head q and k norms) are fused into the same kernel."""
        if norms is None:
            apply_rope(q, k, positions, self.cos, self.sin)
            return
        qn, kn = norms
        apply_rope(
            q, k, positions, self.cos, self.sin, (qn.weight, kn.weight), qn.eps, qn.unit_offset
        )
