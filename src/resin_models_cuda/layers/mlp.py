"""Dense gated MLP as a layer: one fused `[gate; up]` matmul, the gated activation kernel,
the down matmul (optional biases); both through `quantized.linear` (FP8 where stored so)."""

from __future__ import annotations

import torch

from resin_models_cuda.kernels.activation import Activation, gated_activation
from resin_models_cuda.layers.quantized import linear
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
        gate_up_bias = down_bias = None
        if bias:
            gate_up_bias = torch.cat(
                [w.get(f"{prefix}{p}_proj.bias", (inner,)) for p in ("gate", "up")]
            )
            down_bias = w.get(f"{prefix}down_proj.bias", (hidden,))
        names = [f"{prefix}gate_proj.weight", f"{prefix}up_proj.weight"]
        self.gate_up = linear(w, names, [(inner, hidden)] * 2, bias=gate_up_bias)
        self.down = linear(w, [f"{prefix}down_proj.weight"], [(hidden, inner)], "out", down_bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(gated_activation(self.gate_up(x), self.act))
