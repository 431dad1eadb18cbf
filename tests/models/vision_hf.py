"""Tiny random multimodal Hugging Face models and prompts with image placeholder spans."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers

from resin.plan import MediaItem
from tests.models.ref_hf import _ROOT

IMAGE_TOKEN = 299


def _perturb(model: Any) -> None:
    with torch.no_grad():  # zero-initialised projector / unit norms would hide mistakes
        for name, param in model.named_parameters():
            if "projector" in name or "norm" in name or name.endswith(".bias"):
                param.add_(torch.randn_like(param) * 0.1)


@functools.cache
def gemma3_vlm() -> tuple[Path, Any]:
    text = dict(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=3, head_dim=16, sliding_window=6,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=16, initializer_range=0.1,
    )  # fmt: skip
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=56, patch_size=14, vision_use_head=False,
    )  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4,
        image_token_index=IMAGE_TOKEN, boi_token_index=297, eoi_token_index=298,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    _perturb(model)
    folder = _ROOT / "gemma3_vlm"
    model.save_pretrained(folder)
    return folder, model


def with_images(
    text: list[int], at: list[int], length: int, pixels: list[np.ndarray], bidirectional: bool
) -> tuple[list[int], list[MediaItem]]:
    """`text` with a `length`-token placeholder span inserted before each index of `at`."""
    tokens: list[int] = []
    items = []
    cuts = [0, *at, len(text)]
    for k in range(len(at) + 1):
        tokens += text[cuts[k] : cuts[k + 1]]
        if k < len(at):
            data = pixels[k].astype(np.float32)
            items.append(
                MediaItem(
                    0,
                    len(tokens),
                    length,
                    f"img{k}-{float(data.sum()):.6f}",
                    data,
                    bidirectional=bidirectional,
                )
            )
            tokens += [IMAGE_TOKEN] * length
    return tokens, items


@functools.cache
def qwen2_5_vl() -> tuple[Path, Any]:
    text = dict(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, initializer_range=0.1,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    vision = dict(
        depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
        patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
        fullatt_block_indexes=[1], initializer_range=0.1,
    )  # fmt: skip
    config = transformers.Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, image_token_id=IMAGE_TOKEN,
        video_token_id=298, vision_start_token_id=297, vision_end_token_id=296,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).eval()
    _perturb(model)
    folder = _ROOT / "qwen2_5_vl"
    model.save_pretrained(folder)
    return folder, model
