"""CPU image preprocessing for vision recipes (numpy only; Pillow only to decode bytes).

`Gemma3Vision` turns an `Image` block into the array Gemma 3's vision tower takes: resized to
896x896 with the same bilinear filter as Pillow (triangle filter widened by the scale factor when
shrinking, horizontal pass first, 8-bit rounding between passes), rescaled to [0, 1] and
normalized with mean = std = 0.5, channels first (float32, 3x896x896). In the prompt each image
placeholder becomes `\\n\\n<start_of_image>` + 256 `<image_soft_token>` + `<end_of_image>\\n\\n`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from resin.recipe.types import Image

FloatArray = np.ndarray[Any, np.dtype[np.float32]]


def _weights(size_in: int, size_out: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    """(size_out, size_in) bilinear resampling weights, Pillow's convention."""
    scale = size_in / size_out
    support = max(scale, 1.0)
    matrix = np.zeros((size_out, size_in))
    for i in range(size_out):
        center = (i + 0.5) * scale
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), size_in)
        x = np.arange(low, high)
        w = np.clip(1.0 - np.abs((x - center + 0.5) / support), 0.0, None)
        total = w.sum()
        if total > 0:
            matrix[i, low:high] = w / total
    return matrix


def resize_bilinear(
    pixels: np.ndarray[Any, np.dtype[np.uint8]], height: int, width: int
) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """HxWx3 uint8 -> height x width x 3 uint8, as Pillow's `Image.resize(..., BILINEAR)`."""
    out = pixels.astype(np.float64)
    if out.shape[1] != width:
        out = np.einsum("ow,hwc->hoc", _weights(out.shape[1], width), out)
        out = np.clip(np.round(out), 0, 255)
    if out.shape[0] != height:
        out = np.einsum("oh,hwc->owc", _weights(out.shape[0], height), out)
        out = np.clip(np.round(out), 0, 255)
    return out.astype(np.uint8)


def image_pixels(image: Image) -> np.ndarray[Any, np.dtype[np.uint8]]:
    """The RGB pixels of an Image block (decoding `data` needs Pillow)."""
    if image.pixels is not None:
        return image.pixels
    if image.data is not None:
        try:
            from PIL import Image as PILImage
        except ImportError:
            raise ValueError("decoding image bytes needs Pillow; pass Image(pixels=...)") from None
        try:
            with PILImage.open(io.BytesIO(image.data)) as decoded:
                return np.asarray(decoded.convert("RGB"), dtype=np.uint8)
        except OSError as exc:
            raise ValueError(f"cannot decode the image: {exc}") from None
    raise ValueError("an image URL must be fetched by the caller before rendering")


@dataclass(frozen=True)
class Gemma3Vision:
    """Gemma 3's image preprocessing and prompt expansion (see module docstring)."""

    size: int = 896
    tokens_per_image: int = 256
    boi: str = "<start_of_image>"
    eoi: str = "<end_of_image>"
    image_token: str = "<image_soft_token>"

    def preprocess(self, image: Image) -> FloatArray:
        resized = resize_bilinear(image_pixels(image), self.size, self.size)
        scaled = resized.astype(np.float32) * np.float32(1 / 255)
        normalized = (scaled - np.float32(0.5)) / np.float32(0.5)
        return np.ascontiguousarray(normalized.transpose(2, 0, 1))

    def expand_prompt(self, text: str, num_images: int) -> str:
        """Replace each image placeholder the template wrote by the full image sequence."""
        if text.count(self.boi) != num_images:
            raise ValueError(
                f"the template wrote {text.count(self.boi)} image placeholders for {num_images}"
                " images"
            )
        sequence = f"\n\n{self.boi}{self.image_token * self.tokens_per_image}{self.eoi}\n\n"
        return text.replace(self.boi, sequence)
