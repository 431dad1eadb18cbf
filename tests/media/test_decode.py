"""Decoding refuses bad images with clear errors before spending memory on them."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from resin.media.decode import MediaError, MediaLimits, decode_image, parse_data_url
from tests.media.images import encode, png_header_only

LIMITS = MediaLimits()


def _png() -> bytes:
    return encode(np.full((20, 30, 3), 200, dtype=np.uint8), "RGB")


def test_data_url_round_trip() -> None:
    url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    pixels = decode_image(parse_data_url(url, LIMITS), LIMITS, "image/png")
    assert pixels.shape == (20, 30, 3) and (pixels == 200).all()


def test_alpha_composites_onto_white() -> None:
    rgba = np.zeros((4, 4, 4), dtype=np.uint8)  # fully transparent black
    assert (decode_image(encode(rgba, "RGBA"), LIMITS) == 255).all()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://example.com/cat.png", "no network"),
        ("data:image/png;base64", "no comma"),
        ("data:image/png,abc", "base64"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=", "SVG"),
        ("data:text/plain;base64,aGk=", "not an image"),
        ("data:image/tiff;base64,aGk=", "not supported"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(MediaError, match=message):
        parse_data_url(url, LIMITS)


def test_truncated_png() -> None:
    data = encode(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8), "RGB")
    with pytest.raises(MediaError, match="cannot decode"):
        decode_image(data[: len(data) // 2], LIMITS)


def test_huge_header_is_refused_before_decoding() -> None:
    bomb = png_header_only(50_000, 50_000)
    assert len(bomb) < 200
    with pytest.raises(MediaError, match=r"50000x50000|too large"):
        decode_image(bomb, LIMITS)
    with pytest.raises(MediaError, match="the limit is 1000 pixels"):
        decode_image(png_header_only(100, 100), MediaLimits(max_pixels=1000))


def test_wrong_mime_svg_garbage_and_sizes() -> None:
    with pytest.raises(MediaError, match="not the declared image/jpeg"):
        decode_image(_png(), LIMITS, "image/jpeg")
    with pytest.raises(MediaError, match="SVG"):
        decode_image(b'<svg xmlns="http://www.w3.org/2000/svg"></svg>', LIMITS)
    with pytest.raises(MediaError, match="not an image of a known type"):
        decode_image(b"definitely not an image", LIMITS)
    with pytest.raises(MediaError, match="limit is 10"):
        decode_image(_png(), MediaLimits(max_bytes=10))
    with pytest.raises(MediaError, match="limit is 2"):
        MediaLimits(max_images=2).check_count(3)
