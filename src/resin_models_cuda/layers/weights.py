"""Where a fast model's weights come from: one `WeightSource` interface, three sources.

A model file asks for every tensor by its Hugging Face name and expected shape
(`source.get(name, shape)`), then fuses what it multiplies together (`[q; k; v]`,
`[gate; up]`, stacked experts). The same mapping therefore serves a checkpoint
(`SafetensorsWeights`), a reference model's state dict (`StateDictWeights`: the fast and
reference runners on the very same weights) and random weights of the real shapes
(`RandomWeights`, for benchmarks). Shapes are checked, so a wrong mapping fails loudly.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from resin_model.checkpoint_folder import checked_file, checkpoint_files, shard_names
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
    """Tensors from the `*.safetensors` shards of a Hugging Face checkpoint folder (the files
    `model.safetensors.index.json` maps, when there is one), under the names the models ask
    for (`checkpoint_names.default_names`: a multimodal checkpoint's `model.language_model.*`
    is `model.*`), cast from their stored dtype (bf16, fp16, fp32) to `dtype`. A tensor that
    is missing or of the wrong shape is an error naming it, the shape expected and the file it
    should be in. `progress` shows a bar over the checkpoint's bytes (shard by shard);
    `loaded_bytes` counts what `get` read."""

    def __init__(
        self,
        folder: str,
        device: torch.device | str,
        dtype: torch.dtype,
        progress: bool | None = None,
        names: Callable[[str], str | None] = default_names,
    ) -> None:
        self.device, self.dtype = torch.device(device), dtype
        self.folder = folder
        self._index = _shard_index(folder, names)  # name -> (shard, checkpoint name)
        self._files: dict[str, object] = {}  # open shards, by path
        self.loaded_bytes = 0
        total = sum(os.path.getsize(f) for f in {f for f, _ in self._index.values()})
        from tqdm import tqdm

        hidden = not sys.stderr.isatty() if progress is None else not progress
        self._bar = tqdm(total=total, unit="B", unit_scale=True, disable=hidden)

    def has(self, name: str) -> bool:
        return name in self._index

    def get(
        self,
        name: str,
        shape: tuple[int, ...],
        init: Init = "normal",
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """The tensor as `dtype` (None: the source's), from the file the index names."""
        if name not in self._index:
            raise KeyError(
                f"checkpoint {self.folder} has no tensor {name!r} (expected shape "
                f"{tuple(shape)}, in {self._expected_file()})"
            )
        shard, raw = self._index[name]
        tensor = self._read(shard, raw, shape)
        if tuple(tensor.shape) != tuple(shape):
            raise ValueError(
                f"{name}: shape {tuple(tensor.shape)}, expected {tuple(shape)} "
                f"(in {os.path.basename(shard)})"
            )
        self.loaded_bytes += tensor.numel() * tensor.element_size()
        self._bar.set_description(os.path.basename(shard), refresh=False)
        self._bar.update(tensor.numel() * tensor.element_size())
        return tensor.to(device=self.device, dtype=dtype or self.dtype)

    def close(self) -> None:
        """Close the shards and the bar."""
        self._files.clear()
        self._bar.close()

    def _read(self, shard: str, raw: str, shape: tuple[int, ...]) -> torch.Tensor:
        from safetensors import safe_open

        if shard not in self._files:
            self._files[shard] = safe_open(shard, framework="pt")
        handle = self._files[shard]
        try:
            return handle.get_tensor(raw)  # type: ignore[attr-defined, no-any-return]
        except Exception as exc:  # the index names a tensor its shard lacks
            raise KeyError(
                f"{os.path.basename(shard)} has no tensor {raw!r} (expected shape "
                f"{tuple(shape)}; model.safetensors.index.json puts it there): {exc}"
            ) from None

    def _expected_file(self) -> str:
        shards = sorted({os.path.basename(f) for f, _ in self._index.values()})
        if len(shards) == 1:
            return shards[0]
        return "one of " + ", ".join(shards) + " (model.safetensors.index.json lists none)"


def _shard_index(
    folder: str, names: Callable[[str], str | None] = default_names
) -> dict[str, tuple[str, str]]:
    """Model name -> (shard path, checkpoint name): from `model.safetensors.index.json`'s
    weight map when present, else from the headers of every `*.safetensors` file."""
    from safetensors import safe_open

    index: dict[str, tuple[str, str]] = {}
    # every shard a regular file inside the folder, the index's names checked
    listed = shard_names(folder)
    if any(file is not None for file in listed.values()):
        paths = {file: str(checked_file(folder, file)) for file in set(listed.values()) if file}
        pairs = [(paths[str(file)], raw) for raw, file in listed.items()]
    else:
        pairs = []
        for path in checkpoint_files(folder):
            with safe_open(str(path), framework="pt") as f:
                pairs += [(str(path), raw) for raw in f.keys()]  # noqa: SIM118 - not a Mapping
    for shard, raw in pairs:
        name = names(raw)
        if name is not None:
            index[name] = (shard, raw)
    if not index:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    return index


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

    DRAW_BYTES = 1 << 28
    """The largest float32 draw at once (`get`): bigger tensors are drawn in slabs of rows."""

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
        dtype = dtype or self.dtype
        row = math.prod(shape[1:])
        rows = max(1, self.DRAW_BYTES // (4 * max(row, 1)))
        if not shape or shape[0] <= rows:
            t = torch.randn(shape, generator=self._gen, device=self.device, dtype=torch.float32)
            return t.mul_(std).to(dtype)
        # A large tensor is drawn a slab of leading rows at a time into its own dtype: a fused
        # expert stack drawn whole in float32 (18 GiB for GLM-5.3-Flash's gate_up, twice that
        # with the scaled copy) ran an 80 GB card out of memory while the weights fit.
        out = torch.empty(shape, device=self.device, dtype=dtype)
        for lo in range(0, shape[0], rows):
            hi = min(lo + rows, shape[0])
            slab = torch.randn((hi - lo, *shape[1:]), generator=self._gen, device=self.device,
                               dtype=torch.float32)  # fmt: skip
            out[lo:hi] = slab.mul_(std)
        return out
