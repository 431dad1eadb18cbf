"""`config.json` of multimodal checkpoints: the text part goes through the family's text
parser, the vision part becomes a `VisionConfig` on the returned `ModelConfig`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from resin_model.config import ModelConfig, VisionConfig
from resin_model.hf_reader import Reader

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
        hidden_size=v.integer("hidden_size", low=0),
        intermediate_size=v.integer("intermediate_size", low=0),
        num_layers=v.integer("num_hidden_layers", low=0),
        num_heads=v.integer("num_attention_heads", low=0),
        patch_size=v.integer("patch_size", low=0),
        image_size=v.integer("image_size", low=0),
        norm_eps=float(v.get("layer_norm_eps", 1e-6)),
        image_token_id=raw.integer("image_token_index", 262144, low=0),
        tokens_per_image=raw.integer("mm_tokens_per_image", 256, low=0),
    )
    v.check_all_read()
    raw.get("boi_token_index")
    raw.get("eoi_token_index")
    tie = bool(raw.get("tie_word_embeddings", text.tie_embeddings))
    return replace(text, model_type="gemma3", vision=vision, tie_embeddings=tie)


_QWEN_TOP = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def qwen2_5_vl(raw: Reader, text_parser: TextParser) -> ModelConfig:
    """Qwen2.5-VL: a Qwen2 text model with M-RoPE and its windowed ViT (nested or flat
    config layouts)."""
    if raw.has("text_config"):
        part = dict(raw.require("text_config"))
    else:  # older flat layout: the text keys sit at the top level
        part = {k: v for k, v in raw.raw.items() if k not in (*_QWEN_TOP, "vision_config")}
    rope = dict(part.pop("rope_parameters", None) or part.pop("rope_scaling", None) or {})
    section = tuple(int(x) for x in rope.pop("mrope_section", ()))
    if rope.get("type") == "mrope" or rope.get("rope_type") == "mrope":
        rope.pop("type", None)
        rope["rope_type"] = "default"
    part.update(model_type="qwen2", rope_parameters=rope)
    text_reader = Reader(part)
    text = text_parser(text_reader)
    text_reader.check_all_read()
    if not raw.has("text_config"):
        raw.read.update(part)  # the flat keys were read through the text reader
    if len(section) != 3 or 2 * sum(section) != text.head_dim:
        raise ValueError(f"mrope_section {section} must be 3 sections of head_dim / 2")
    v = _sub(raw, "vision_config", "qwen2_5_vl_vision")
    v.expect("in_channels", (3,))
    v.expect("hidden_act", ("silu",))
    v.get("tokens_per_second")  # temporal spacing of video positions (videos are refused)
    vrope = v.get("rope_parameters") or {}
    vision = VisionConfig(
        kind="qwen2_5_vl",
        hidden_size=v.integer("hidden_size", low=0),
        intermediate_size=v.integer("intermediate_size", low=0),
        num_layers=v.integer("depth", low=0),
        num_heads=v.integer("num_heads", low=0),
        patch_size=v.integer("patch_size", 14, low=0),
        image_token_id=raw.integer("image_token_id", 151655, low=0),
        hidden_act="silu",
        merge_size=v.integer("spatial_merge_size", 2, low=0),
        temporal_patch_size=v.integer("temporal_patch_size", 2, low=0),
        window_size=v.integer("window_size", 112, low=0),
        full_layers=tuple(int(i) for i in v.get("fullatt_block_indexes", [7, 15, 23, 31])),
        out_hidden_size=v.integer("out_hidden_size", low=0),
        rope_theta=float(vrope.get("rope_theta", 10000.0)),
        mrope_section=section,
    )
    v.check_all_read()
    for key in _QWEN_TOP:
        raw.get(key)
    tie = bool(raw.get("tie_word_embeddings", text.tie_embeddings))
    return replace(text, model_type="qwen2_5_vl", vision=vision, tie_embeddings=tie)
