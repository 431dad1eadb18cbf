"""`config.json` of multimodal checkpoints: the text part goes through the family's text
parser, the vision part becomes a `VisionConfig` on the returned `ModelConfig`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from resin_models_torch.config import ModelConfig, VisionConfig
from resin_models_torch.hf_reader import Reader

TextParser = Callable[[Reader], ModelConfig]


def _sub(raw: Reader, key: str, model_type: str) -> Reader:
    part = dict(raw.require(key))
    part.setdefault("model_type", model_type)
    return Reader(part)


def gemma3_vlm(raw: Reader, text_parser: TextParser) -> ModelConfig:
    """Gemma 3 with its SigLIP tower (`Gemma3ForConditionalGeneration`)."""
    text_reader = _sub(raw, "text_config", "gemma3_text")
    text = text_parser(text_reader)
    text_reader.check_all_read()
    v = _sub(raw, "vision_config", "siglip_vision_model")
    v.expect("num_channels", (3,))
    v.get("vision_use_head")  # the pooling head is not used by Gemma 3
    v.expect("hidden_act", ("gelu_pytorch_tanh",))
    vision = VisionConfig(
        kind="siglip",
        hidden_size=int(v.require("hidden_size")),
        intermediate_size=int(v.require("intermediate_size")),
        num_layers=int(v.require("num_hidden_layers")),
        num_heads=int(v.require("num_attention_heads")),
        patch_size=int(v.require("patch_size")),
        image_size=int(v.require("image_size")),
        norm_eps=float(v.get("layer_norm_eps", 1e-6)),
        image_token_id=int(raw.get("image_token_index", 262144)),
        tokens_per_image=int(raw.get("mm_tokens_per_image", 256)),
    )
    v.check_all_read()
    raw.get("boi_token_index")
    raw.get("eoi_token_index")
    tie = bool(raw.get("tie_word_embeddings", text.tie_embeddings))
    return replace(text, model_type="gemma3", vision=vision, tie_embeddings=tie)
