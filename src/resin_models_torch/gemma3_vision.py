"""Gemma 3 with images (`model_type` "gemma3"): the text model of `gemma3.py` and the image
encoder of `gemma3_encoder.py` (SigLIP tower + projector). Image features replace the
embeddings of the placeholder tokens (after the text embedding scale, as transformers does),
and the tokens of one image attend to each other both ways (`MediaItem.bidirectional`; the
runner widens the causal mask)."""

from __future__ import annotations

import torch

from resin.plan import MediaItem
from resin_model.config import ModelConfig
from resin_model.gemma3_encoder import Gemma3Projector, encode_image
from resin_model.siglip import SiglipVisionTower
from resin_models_torch.batch import StepContext
from resin_models_torch.gemma3 import Gemma3ForCausalLM


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        assert config.vision is not None, "gemma3 needs a vision_config"
        self.vision = config.vision
        self.vision_tower = SiglipVisionTower(config.vision)
        self.multi_modal_projector = Gemma3Projector(config.vision, config.hidden_size)

    def encode_media(self, item: MediaItem) -> torch.Tensor:
        """[length, hidden] features of one image ([3, S, S] preprocessed pixels)."""
        return encode_image(self.vision, self.vision_tower, self.multi_modal_projector, item)

    def forward(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        return self.run_layers(self.embed_with_media(input_ids, ctx), ctx)
