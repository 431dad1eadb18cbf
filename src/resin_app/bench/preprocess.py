"""Image preprocessing throughput: Resin's `resin.media` vs transformers' Pillow processors.

Both sides start from the same encoded bytes (JPEG and PNG photos-sized images) and end with
the model's input tensor: decode + convert + resize + normalize (+ patching for Qwen2-VL).
Prints images/s per family and side and appends JSONL rows (--output). Run:
resin bench preprocess --output bench/preprocess.jsonl
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from resin.media.decode import MediaLimits, decode_image
from resin.media.gemma3 import gemma3_pixels
from resin.media.qwen2_vl import qwen_image

SIZES = [(480, 640), (768, 1024), (1080, 1920)]


def _images() -> list[bytes]:
    from PIL import Image as PILImage

    out = []
    for h, w in SIZES:
        yy, xx = np.mgrid[0:h, 0:w]
        pixels = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) % 256], axis=-1)
        image = PILImage.fromarray(pixels.astype(np.uint8))
        for fmt in ("JPEG", "PNG"):
            buffer = io.BytesIO()
            image.save(buffer, format=fmt)
            out.append(buffer.getvalue())
    return out


def _rate(work: Callable[[bytes], Any], images: list[bytes], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for data in images:
            work(data)
        done += len(images)
    return done / (time.perf_counter() - start)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="resin bench preprocess")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    from PIL import Image as PILImage
    from transformers import Gemma3ImageProcessorPil, Qwen2VLImageProcessorPil

    limits = MediaLimits()
    gemma_hf = Gemma3ImageProcessorPil(size={"height": 896, "width": 896})
    qwen_hf = Qwen2VLImageProcessorPil()

    def hf(processor: Any) -> Callable[[bytes], Any]:
        return lambda data: processor(images=[PILImage.open(io.BytesIO(data))], return_tensors="np")

    sides: dict[str, dict[str, Callable[[bytes], Any]]] = {
        "gemma3": {
            "resin": lambda data: gemma3_pixels(decode_image(data, limits)),
            "transformers": hf(gemma_hf),
        },
        "qwen2_vl": {
            "resin": lambda data: qwen_image(decode_image(data, limits)),
            "transformers": hf(qwen_hf),
        },
    }
    images = _images()
    rows = []
    for family, pair in sides.items():
        for side, work in pair.items():
            rate = _rate(work, images, args.seconds)
            rows.append({"bench": "preprocess", "family": family, "side": side, "images_s": rate})
            print(f"{family:9s} {side:13s} {rate:8.1f} images/s")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
