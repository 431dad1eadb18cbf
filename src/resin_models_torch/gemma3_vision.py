"""Gemma 3 with images (`model_type` "gemma3"): the text model of `gemma3.py`, a SigLIP tower
and the multimodal projector (average-pool the patch grid to `tokens_per_image`, Gemma RMS norm,
a matrix into the text width). Image features replace the embeddings of the placeholder tokens
(after the text embedding scale, as transformers does), and the tokens of one image attend to
each other both ways (`MediaItem.bidirectional`; the runner widens the causal mask)."""

from __future__ import annotations

import torch
from torch import nn

from resin.plan import MediaItem
from resin_models_torch.batch import StepContext
from resin_models_torch.config import ModelConfig, VisionConfig
from resin_models_torch.gemma3 import Gemma3ForCausalLM
from resin_models_torch.layers import RMSNorm
from resin_models_torch.siglip import SiglipVisionTower, avg_pool_tokens


class Gemma3Projector(nn.Module):
    def __init__(self, vision: VisionConfig, text_hidden: int) -> None:
        super().__init__()
        self.tokens = vision.tokens_per_image
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(vision.hidden_size, text_hidden))
        self.mm_soft_emb_norm = RMSNorm(vision.hidden_size, vision.norm_eps, unit_offset=True)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        pooled = avg_pool_tokens(features, self.tokens)
        return self.mm_soft_emb_norm(pooled) @ self.mm_input_projection_weight


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        assert config.vision is not None, "gemma3 needs a vision_config"
        self.vision = config.vision
        self.vision_tower = SiglipVisionTower(config.vision)
        self.multi_modal_projector = Gemma3Projector(config.vision, config.hidden_size)

    def encode_media(self, item: MediaItem) -> torch.Tensor:
        """[length, hidden] features of one image ([3, S, S] preprocessed pixels)."""
        size = self.vision.image_size
        if item.data.shape != (3, size, size):
            raise ValueError(f"Gemma 3 takes 3x{size}x{size} pixels, got {item.data.shape}")
        if item.length != self.vision.tokens_per_image:
            raise ValueError(
                f"an image fills {self.vision.tokens_per_image} tokens, the item says {item.length}"
            )
        device = self.vision_tower.post_layernorm.weight.device
        pixels = torch.from_numpy(item.data.copy()).to(device)[None]
        features: torch.Tensor = self.multi_modal_projector(self.vision_tower(pixels))[0]
        return features

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.run_layers(self.embed_with_media(input_ids, ctx), ctx)
