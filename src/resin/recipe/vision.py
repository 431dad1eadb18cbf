"""Image blocks for vision recipes (the arithmetic lives in `resin.media`).

`Gemma3Vision` turns an `Image` block into the array Gemma 3's vision tower takes (float32,
3x896x896, equal to transformers' Pillow processor). In the prompt each image
placeholder becomes `\\n\\n<start_of_image>` + 256 `<image_soft_token>` + `<end_of_image>\\n\\n`.
"""

from __future__ import annotations

from dataclasses import dataclass

from resin.media.decode import MediaLimits, U8Image, decode_image
from resin.media.gemma3 import gemma3_pixels
from resin.media.pixels import F32Array
from resin.recipe.types import Image


def image_pixels(image: Image, limits: MediaLimits | None = None) -> U8Image:
    """The RGB pixels of an Image block (decoding `data` needs Pillow)."""
    if image.pixels is not None:
        return image.pixels
    if image.data is not None:
        return decode_image(image.data, limits or MediaLimits())
    raise ValueError("an image URL must be fetched by the caller before rendering")


@dataclass(frozen=True)
class Gemma3Vision:
    """Gemma 3's image preprocessing and prompt expansion (see module docstring)."""

    size: int = 896
    tokens_per_image: int = 256
    boi: str = "<start_of_image>"
    eoi: str = "<end_of_image>"
    image_token: str = "<image_soft_token>"

    def preprocess(self, image: Image) -> F32Array:
        return gemma3_pixels(image_pixels(image), self.size)

    def expand_prompt(self, text: str, num_images: int) -> str:
        """Replace each image placeholder the template wrote by the full image sequence."""
        if text.count(self.boi) != num_images:
            raise ValueError(
                f"the template wrote {text.count(self.boi)} image placeholders for {num_images}"
                " images"
            )
        sequence = f"\n\n{self.boi}{self.image_token * self.tokens_per_image}{self.eoi}\n\n"
        return text.replace(self.boi, sequence)
