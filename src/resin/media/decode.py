"""Turn untrusted image payloads into RGB pixels, with limits checked before any decode.

Accepted: raw bytes of a raster image (PNG, JPEG, WebP, GIF, BMP; the first frame), base64
text, and `data:image/<type>;base64,...` URLs. Nothing is fetched from the network here: an
`http(s)` URL is the caller's business (the server refuses it unless the operator allows it).
The pixel count comes from the header before the pixels are decoded, so a 50k x 50k PNG of a few
kilobytes is refused without allocating gigabytes (a decompression bomb). Transparency is
composited onto white, grayscale and palette images become RGB, as the Hugging Face processors
do. Every refusal is a `MediaError` (a `ValueError`) whose message the server returns as a 400.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

U8Image = np.ndarray[Any, np.dtype[np.uint8]]

_FORMATS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp", "GIF": "gif", "BMP": "bmp"}


class MediaError(ValueError):
    """An image that cannot be used: too big, malformed, or of a refused type."""


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """Bounds on one request's images (defaults suit a public server)."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    max_images: int = 16

    def check_count(self, count: int) -> None:
        if count > self.max_images:
            raise MediaError(f"{count} images in one request; the limit is {self.max_images}")


def content_hash(data: bytes) -> str:
    """The key the prefix cache and the encoder cache use for an image's bytes (hex sha256)."""
    return hashlib.sha256(data).hexdigest()


def parse_data_url(url: str, limits: MediaLimits) -> bytes:
    """The bytes of a `data:image/...;base64,` URL; other URL schemes are refused."""
    if not url.startswith("data:"):
        raise MediaError("only data: URLs with base64 images are accepted (no network fetches)")
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise MediaError("malformed data: URL (no comma)")
    parts = header.split(";")
    mime = parts[0].strip().lower()
    if "base64" not in parts[1:]:
        raise MediaError("data: URLs must be base64-encoded")
    check_mime(mime)
    return decode_base64(payload, limits)


def check_mime(mime: str) -> None:
    if mime == "image/svg+xml":
        raise MediaError("SVG images are not supported; send a raster image (PNG, JPEG, WebP)")
    if not mime.startswith("image/"):
        raise MediaError(f"media type {mime!r} is not an image")
    if mime.removeprefix("image/") not in {*_FORMATS.values(), "jpg"}:
        raise MediaError(f"image type {mime!r} is not supported; use PNG, JPEG, WebP, GIF or BMP")


def decode_base64(payload: str, limits: MediaLimits) -> bytes:
    if len(payload) > limits.max_bytes * 4 // 3 + 4:
        raise MediaError(f"image larger than {limits.max_bytes} bytes")
    try:
        data = base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("image data is not valid base64") from None
    return data


def decode_image(data: bytes, limits: MediaLimits, mime: str | None = None) -> U8Image:
    """HxWx3 uint8 RGB pixels of an encoded image, within `limits`."""
    with _opened(data, limits, mime) as image:
        try:
            image.load()
            return to_rgb(image)
        except (OSError, ValueError, SyntaxError) as exc:
            raise MediaError(f"cannot decode the image: {exc}") from None


def inspect_image(data: bytes, limits: MediaLimits, mime: str | None = None) -> tuple[int, int]:
    """(width, height) from the header alone, after every check `decode_image` makes before
    decoding (cheap enough for a request handler)."""
    with _opened(data, limits, mime) as image:
        width, height = image.size
        return width, height


def _opened(data: bytes, limits: MediaLimits, mime: str | None) -> Any:
    if len(data) > limits.max_bytes:
        raise MediaError(f"image of {len(data)} bytes; the limit is {limits.max_bytes}")
    try:
        from PIL import Image as PILImage
    except ImportError:
        raise MediaError("decoding images needs Pillow (pip install pillow)") from None
    if data.lstrip()[:5] in (b"<?xml", b"<svg ") or b"<svg" in data[:256]:
        raise MediaError("SVG images are not supported; send a raster image (PNG, JPEG, WebP)")
    try:
        image = PILImage.open(io.BytesIO(data), formats=list(_FORMATS))
    except PILImage.DecompressionBombError as exc:
        raise MediaError(f"image too large: {exc}") from None
    except PILImage.UnidentifiedImageError:  # its message names the in-memory file object
        raise MediaError(f"not an image of a known type ({', '.join(_FORMATS)})") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise MediaError(f"cannot decode the image: {exc}") from None
    if mime is not None and _FORMATS[image.format or ""] not in _mime_types(mime):
        image.close()
        raise MediaError(f"the image is {image.format}, not the declared {mime}")
    width, height = image.size
    if width * height > limits.max_pixels:
        image.close()
        raise MediaError(
            f"image of {width}x{height} pixels; the limit is {limits.max_pixels} pixels"
        )
    return image


def _mime_types(mime: str) -> set[str]:
    kind = mime.lower().removeprefix("image/")
    return {"jpeg"} if kind == "jpg" else {kind}


def to_rgb(image: Any) -> U8Image:
    """RGB pixels of a PIL image; transparency composited onto white (as transformers does)."""
    from PIL import Image as PILImage

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = PILImage.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = PILImage.alpha_composite(white, rgba)
    return np.asarray(image.convert("RGB"), dtype=np.uint8)
