"""Rotary embedding as a layer: cos/sin tables of one `RopeConfig` (default, linear, Llama-3,
YaRN), applied in place to q and k (half-split layout) in one launch, with the per-head q/k
RMS norms fused in when the model has them, and the KV append too when asked (`append`)."""

from __future__ import annotations

import torch

from resin_model.config import RopeConfig
from resin_models_cuda.kernels.rope import apply_rope, rope_cache
from resin_models_cuda.layers.norm import RMSNorm


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
        append: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Rotate in place; `norms` (per-head q and k norms) and `append` (v, k_cache, v_cache,
        slots: store k and v in the paged cache) are fused into the same kernel."""
        if norms is None:
            apply_rope(q, k, positions, self.cos, self.sin, append=append)
            return
        qn, kn = norms
        weights = (qn.weight, kn.weight)
        apply_rope(
            q, k, positions, self.cos, self.sin, weights, qn.eps, qn.unit_offset, append=append
        )
