"""gpt-oss on the fast layer library: the Llama layer (pre-norm, q/k/v/o biases) with
attention sinks, layers alternating a 128-token sliding window and full attention (two cache
groups), YaRN rotary, and a routed MoE on every layer: biased router, softmax over the top-k
logits (= softmax, top-k, renormalize), experts with biases and the clamped SwiGLU.

Checkpoint layout: `mlp.router.{weight, bias}`, `mlp.experts.gate_up_proj` [E, H, 2I] with
gate/up interleaved on the last dim (+ bias [E, 2I]), `mlp.experts.down_proj` [E, I, H] (+ bias
[E, H]); converted once at load to the library's [E, 2I, H] (gate rows, then up rows) and
[E, H, I]. As published (MXFP4: `*_blocks` + `*_scales`, rows = output channels) the experts
stay MXFP4 on the device, gate/up rows de-interleaved with their scales
(`quantized.mxfp4_experts`).
"""

from __future__ import annotations

import torch

from resin_models_cuda.layers import ExpertWeights, GatedMLP, MoE, WeightSource
from resin_models_cuda.layers.moe import Experts
from resin_models_cuda.layers.quantized import mxfp4_experts
from resin_models_cuda.models.llama import Llama


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """[..., 2I] with gate/up interleaved -> [..., 2I] as [gate | up]."""
    return torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1)


class GptOss(Llama):
    def make_mlp(self, weights: WeightSource, layer: int) -> GatedMLP | MoE:
        config, prefix = self.config, f"model.layers.{layer}.mlp."
        assert config.moe is not None
        hidden, inner = config.hidden_size, config.moe.intermediate_size
        experts = config.moe.num_experts
        name = f"{prefix}experts.gate_up_proj"
        gate_up: Experts | None = mxfp4_experts(weights, name, (experts, 2 * inner, hidden), True)
        if gate_up is None:
            dense = weights.get(name, (experts, hidden, 2 * inner))
            gate_up = _deinterleave(dense).transpose(1, 2).contiguous()
        name = f"{prefix}experts.down_proj"
        down: Experts | None = mxfp4_experts(weights, name, (experts, hidden, inner))
        if down is None:
            down = weights.get(name, (experts, inner, hidden), "out").transpose(1, 2).contiguous()
        gate_up_bias = weights.get(f"{prefix}experts.gate_up_proj_bias", (experts, 2 * inner))
        expert_weights = ExpertWeights(
            weights.get(f"{prefix}router.weight", (experts, hidden)),
            weights.get(f"{prefix}router.bias", (experts,)),
            gate_up,
            _deinterleave(gate_up_bias).contiguous(),
            down,
            weights.get(f"{prefix}experts.down_proj_bias", (experts, hidden)),
        )
        return MoE(config.moe, expert_weights, "swiglu_clamp", self.options.moe_gemv_max_pairs)
