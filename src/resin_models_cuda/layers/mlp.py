"""Dense gated MLP as a layer: one fused `[gate; up]` matmul, the gated activation kernel,
the down matmul (optional biases)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resin_models_cuda.kernels.activation import Activation, gated_activation
from resin_models_cuda.layers.weights import WeightSource

ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
}


def activation_of(hidden_act: str) -> Activation:
    if hidden_act not in ACTIVATIONS:
        raise ValueError(f"the fast runner has no activation {hidden_act!r}")
    return ACTIVATIONS[hidden_act]


class GatedMLP:
    """`prefix` is the layer's `...mlp.` (Hugging Face gate_proj / up_proj / down_proj)."""

    def __init__(
        self,
        w: WeightSource,
        prefix: str,
        hidden: int,
        inner: int,
        hidden_act: str,
        bias: bool = False,
    ) -> None:
        self.act = activation_of(hidden_act)
        gate = w.get(f"{prefix}gate_proj.weight", (inner, hidden))
        up = w.get(f"{prefix}up_proj.weight", (inner, hidden))
        self.gate_up = torch.cat([gate, up])
        self.down = w.get(f"{prefix}down_proj.weight", (hidden, inner), "out")
        self.gate_up_bias = self.down_bias = None
        if bias:
            self.gate_up_bias = torch.cat(
                [w.get(f"{prefix}{p}_proj.bias", (inner,)) for p in ("gate", "up")]
            )
            self.down_bias = w.get(f"{prefix}down_proj.bias", (hidden,))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = gated_activation(F.linear(x, self.gate_up, self.gate_up_bias), self.act)
        return F.linear(h, self.down, self.down_bias)
