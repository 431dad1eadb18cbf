"""Load safetensors checkpoints (single file or sharded through model.safetensors.index.json)
into a reference model whose parameters carry Hugging Face names. FP8 / MXFP4 checkpoints are
dequantized at load (`resin_model.quant_checkpoint`), exactly: the reference runner is the
parity oracle of every stored format.

The name mapping is one function: a checkpoint name -> the model's name, or None to skip it
(e.g. rotary buffers some exporters save). Loading is strict otherwise: a missing or unexpected
tensor, or a shape mismatch, raises with the offending names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from resin_model.checkpoint_names import default_names
from resin_model.quant_checkpoint import dequantized
from resin_model.quant_config import QuantConfig

NameMap = Callable[[str], str | None]
Splitter = Callable[[str, torch.Tensor], list[tuple[str, torch.Tensor]]]
"""A checkpoint tensor -> the tensors it holds, under checkpoint names (fused layouts)."""


def checkpoint_files(folder: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint folder (sharded via its index when present), each
    a regular file inside the folder (`resin_model.checkpoint_folder`)."""
    from resin_model.checkpoint_folder import checkpoint_files as checked_files

    return checked_files(folder)


def iter_tensors(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, f.get_tensor(name)


def load_weights(
    model: nn.Module,
    folder: str | Path,
    names: NameMap = default_names,
    quant: QuantConfig | None = None,
    split: Splitter | None = None,
    optional: Callable[[set[str]], set[str]] | None = None,
) -> None:
    """Copy every checkpoint tensor into `model` (cast to each parameter's dtype/device);
    a quantized checkpoint's weights (`quant`) are dequantized exactly first; `split` unpacks
    a fused tensor into the ones the model holds (before `names` maps them); `optional` gets
    the missing parameter names and returns those that are an error (the model may drop
    optional parts a checkpoint lacks, e.g. DeepSeek-V4's MTP layer)."""
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    unexpected: list[str] = []
    tensors = iter_tensors(folder)
    with torch.no_grad():
        stored = tensors if quant is None else dequantized(tensors, quant)
        pieces = stored if split is None else (p for n, t in stored for p in split(n, t))
        for raw_name, tensor in pieces:
            name = names(raw_name)
            if name is None:
                continue
            param = params.get(name)
            if param is None:
                unexpected.append(raw_name)
                continue
            if tuple(param.shape) != tuple(tensor.shape):
                raise ValueError(f"{raw_name}: shape {tuple(tensor.shape)} != {tuple(param.shape)}")
            param.copy_(tensor.to(dtype=param.dtype))
            loaded.add(name)
    missing_names = set(params) - loaded
    missing = sorted(optional(missing_names) if optional is not None else missing_names)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {folder} does not match the model: missing {missing[:8]}"
            f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
        )
