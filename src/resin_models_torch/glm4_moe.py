"""GLM-4.5 / GLM-4.5-Air (`glm4_moe`): the Llama-family decoder (GQA, q/k/v bias, optional
per-head q/k norm) with partial rotary (the leading `rotary_dim` of each head turn), the first
`first_k_dense_replace` layers dense and the rest DeepSeek-V3's MoE (`DeepseekMoe`: sigmoid
routing with the correction bias, groups, scaled weights, shared experts).

The router (`mlp.gate.weight`, `e_score_correction_bias`) stays in float32 whatever the
model's dtype, as transformers keeps it. The checkpoint's MTP layers (`model.layers.{N}..`,
`num_nextn_predict_layers`) are skipped at load: this runner does not draft with them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch import nn

from resin_model.config import ModelConfig
from resin_models_torch.deepseek import DeepseekMoe, DeepseekRouter
from resin_models_torch.llama import LlamaForCausalLM, dense_mlp

log = logging.getLogger(__name__)


def glm_mlp(config: ModelConfig, index: int) -> nn.Module:
    return DeepseekMoe(config) if config.is_sparse(index) else dense_mlp(config, index)


class Glm4MoeForCausalLM(LlamaForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        if config.moe is None:
            raise ValueError("glm4_moe needs a MoE config")
        super().__init__(config, mlp=glm_mlp)
        n, k = config.num_layers, config.num_mtp_layers
        self.mtp_prefixes = tuple(f"model.layers.{n + i}." for i in range(k))
        if k:
            log.info("glm4_moe: %d MTP layer(s) at model.layers.%d.* not loaded", k, n)

    def checkpoint_name(self, name: str) -> str | None:
        if name.startswith(self.mtp_prefixes):
            return None
        return super().checkpoint_name(name)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> Any:
        super()._apply(fn, recurse)
        for module in self.modules():
            if isinstance(module, DeepseekRouter):
                module.float()  # routing in float32, as transformers keeps it
        return self
