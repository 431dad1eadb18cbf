"""Gemma 3's image preprocessing: a fixed 896x896 bilinear resize, [0, 1] then mean = std = 0.5,
channels first (float32, 3x896x896), as `Gemma3ImageProcessorPil` (no pan-and-scan)."""

from __future__ import annotations

from resin.media.decode import U8Image
from resin.media.pixels import F32Array, normalize_chw, resize


def gemma3_pixels(pixels: U8Image, size: int = 896) -> F32Array:
    resized = resize(pixels, size, size, bicubic=False)
    return normalize_chw(resized, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
