"""Generated test images as encoded bytes: sizes, aspect ratios, grayscale, alpha, palette."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np


def encode(pixels: np.ndarray, mode: str, fmt: str = "PNG") -> bytes:
    from PIL import Image as PILImage

    buffer = io.BytesIO()
    image = PILImage.fromarray(pixels)
    if image.mode != mode:
        image = image.convert(mode)
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def generated_images() -> list[tuple[str, bytes]]:
    """(name, bytes) pairs covering the cases the processors must agree on."""
    rng = np.random.default_rng(7)
    cases: list[tuple[str, bytes]] = []
    for h, w in [(37, 53), (224, 224), (300, 500), (1000, 640), (12, 900), (2048, 1536)]:
        rgb = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
        cases.append((f"rgb{h}x{w}", encode(rgb, "RGB")))
    gray = rng.integers(0, 256, size=(120, 90), dtype=np.uint8)
    cases.append(("gray", encode(gray, "L")))
    rgba = rng.integers(0, 256, size=(64, 100, 4), dtype=np.uint8)
    cases.append(("alpha", encode(rgba, "RGBA")))
    la = rng.integers(0, 256, size=(50, 70, 2), dtype=np.uint8)
    cases.append(("gray_alpha", encode(la, "LA")))
    smooth = np.linspace(0, 255, 200 * 150 * 3).reshape(150, 200, 3).astype(np.uint8)
    cases.append(("palette", encode(smooth, "P")))
    cases.append(("jpeg", encode(smooth, "RGB", "JPEG")))
    return cases


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height over a tiny, useless body."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
