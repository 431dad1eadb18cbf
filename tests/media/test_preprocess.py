"""CPU preprocessing equals transformers' Pillow image processors tensor for tensor, on images
decoded from bytes (sizes, aspect ratios, grayscale, alpha, palette, JPEG)."""

from __future__ import annotations

import io

import numpy as np
import pytest

from resin.media.decode import MediaLimits, decode_image
from resin.media.gemma3 import gemma3_pixels
from resin.media.qwen2_vl import QwenVisionConfig, qwen_image, qwen_video, smart_resize
from tests.media.images import generated_images

CASES = generated_images()


def _pil(data: bytes):  # type: ignore[no-untyped-def]
    from PIL import Image as PILImage

    return PILImage.open(io.BytesIO(data))


@pytest.mark.parametrize(("name", "data"), CASES, ids=[n for n, _ in CASES])
def test_gemma3_equals_transformers(name: str, data: bytes) -> None:
    from transformers import Gemma3ImageProcessorPil

    processor = Gemma3ImageProcessorPil(size={"height": 896, "width": 896})
    expected = processor(images=[_pil(data)], return_tensors="np")["pixel_values"][0]
    ours = gemma3_pixels(decode_image(data, MediaLimits()))
    assert ours.dtype == np.float32 and np.array_equal(ours, expected), name


@pytest.mark.parametrize(("name", "data"), CASES, ids=[n for n, _ in CASES])
def test_qwen2_vl_equals_transformers(name: str, data: bytes) -> None:
    from transformers import Qwen2VLImageProcessorPil

    expected = Qwen2VLImageProcessorPil()(images=[_pil(data)], return_tensors="np")
    ours = qwen_image(decode_image(data, MediaLimits()))
    assert ours.grid_thw == tuple(expected["image_grid_thw"][0])
    assert np.array_equal(ours.pixel_values, expected["pixel_values"]), name


def test_qwen_pixel_bounds_follow_the_config() -> None:
    from transformers import Qwen2VLImageProcessorPil

    config = QwenVisionConfig(min_pixels=100 * 28 * 28, max_pixels=200 * 28 * 28)
    processor = Qwen2VLImageProcessorPil(min_pixels=config.min_pixels, max_pixels=config.max_pixels)
    rng = np.random.default_rng(1)
    for shape in [(40, 40), (3000, 2000)]:
        pixels = rng.integers(0, 256, size=(*shape, 3), dtype=np.uint8)
        expected = processor(images=[pixels], return_tensors="np")
        ours = qwen_image(pixels, config)
        assert ours.grid_thw == tuple(expected["image_grid_thw"][0])
        assert np.array_equal(ours.pixel_values, expected["pixel_values"])
        assert 100 <= ours.num_tokens() <= 200


def test_qwen_video_patches_group_consecutive_frames() -> None:
    rng = np.random.default_rng(2)
    frames = rng.integers(0, 256, size=(3, 60, 90, 3), dtype=np.uint8)
    video = qwen_video(frames)
    height, width = smart_resize(60, 90, QwenVisionConfig())
    assert video.grid_thw == (2, height // 14, width // 14)  # 3 frames pad to 4
    still = qwen_image(frames[0])
    single = still.pixel_values.shape[0]
    per_frame = qwen_video(frames[:2]).pixel_values
    assert np.array_equal(video.pixel_values[:single], per_frame)
    # The second temporal group is frame 2 twice: its two time slices are equal.
    second = video.pixel_values[single:].reshape(single, 3, 2, 14, 14)
    assert np.array_equal(second[:, :, 0], second[:, :, 1])
    # A still image is one frame repeated: both time slices equal that frame's patches.
    first = video.pixel_values[:single].reshape(single, 3, 2, 14, 14)
    assert np.array_equal(first[:, :, 0], still.pixel_values.reshape(single, 3, 2, 14, 14)[:, :, 0])
    assert not np.array_equal(first[:, :, 0], first[:, :, 1])


def test_qwen_patch_rows_keep_merge_blocks_together() -> None:
    frames = np.zeros((2, 56, 84, 3), dtype=np.uint8)
    for y in range(56):
        for x in range(84):
            frames[:, y, x] = (y, x, 0)
    patches = qwen_video(frames, QwenVisionConfig(min_pixels=1, max_pixels=10**6))
    assert patches.grid_thw == (1, 4, 6)
    rows = patches.pixel_values.reshape(24, 3, 2, 14, 14)
    # Row order (h/2, w/2, 2, 2): row r covers patch (by*2 + my, bx*2 + mx).
    for r in range(24):
        block, inner = divmod(r, 4)
        by, bx = divmod(block, 3)
        my, mx = divmod(inner, 2)
        top, left = (by * 2 + my) * 14, (bx * 2 + mx) * 14
        red = (top / 255 - 0.48145466) / 0.26862954
        green = (left / 255 - 0.4578275) / 0.26130258
        assert rows[r, 0, 0, 0, 0] == pytest.approx(red, abs=1e-5)
        assert rows[r, 1, 0, 0, 0] == pytest.approx(green, abs=1e-5)
