"""Gemma 3 (text) on the fast layer library: interleaved sliding-window and full-attention
layers (a Window and a History cache group, each with its own rope base), `(1 + w)` RMS norms,
four norms per layer (the sublayer outputs are normed before they join the residual: each
boundary is one fused "post-norm, add, pre-norm" kernel), per-head q/k norms, scores scaled by
`query_pre_attn_scalar`, embeddings scaled by sqrt(hidden), GELU-tanh MLP.

`Gemma3Vision` ("gemma3" with a `vision_config`) adds the image encoder both families share
(`resin_model.gemma3_encoder`, eager PyTorch): its features replace the placeholder
embeddings after the scale, and the step's `span_end` lets an image's tokens see each other."""

from __future__ import annotations

import torch

from resin.plan import MediaItem
from resin_model.config import ModelConfig
from resin_model.gemma3_encoder import Gemma3ImageEncoder
from resin_models_cuda.layers import Attention, GatedMLP, RMSNorm, WeightSource
from resin_models_cuda.models.base import BuildOptions, FastModel
from resin_models_cuda.step import StepTensors


class Gemma3Layer:
    def __init__(
        self, config: ModelConfig, weights: WeightSource, prefix: str, attention: Attention
    ) -> None:
        hidden, eps = config.hidden_size, config.norm_eps

        def norm(name: str) -> RMSNorm:
            return RMSNorm(weights, f"{prefix}{name}.weight", hidden, eps, unit_offset=True)

        self.input_norm = norm("input_layernorm")
        self.attn = attention
        self.post_attn_norm = norm("post_attention_layernorm")
        self.pre_ff_norm = norm("pre_feedforward_layernorm")
        inner = config.intermediate_size
        self.mlp = GatedMLP(weights, f"{prefix}mlp.", hidden, inner, config.hidden_act)
        self.post_ff_norm = norm("post_feedforward_layernorm")


class Gemma3(FastModel):
    unit_offset_norms = True

    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        super().__init__(config, weights, options)
        self.layers = [
            Gemma3Layer(config, weights, f"model.layers.{layer}.", self.attention(weights, layer))
            for layer in range(config.num_layers)
        ]

    def forward(self, step: StepTensors, kv: torch.Tensor) -> torch.Tensor:
        residual = self.embed_tokens(step.input_ids, step.media)
        x = self.layers[0].input_norm(residual)
        next_norms = [layer.input_norm for layer in self.layers[1:]] + [self.final_norm]
        for layer, next_norm in zip(self.layers, next_norms, strict=True):
            x = layer.attn(x, step, kv)
            x, residual = layer.pre_ff_norm(x, residual, sublayer_norm=layer.post_attn_norm)
            x = layer.mlp(x)
            x, residual = next_norm(x, residual, sublayer_norm=layer.post_ff_norm)
        return x


class Gemma3Vision(Gemma3):
    def __init__(self, config: ModelConfig, weights: WeightSource, options: BuildOptions) -> None:
        super().__init__(config, weights, options)
        if config.vision is None:
            raise ValueError("gemma3 needs a vision_config")
        with torch.device(weights.device):
            encoder = Gemma3ImageEncoder(config.vision, config.hidden_size).to(weights.dtype)
        state = encoder.state_dict()
        encoder.load_state_dict({n: weights.get(n, tuple(t.shape)) for n, t in state.items()})
        self.encoder = encoder.eval()

    def encode_media(self, item: MediaItem) -> torch.Tensor:
        """[item.length, hidden] features of one image (eager PyTorch)."""
        return self.encoder.encode_media(item)
