"""Images in chat requests: OpenAI `image_url` parts and Anthropic `image` blocks become
`Image` blocks (in content order with the text), with the byte, pixel, type and count checks
of `resin.media.decode` answered as 400s naming the field. Only `data:` URLs and base64
sources are taken (no network fetches). The header is checked here; the pixels are decoded
while rendering, off the event loop (a file truncated past its header is a 400 from there)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from resin.media.decode import (
    MediaError,
    MediaLimits,
    check_mime,
    decode_base64,
    inspect_image,
    parse_data_url,
)
from resin.recipe.types import Block, Image, Message, Text
from resin.server.errors import ApiError

LIMITS = MediaLimits()

_TEXT = ("text", "input_text", "output_text")


def _checked(load: Callable[[], tuple[bytes, str | None]], where: str) -> Image:
    try:
        data, mime = load()
        inspect_image(data, LIMITS, mime)
    except MediaError as exc:
        raise ApiError(400, f"bad image: {exc}", where) from None
    return Image(data=data)


def _extra(part: Any) -> dict[str, Any]:
    return dict(part.model_extra or {})


def openai_image(part: Any, where: str) -> Image:
    spec = _extra(part).get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str):
        raise ApiError(400, "an 'image_url' part needs 'image_url': {'url': ...}", where)
    mime = url[5:].split(";", 1)[0].split(",", 1)[0].strip().lower() or None
    return _checked(lambda: (parse_data_url(url, LIMITS), mime), where)


def anthropic_image(block: Any, where: str) -> Image:
    source = _extra(block).get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        raise ApiError(400, "an 'image' block needs a base64 'source' (no URL fetches)", where)
    mime, data = source.get("media_type"), source.get("data")
    if not isinstance(mime, str) or not isinstance(data, str):
        raise ApiError(400, "an image 'source' needs 'media_type' and 'data' strings", where)

    def load() -> tuple[bytes, str]:
        check_mime(mime.lower())
        return decode_base64(data, LIMITS), mime.lower()

    return _checked(load, where)


def openai_blocks(content: Sequence[Any], where: str) -> list[Block] | None:
    """The blocks of an OpenAI content list with images, in order; None without images."""
    if not any(p.type == "image_url" for p in content):
        return None
    return _blocks(content, where, "image_url", openai_image, _TEXT)


def anthropic_blocks(content: Sequence[Any], where: str) -> list[Block] | None:
    if not any(b.type == "image" for b in content):
        return None
    return _blocks(content, where, "image", anthropic_image, ("text",))


def _blocks(
    content: Sequence[Any],
    where: str,
    kind: str,
    load: Callable[[Any, str], Image],
    text_types: Sequence[str],
) -> list[Block]:
    blocks: list[Block] = []
    for i, part in enumerate(content):
        if part.type == kind:
            blocks.append(load(part, f"{where}.{i}"))
        elif part.type in text_types and isinstance(part.text, str):
            blocks.append(Text(part.text))
        else:
            raise ApiError(400, f"content part type {part.type!r} is not supported here", where)
    return blocks


def check_images(messages: Sequence[Message], supports_images: bool) -> None:
    """A model without a vision tower refuses images; others take at most `max_images`."""
    count = sum(len(m.images) for m in messages)
    if count and not supports_images:
        raise ApiError(400, "this model does not take images (it has no vision tower)", "messages")
    try:
        LIMITS.check_count(count)
    except MediaError as exc:
        raise ApiError(400, str(exc), "messages") from None
