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
    assert recipe.supports_images
    prompt = recipe.render([Message("user", [Image(pixels=pixels), Text("What is this?")])])
    processor = Gemma3ImageProcessorPil(size={"height": 896, "width": 896})
    expected = processor(images=[pixels], return_tensors="np")["pixel_values"][0]
    (ours,) = prompt.multimodal
    assert ours.shape == expected.shape == (3, 896, 896) and ours.dtype == np.float32
    assert np.array_equal(ours, expected)
    tok = recipe.tokenizer
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
    red = prompt.multimodal[0]
    assert np.allclose(red[0], 1.0) and np.allclose(red[1], -1.0)
    with pytest.raises(ValueError, match="decode"):
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
