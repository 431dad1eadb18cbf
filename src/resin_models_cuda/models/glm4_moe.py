"""GLM-4.5 / GLM-4.5-Air on the fast layer library: the Llama layer (`llama.py`: fused qkv
with bias, per-head q/k norm fused into the rotary kernel, which turns only the leading
`rotary_dim` of each head) with DeepSeek-V3's MoE (`deepseek_moe`: the router kernel's
sigmoid grouped routing with the correction bias, shared experts folded in) on the layers
after `first_k_dense_replace`. The router weight and correction bias are read in float32,
as transformers keeps them. MTP layers in the checkpoint (`model.layers.{N}..`) are not read."""

from __future__ import annotations

import logging

from resin_model.config import ModelConfig
from resin_models_cuda.layers import GatedMLP, MoE, WeightSource
from resin_models_cuda.models.base import BuildOptions
from resin_models_cuda.models.deepseek import deepseek_moe
from resin_models_cuda.models.llama import Llama

log = logging.getLogger(__name__)


class Glm4Moe(Llama):
    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        if config.moe is None:
            raise ValueError("glm4_moe needs a MoE config")
        super().__init__(config, weights, options)
        if config.num_mtp_layers:
            log.info(
                "glm4_moe: %d MTP layer(s) at model.layers.%d.* not loaded",
                config.num_mtp_layers,
                config.num_layers,
            )

    def make_mlp(self, weights: WeightSource, layer: int) -> GatedMLP | MoE:
        if not self.config.is_sparse(layer):
            return super().make_mlp(weights, layer)
        prefix = f"model.layers.{layer}.mlp."
        return deepseek_moe(self.config, weights, prefix, self.options)
