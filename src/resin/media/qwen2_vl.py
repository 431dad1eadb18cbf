"""Qwen2-VL / Qwen2.5-VL preprocessing: dynamic resolution and flat patches.

`smart_resize` picks the size nearest the original whose sides are multiples of
patch x merge (28) with a pixel count inside [min_pixels, max_pixels], keeping the aspect ratio.
The image is resized there (Pillow bicubic), normalized with CLIP's mean/std and cut into
patches of `temporal_patch_size x 14 x 14`: a still image repeats itself along time, a video
groups consecutive frames (an odd count repeats the last frame). Patch rows are ordered so each
merge_size x merge_size block of neighbours is contiguous (the merger folds them into one
token): row order (t, h/m, w/m, m, m), columns (channel, t, 14, 14). `grid_thw` is
(frames / temporal_patch_size, height / 14, width / 14); the image takes
`t * h * w / merge_size**2` placeholder tokens. Matches `Qwen2VLImageProcessorPil`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from resin.media.decode import MediaError, U8Image
from resin.media.pixels import CLIP_MEAN, CLIP_STD, F32Array, normalize_chw, resize


@dataclass(frozen=True, slots=True)
class QwenVisionConfig:
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


@dataclass(frozen=True, slots=True, eq=False)
class QwenPatches:
    """`pixel_values` float32 [t*h*w, 3*T*14*14] and `grid_thw` (t, h, w) of one image/video."""

    pixel_values: F32Array
    grid_thw: tuple[int, int, int]

    def num_tokens(self, merge_size: int = 2) -> int:
        t, h, w = self.grid_thw
        return t * h * w // (merge_size * merge_size)


def smart_resize(height: int, width: int, config: QwenVisionConfig) -> tuple[int, int]:
    factor = config.factor
    if max(height, width) / min(height, width) > 200:
        raise MediaError(f"image aspect ratio {width}x{height} is beyond 200:1")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > config.max_pixels:
        beta = math.sqrt(height * width / config.max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < config.min_pixels:
        beta = math.sqrt(config.min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_image(pixels: U8Image, config: QwenVisionConfig | None = None) -> QwenPatches:
    """One still image: a single frame repeated over the temporal patch."""
    cfg = config or QwenVisionConfig()
    chw = _frame(pixels, *smart_resize(pixels.shape[0], pixels.shape[1], cfg))
    frames = np.broadcast_to(chw, (1, cfg.temporal_patch_size, *chw.shape))  # no copy
    return QwenPatches(_patchify(frames, cfg), _grid(frames.shape, cfg))


def qwen_video(frames: U8Image, config: QwenVisionConfig | None = None) -> QwenPatches:
    """Frames [F, H, W, 3] uint8 of one video (already sampled) -> flat patches."""
    cfg = config or QwenVisionConfig()
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.shape[0] == 0:
        raise MediaError(f"video frames must be FxHxWx3, got shape {frames.shape}")
    height, width = smart_resize(frames.shape[1], frames.shape[2], cfg)
    count = frames.shape[0] + (-frames.shape[0] % cfg.temporal_patch_size)
    order = np.minimum(np.arange(count), frames.shape[0] - 1)  # pad with the last frame
    chw = np.stack([_frame(frames[i], height, width) for i in order])
    grouped = chw.reshape(count // cfg.temporal_patch_size, cfg.temporal_patch_size, *chw.shape[1:])
    return QwenPatches(_patchify(grouped, cfg), _grid(grouped.shape, cfg))


def _frame(pixels: U8Image, height: int, width: int) -> F32Array:
    return normalize_chw(resize(pixels, height, width, True), CLIP_MEAN, CLIP_STD)


def _grid(shape: tuple[int, ...], cfg: QwenVisionConfig) -> tuple[int, int, int]:
    t, _, _, height, width = shape
    return t, height // cfg.patch_size, width // cfg.patch_size


def _patchify(frames: np.ndarray[Any, np.dtype[np.float32]], cfg: QwenVisionConfig) -> F32Array:
    """(t, tp, C, H, W) -> (t*h*w, C*tp*p*p), rows in (t, h/m, w/m, m, m) order."""
    t, h, w = _grid(frames.shape, cfg)
    p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    channels = frames.shape[2]
    blocks = frames.reshape(t, tp, channels, h // m, m, p, w // m, m, p)
    # -> (t, h/m, w/m, m, m, channel, tp, p, p)
    ordered = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    out: F32Array = np.ascontiguousarray(ordered).reshape(t * h * w, channels * tp * p * p)
    return out
