"""gpt-oss: the Llama-family attention with q/k/v/o biases and per-head attention sinks, on
layers that alternate a 128-token sliding window (a Window group) and full attention (History),
YaRN rotary scaling, and a routed MoE on every layer (biased router, softmax over the top-k
logits, experts with biases and a clamped SwiGLU). Hugging Face parameter names."""

from __future__ import annotations

from torch import nn

from resin_model.config import ModelConfig
from resin_models_torch.layers import GptOssMoe
from resin_models_torch.llama import LlamaForCausalLM


def gpt_oss_mlp(config: ModelConfig, index: int) -> nn.Module:
    moe = config.moe
    assert moe is not None and moe.swiglu_limit is not None
    return GptOssMoe(
        config.hidden_size, moe.intermediate_size, moe.num_experts, moe.top_k,
        moe.swiglu_limit, moe.swiglu_alpha,
    )  # fmt: skip


class GptOssForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        if config.moe is None or not config.moe.clamped_swiglu:
            raise ValueError("gpt_oss needs its MoE config")
        super().__init__(config, mlp=gpt_oss_mlp)
