"""Qwen3-MoE: the Qwen3 decoder (q/k norm) whose MLP is a routed mixture of experts on the
layers `decoder_sparse_step` / `mlp_only_layers` select (softmax routing, top-k experts,
optional `norm_topk_prob` renormalisation); other layers keep a dense MLP."""

from __future__ import annotations

from torch import nn

from resin_model.config import ModelConfig
from resin_models_torch.layers import SparseMoe
from resin_models_torch.llama import LlamaForCausalLM, dense_mlp


def moe_mlp(config: ModelConfig, index: int) -> nn.Module:
    moe = config.moe
    if moe is None or not moe.sparse_layers[index]:
        return dense_mlp(config, index)
    return SparseMoe(
        config.hidden_size,
        moe.intermediate_size,
        moe.num_experts,
        moe.top_k,
        moe.norm_topk_prob,
        config.hidden_act,
    )


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        if config.moe is None:
            raise ValueError("qwen3_moe needs a MoE config")
        super().__init__(config, mlp=moe_mlp)
