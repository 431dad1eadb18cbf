"""Where a fast model's weights come from: one `WeightSource` interface, three sources.

A model file asks for every tensor by its Hugging Face name and expected shape
(`source.get(name, shape)`), then fuses what it multiplies together (`[q; k; v]`,
`[gate; up]`, stacked experts). The same mapping therefore serves a checkpoint
(`SafetensorsWeights`), a reference model's state dict (`StateDictWeights`: the fast and
reference runners on the very same weights) and random weights of the real shapes
(`RandomWeights`, for benchmarks). Shapes are checked, so a wrong mapping fails loudly.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Mapping
from typing import Protocol

import torch

from resin_model.checkpoint_names import default_names

Init = str  # "normal" | "out" (writes into the residual stream) | "ones" | "zeros"


class WeightSource(Protocol):
    device: torch.device
    dtype: torch.dtype

    def get(
        self,
        name: str,
        shape: tuple[int, ...],
        init: Init = "normal",
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """The tensor `name` as `dtype` (the source's own when None; a float32 router asks
        for float32, so nothing is rounded on the way) on `device`; raises if its shape is
        not `shape`."""
        ...

    def has(self, name: str) -> bool: ...


def _checked(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {tuple(tensor.shape)}, expected {tuple(shape)}")
    return tensor


class StateDictWeights:
    """Tensors from a mapping of Hugging Face names (e.g. a reference model's state dict)."""

    def __init__(
        self, tensors: Mapping[str, torch.Tensor], device: torch.device | str, dtype: torch.dtype
    ) -> None:
        self.tensors, self.device, self.dtype = tensors, torch.device(device), dtype

    def has(self, name: str) -> bool:
        return name in self.tensors

    def get(
        self,
        name: str,
        shape: tuple[int, ...],
        init: Init = "normal",
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        if name not in self.tensors:
            raise KeyError(f"no tensor {name!r}")
        t = _checked(name, self.tensors[name], shape)
        return t.detach().to(device=self.device, dtype=dtype or self.dtype).contiguous()


class SafetensorsWeights:
    """Tensors from the `*.safetensors` shards of a Hugging Face checkpoint folder, under the
    names the models ask for (`checkpoint_names.default_names`: a multimodal checkpoint's
    `model.language_model.*` is `model.*`)."""

    def __init__(self, folder: str, device: torch.device | str, dtype: torch.dtype) -> None:
        from safetensors import safe_open

        self.device, self.dtype = torch.device(device), dtype
        self._index: dict[str, tuple[str, str]] = {}  # name -> (shard, checkpoint name)
        for shard in sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
            with safe_open(shard, framework="pt") as f:
                for raw in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
                    name = default_names(raw)
                    if name is not None:
                        self._index[name] = (shard, raw)
        if not self._index:
            raise FileNotFoundError(f"no *.safetensors in {folder}")

    def has(self, name: str) -> bool:
        return name in self._index

    def get(
        self,
        name: str,
        shape: tuple[int, ...],
        init: Init = "normal",
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self._index:
            raise KeyError(f"checkpoint has no tensor {name!r}")
        shard, raw = self._index[name]
        with safe_open(shard, framework="pt") as f:
            tensor: torch.Tensor = f.get_tensor(raw)
        return _checked(name, tensor, shape).to(device=self.device, dtype=dtype or self.dtype)


class RandomWeights:
    """Random tensors of the asked shapes: normal(0, std); norms at one (or zero); matrices
    that write into the residual stream ("out") scaled by 1/sqrt(2 * layers) when
    `residual_scale` (GPT-2's init: a deep random model stays well conditioned)."""

    def __init__(
        self,
        device: torch.device | str,
        dtype: torch.dtype,
        seed: int = 0,
        std: float = 0.02,
        num_layers: int = 1,
        residual_scale: bool = False,
    ) -> None:
        self.device, self.dtype, self.std = torch.device(device), dtype, std
        self.out_std = std / math.sqrt(2 * num_layers) if residual_scale else std
        self._gen = torch.Generator(device=self.device).manual_seed(seed)

    def has(self, name: str) -> bool:
        return True

    def get(
        self,
        name: str,
        shape: tuple[int, ...],
        init: Init = "normal",
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        if init in ("ones", "zeros"):
            fill = torch.ones if init == "ones" else torch.zeros
            return fill(shape, device=self.device, dtype=dtype or self.dtype)
        std = self.out_std if init == "out" else self.std
        t = torch.randn(shape, generator=self._gen, device=self.device, dtype=torch.float32)
        return (t * std).to(dtype or self.dtype)
