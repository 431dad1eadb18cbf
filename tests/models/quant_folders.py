"""Tiny checkpoint folders for the quantized-format tests: random weights of a tiny config
(peaky, so greedy choices are not near-ties), written as a float32 safetensors checkpoint, and
the same folder through the quantizer (`resin_app.quantize`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from resin_app.quantize import quantize_folder
from resin_models_torch.registry import random_runner


def source_folder(raw: dict[str, Any], folder: Path, seed: int = 0) -> Path:
    """A float32 checkpoint of `raw`'s architecture with peaky random weights."""
    model = random_runner(raw, seed=seed).model
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("e_score_correction_bias"):
                p.normal_(0.0, 0.05)
            elif "norm" not in name:
                p.mul_(8.0)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def quantized_folder(raw: dict[str, Any], root: Path, fmt: str) -> tuple[Path, Path]:
    """(source folder, its `fmt` quantization) under `root`."""
    src = source_folder(raw, root / "src")
    return src, quantize_folder(src, root / fmt, fmt)
