"""Image blocks for vision recipes: per family, preprocess each image (`resin.media`), expand
the template's image placeholder into the model's placeholder tokens, tokenize, and describe
each image as a `MediaItem` (placeholder span, content hash of the preprocessed tensor, the
tensor) in `RenderedPrompt.multimodal`, ready for `Engine.submit(media=...)`.

- Gemma 3: each `<start_of_image>` becomes `\\n\\n<start_of_image>` + `tokens_per_image`
  `<image_soft_token>` + `<end_of_image>\\n\\n` (as Gemma3Processor does); the span attends
  both ways (`bidirectional`).
- Qwen2-VL / Qwen2.5-VL: each `<|image_pad|>` the template wrote (inside
  `<|vision_start|>...<|vision_end|>`) becomes one pad per merged patch of that image.
`vision_for(config, tokenizer)` picks the family from a checkpoint's `config.json`, so only
models with a vision tower take images.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from resin.media.decode import MediaLimits, U8Image, decode_image
from resin.media.gemma3 import gemma3_pixels
from resin.media.pixels import F32Array
from resin.media.qwen2_vl import QwenVisionConfig, qwen_image
from resin.plan import MediaItem
from resin.recipe.protocol import RenderedPrompt
from resin.recipe.types import Image
from resin.tokenizer import Tokenizer


def image_pixels(image: Image, limits: MediaLimits | None = None) -> U8Image:
    """The RGB pixels of an Image block (decoding `data` needs Pillow)."""
    if image.pixels is not None:
        return image.pixels
    if image.data is not None:
        return decode_image(image.data, limits or MediaLimits())
    raise ValueError("an image URL must be fetched by the caller before rendering")


class Vision(Protocol):
    def render(self, tokenizer: Tokenizer, text: str, images: Sequence[Image]) -> RenderedPrompt:
        """The prompt with every image expanded, tokenized, with one MediaItem per image."""
        ...


def _items(
    ids: list[int], token: int, tensors: Sequence[F32Array], lengths: Sequence[int], **extra: Any
) -> tuple[MediaItem, ...]:
    """One item per run of `token` in `ids`, in order (runs must match the images)."""
    flags = np.asarray(ids) == token
    starts = np.flatnonzero(flags & ~np.concatenate(([False], flags[:-1])))
    if len(starts) != len(tensors) or int(flags.sum()) != sum(lengths):
        raise ValueError("the prompt's image placeholders do not match its images")
    return tuple(
        MediaItem(
            0,
            int(start),
            length,
            hashlib.sha256(tensor.tobytes()).hexdigest(),
            tensor,
            **{k: v[i] if isinstance(v, list) else v for k, v in extra.items()},
        )
        for i, (start, tensor, length) in enumerate(zip(starts, tensors, lengths, strict=True))
    )


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

    def render(self, tokenizer: Tokenizer, text: str, images: Sequence[Image]) -> RenderedPrompt:
        tensors = [self.preprocess(image) for image in images]
        text = self.expand_prompt(text, len(images))
        ids = tokenizer.encode(text)
        token = _require(tokenizer, self.image_token)
        lengths = [self.tokens_per_image] * len(tensors)
        return RenderedPrompt(ids, text, _items(ids, token, tensors, lengths, bidirectional=True))


@dataclass(frozen=True)
class QwenVision:
    """Qwen2-VL / Qwen2.5-VL dynamic-resolution images (see module docstring)."""

    config: QwenVisionConfig = field(default_factory=QwenVisionConfig)
    pad: str = "<|image_pad|>"

    def render(self, tokenizer: Tokenizer, text: str, images: Sequence[Image]) -> RenderedPrompt:
        patches = [qwen_image(image_pixels(image), self.config) for image in images]
        pieces = text.split(self.pad)
        if len(pieces) != len(images) + 1:
            raise ValueError(
                f"the template wrote {len(pieces) - 1} image placeholders for {len(images)} images"
            )
        lengths = [p.num_tokens(self.config.merge_size) for p in patches]
        text = pieces[0] + "".join(
            self.pad * n + rest for n, rest in zip(lengths, pieces[1:], strict=True)
        )
        ids = tokenizer.encode(text)
        token = _require(tokenizer, self.pad)
        tensors = [p.pixel_values for p in patches]
        grids = [p.grid_thw for p in patches]
        return RenderedPrompt(ids, text, _items(ids, token, tensors, lengths, grid_thw=grids))


def _require(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"the tokenizer lacks the image token {token!r}")
    return token_id


def vision_for(config: dict[str, Any]) -> Vision | None:
    """The image handling of a checkpoint's `config.json`; None for text-only models."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    model_type = config.get("model_type")
    if model_type == "gemma3":
        return Gemma3Vision(
            size=int(vision.get("image_size", 896)),
            tokens_per_image=int(config.get("mm_tokens_per_image", 256)),
        )
    if model_type in ("qwen2_vl", "qwen2_5_vl"):
        merge = int(vision.get("spatial_merge_size", 2))
        return QwenVision(
            QwenVisionConfig(
                patch_size=int(vision.get("patch_size", 14)),
                temporal_patch_size=int(vision.get("temporal_patch_size", 2)),
                merge_size=merge,
            )
        )
    return None
