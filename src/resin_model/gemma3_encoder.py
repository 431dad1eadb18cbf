"""Gemma 3's image encoder, shared by both runner families (it runs eagerly in PyTorch in
each): the SigLIP tower (`siglip.py`) and the multimodal projector (average-pool the patch
grid to `tokens_per_image`, Gemma RMS norm, a matrix into the text width). Hugging Face names:
`vision_tower.*`, `multi_modal_projector.*`."""

from __future__ import annotations

import torch
from torch import nn

from resin.plan import MediaItem
from resin_model.config import VisionConfig
from resin_model.nn import RMSNorm
from resin_model.siglip import SiglipVisionTower, avg_pool_tokens


class Gemma3Projector(nn.Module):
    def __init__(self, vision: VisionConfig, text_hidden: int) -> None:
        super().__init__()
        self.tokens = vision.tokens_per_image
        self.mm_input_projection_weight = nn.Parameter(torch.zeros(vision.hidden_size, text_hidden))
        self.mm_soft_emb_norm = RMSNorm(vision.hidden_size, vision.norm_eps, unit_offset=True)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        pooled = avg_pool_tokens(features, self.tokens)
        return self.mm_soft_emb_norm(pooled) @ self.mm_input_projection_weight


def encode_image(
    vision: VisionConfig, tower: SiglipVisionTower, projector: Gemma3Projector, item: MediaItem
) -> torch.Tensor:
    """[length, text hidden] features of one image ([3, S, S] preprocessed pixels)."""
    size = vision.image_size
    if item.data.shape != (3, size, size):
        raise ValueError(f"Gemma 3 takes 3x{size}x{size} pixels, got {item.data.shape}")
    if item.length != vision.tokens_per_image:
        raise ValueError(
            f"an image fills {vision.tokens_per_image} tokens, the item says {item.length}"
        )
    device = tower.post_layernorm.weight.device
    pixels = torch.from_numpy(item.data.copy()).to(device)[None]
    features: torch.Tensor = projector(tower(pixels))[0]
    return features


class Gemma3ImageEncoder(nn.Module):
    """The tower and projector on their own, for a runner whose language model is elsewhere."""

    def __init__(self, vision: VisionConfig, text_hidden: int) -> None:
        super().__init__()
        self.vision = vision
        self.vision_tower = SiglipVisionTower(vision)
        self.multi_modal_projector = Gemma3Projector(vision, text_hidden)

    @torch.no_grad()
    def encode_media(self, item: MediaItem) -> torch.Tensor:
        return encode_image(self.vision, self.vision_tower, self.multi_modal_projector, item)
