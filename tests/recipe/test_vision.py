"""Gemma 3 image preprocessing equals transformers' (Pillow) image processor; the prompt gets
the image sequence; text-only recipes refuse images clearly."""

from __future__ import annotations

import io

import numpy as np
import pytest

from resin.recipe import Image, JinjaRecipe, Message, Text, get_native_recipe
from tests.recipe.assets import npm_tokenizer


def test_gemma3_pixels_match_transformers() -> None:
    pytest.importorskip("PIL")
    from transformers import Gemma3ImageProcessorPil

    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(300, 500, 3), dtype=np.uint8)
    recipe = JinjaRecipe(npm_tokenizer("gemma3"))
    tok = recipe.tokenizer
    assert recipe.supports_images
    prompt = recipe.render([Message("user", [Image(pixels=pixels), Text("What is this?")])])
    processor = Gemma3ImageProcessorPil(size={"height": 896, "width": 896})
    expected = processor(images=[pixels], return_tensors="np")["pixel_values"][0]
    (item,) = prompt.multimodal
    ours = item.data
    assert item.bidirectional and item.length == 256
    assert (
        prompt.token_ids[item.position : item.end] == [tok.token_to_id("<image_soft_token>")] * 256
    )
    assert ours.shape == expected.shape == (3, 896, 896) and ours.dtype == np.float32
    assert np.array_equal(ours, expected)
    soft = tok.token_to_id("<image_soft_token>")
    assert prompt.token_ids.count(soft) == 256
    assert (
        "\n\n<start_of_image>" in prompt.text and "<end_of_image>\n\nWhat is this?" in prompt.text
    )


def test_gemma3_decodes_png_bytes() -> None:
    from PIL import Image as PILImage

    buffer = io.BytesIO()
    PILImage.new("RGB", (20, 10), (255, 0, 0)).save(buffer, format="PNG")
    recipe = JinjaRecipe(npm_tokenizer("gemma3"))
    prompt = recipe.render([Message("user", [Image(data=buffer.getvalue()), Text("Color?")])])
    red = prompt.multimodal[0].data
    assert np.allclose(red[0], 1.0) and np.allclose(red[1], -1.0)
    with pytest.raises(ValueError, match="not an image of a known type"):
        recipe.render([Message("user", [Image(data=b"not an image")])])
    with pytest.raises(ValueError, match="URL"):
        recipe.render([Message("user", [Image(url="http://example.invalid/x.png")])])


def test_text_only_recipes_refuse_images() -> None:
    image = Image(pixels=np.zeros((4, 4, 3), dtype=np.uint8))
    for recipe in (
        get_native_recipe("qwen3", npm_tokenizer("qwen3")),
        JinjaRecipe(npm_tokenizer("qwen3")),
    ):
        with pytest.raises(ValueError, match="does not take images"):
            recipe.render([Message("user", [image, Text("hi")])])
    with pytest.raises(ValueError, match="HxWx3"):
        Image(pixels=np.zeros((4, 4), dtype=np.uint8))


def test_qwen_vision_expands_pads_per_image() -> None:
    from resin.recipe.vision import QwenVision, vision_for

    tok = npm_tokenizer("qwen3")  # the Qwen2.5-VL vocabulary's vision tokens are the same
    pixels = np.random.default_rng(0).integers(0, 256, (60, 90, 3), dtype=np.uint8)
    text = (
        "a<|vision_start|><|image_pad|><|vision_end|>b<|vision_start|><|image_pad|><|vision_end|>"
    )
    vision = vision_for({"model_type": "qwen2_5_vl", "vision_config": {}})
    assert isinstance(vision, QwenVision)
    rendered = vision.render(tok, text, [Image(pixels=pixels), Image(pixels=pixels[:30])])
    first, second = rendered.multimodal
    pad = tok.token_to_id("<|image_pad|>")
    assert first.grid_thw == (1, 4, 6) and first.length == 6  # 56x84 pixels
    assert second.grid_thw == (1, 4, 8) and second.length == 8  # 30x90 grows to 56x112
    for item in (first, second):
        assert rendered.token_ids[item.position : item.end] == [pad] * item.length
        assert rendered.token_ids[item.end] == tok.token_to_id("<|vision_end|>")
    assert first.content_hash != second.content_hash
    with pytest.raises(ValueError, match="2 image placeholders for 1"):
        vision.render(tok, text, [Image(pixels=pixels)])
    assert vision_for({"model_type": "qwen2"}) is None
