"""Images through the Engine: greedy output equals transformers' for Gemma 3 (bidirectional
spans kept whole by the chunker) and Qwen2.5-VL (spans cut by chunks), each image encoded once
per request; the prefix cache shares pages for the same image bytes and text and not for a
different image behind the same placeholder ids (asserted via `cached_tokens`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from resin import Engine, SamplingParams
from resin.media.decode import content_hash
from resin.plan import MediaItem
from resin_models_torch.registry import load_runner
from tests.models.vision_hf import IMAGE_TOKEN, gemma3_vlm, qwen2_5_vl

NEW = 5


def _gemma_image(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((3, 56, 56)).astype(np.float32)


def _hf_greedy(hf: Any, tokens: list[int], pixels: np.ndarray, extra: dict[str, Any]) -> list[int]:
    out: list[int] = []
    for _ in range(NEW):
        ids = torch.tensor([tokens + out])
        with torch.no_grad():
            logits = hf(
                input_ids=ids, pixel_values=torch.from_numpy(pixels.copy()), **extra(ids)
            ).logits
        out.append(int(logits[0, -1].argmax()))
    return out


def _run(engine: Engine, prompt: list[int], item: MediaItem) -> tuple[list[int], int]:
    request = engine.submit(
        prompt, SamplingParams(max_output_tokens=NEW, temperature=0.0), media=[item]
    )
    while engine.has_work():
        engine.step()
    assert request.error is None, request.error
    return request.take_result(), request.cached_tokens


def _prompt(before: int, span: int, after: int) -> tuple[list[int], int]:
    gen = torch.Generator().manual_seed(before + after)
    words = torch.randint(0, 290, (before + after,), generator=gen).tolist()
    return words[:before] + [IMAGE_TOKEN] * span + words[before:], before


def test_gemma3_engine_prefix_cache_keys_on_image_content() -> None:
    folder, hf = gemma3_vlm()
    runner = load_runner(folder, page_size=4)
    engine = Engine(runner, context_length=64, prefix_cache=True, prefill_chunk_tokens=6)
    prompt, at = _prompt(7, 4, 9)  # image at 7..10; chunks of 6 would end at 6 and 12
    x, y = _gemma_image(1), _gemma_image(2)

    def item(pixels: np.ndarray) -> MediaItem:
        return MediaItem(0, at, 4, content_hash(pixels.tobytes()), pixels, bidirectional=True)

    def hf_out(pixels: np.ndarray) -> list[int]:
        return _hf_greedy(
            hf, prompt, pixels[None], lambda ids: {"token_type_ids": (ids == IMAGE_TOKEN).long()}
        )

    first, hit = _run(engine, prompt, item(x))
    assert hit == 0 and first == hf_out(x)
    assert runner.media.encoded == 1
    again, hit = _run(engine, prompt, item(x.copy()))  # same bytes, new array
    assert again == first and hit >= 16  # pages past the image are shared
    other, hit = _run(engine, prompt, item(y))  # same placeholder ids, different image
    assert hit == 4  # only the page before the image's first placeholder (positions 0..3)
    assert other == hf_out(y) != first


def test_qwen2_5_vl_engine_cuts_spans_and_encodes_once() -> None:
    from resin.media.qwen2_vl import QwenVisionConfig, qwen_image

    folder, hf = qwen2_5_vl()
    runner = load_runner(folder, page_size=4)
    engine = Engine(runner, context_length=96, prefix_cache=True, prefill_chunk_tokens=5)
    pixels = np.random.default_rng(3).integers(0, 256, (150, 150, 3), dtype=np.uint8)
    image = qwen_image(pixels, QwenVisionConfig(max_pixels=28 * 28 * 12))
    span = image.num_tokens()
    prompt, at = _prompt(3, span, 6)
    media = MediaItem(
        0, at, span, content_hash(pixels.tobytes()), image.pixel_values, image.grid_thw
    )
    out, _ = _run(engine, prompt, media)
    assert runner.media.encoded == 1  # the 5-token chunks cut the 9-token span twice
    expected = _hf_greedy(
        hf,
        prompt,
        image.pixel_values,
        lambda ids: {
            "image_grid_thw": torch.tensor([image.grid_thw]),
            "mm_token_type_ids": (ids == IMAGE_TOKEN).int(),
        },
    )
    assert out == expected


def test_bad_media_is_refused_at_submit() -> None:
    folder, _ = gemma3_vlm()
    engine = Engine(load_runner(folder, page_size=4), context_length=64, prefill_chunk_tokens=4)
    pixels = _gemma_image(0)
    with pytest.raises(ValueError, match="leaves"):
        engine.submit([1, 2, 3], media=[MediaItem(0, 2, 4, "h", pixels, bidirectional=True)])
    with pytest.raises(ValueError, match="prefill_chunk_tokens >= 6"):
        engine.submit([1] * 9, media=[MediaItem(0, 1, 6, "h", pixels, bidirectional=True)])
