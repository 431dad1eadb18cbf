"""The eager PyTorch pieces both runner families run as is: activations by `config.json` name
and the float32 RMS norm (the reference layers, the SigLIP tower and Gemma 3's projector)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu": F.gelu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r}")
    return ACTIVATIONS[name]


class RMSNorm(nn.Module):
    """RMS norm in float32. `unit_offset` is Gemma's (1 + w) form (weights stored as w).

    Where the rounding to the input dtype happens follows each model's transformers code, so
    a bfloat16 model rounds as transformers does: the Llama form rounds the normalised input
    and multiplies by the weight in the input dtype; `weight_in_float32` (OLMo 2, gpt-oss) and
    `unit_offset` (Gemma) multiply in float32 and round once at the end."""

    def __init__(
        self, dim: int, eps: float, unit_offset: bool = False, weight_in_float32: bool = False
    ) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight_in_float32 = weight_in_float32
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (normed * (1.0 + self.weight.float())).to(x.dtype)
        if self.weight_in_float32:
            return (self.weight.float() * normed).to(x.dtype)
        return self.weight * normed.to(x.dtype)
