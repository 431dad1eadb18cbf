"""A recorder of the host reads a fast runner's own code makes (for the tests that prove a
decode step is CUDA-graph safe: it reads nothing from the device on the host)."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Torch calls that read a device tensor on the host (a sync, or a shape that depends on data).
_HOST_READS = frozenset({"item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__index__",
                         "__float__", "nonzero", "argwhere", "masked_select", "unique",
                         "unique_consecutive"})  # fmt: skip
_INDEXING = frozenset({"__getitem__", "__setitem__", "index_put", "index_put_"})


def _has_mask(index: Any) -> bool:
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool and p.dim() for p in parts)


class HostReads(TorchFunctionMode):
    """Records every host read (`_HOST_READS`, indexing by a boolean mask) that the fast
    runner's own code (`resin_models_cuda`) makes while the mode is on. Tensors stay on the
    CPU here, so nothing would block; a call recorded is one that would sync on a GPU or give
    a shape CUDA graphs cannot replay. The Triton interpreter's own torch calls are not the
    runner's and are not recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in _HOST_READS or (name in _INDEXING and len(args) > 1 and _has_mask(args[1])):
            frame = sys._getframe(1)
            while frame.f_back is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            if "resin_models_cuda" in frame.f_code.co_filename:
                self.seen.append(f"{name} at {frame.f_code.co_filename}:{frame.f_lineno}")
        return func(*args, **(kwargs or {}))
