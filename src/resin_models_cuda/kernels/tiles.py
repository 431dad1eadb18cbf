"""Launch shapes as data: the GEMV kernels' tiles keyed by (kernel, weight format, N, K, rows)
per GPU, read from `tuned/<gpu>.json` beside this file (written by `resin bench tune-moe
--graph --formats ...`, timed inside CUDA graphs over many layers of distinct weights), with a
heuristic for every shape the file lacks. `rows` is the x rows one weight matrix meets per
step: pairs per token for the expert GEMV (top-k plus shared experts at batch 1), the batch
for a dense GEMV.

File format: `{"gpu": "NVIDIA H200", "tiles": [{"kernel", "format", "n", "k", "rows",
"block_n", "block_k", "num_warps", "num_stages", ...}, ...]}` (other keys, say the measured
`us`, are kept for the reader and ignored here).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, NamedTuple

TUNED_DIR = Path(__file__).with_name("tuned")
KERNELS = ("gate_up", "down", "fp8_gemv")
FORMATS = ("dense", "fp8-block", "fp8-channel", "mxfp4")


class GemvTiles(NamedTuple):
    """Launch shape of one GEMV kernel. `split_k` and `tensor_core` are the dense FP8 GEMV's
    (`fp8_gemm.fp8_gemv`): K split over that many programs adding into a float32 sum, and the
    tensor-core row tile (all rows of x in one program, weights upcast in registers) instead
    of the FMA row-dot; the expert GEMVs ignore them."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int = 1
    split_k: int = 1
    tensor_core: int = 0


OPTIONAL_FIELDS = {"num_stages": 1, "split_k": 1, "tensor_core": 0}


def tiles_from(entry: dict[str, Any]) -> GemvTiles:
    """An entry's launch fields (the optional ones default; a missing required one raises)."""
    values = {**OPTIONAL_FIELDS, **entry}
    return GemvTiles(*(int(values[f]) for f in GemvTiles._fields))


class TileKey(NamedTuple):
    kernel: str
    fmt: str
    n: int
    k: int
    rows: int


# Heuristic defaults: the expert GEMV's from `resin bench tune-moe --graph` on the H200 for
# bf16 experts; the dense FP8 GEMV's streams 16 rows x 512 columns (8 KB of e4m3) per step.
GATE_UP_DEFAULT = GemvTiles(16, 128, 8)
DOWN_DEFAULT = GemvTiles(32, 128, 8)
FP8_GEMV_DEFAULT = GemvTiles(16, 512, 4)
_DEFAULTS = {"gate_up": GATE_UP_DEFAULT, "down": DOWN_DEFAULT, "fp8_gemv": FP8_GEMV_DEFAULT}

_added: dict[TileKey, GemvTiles] = {}  # `add_tiles`: a sweep's results, on any GPU


def gpu_key(name: str) -> str:
    """A device name as a file stem: "NVIDIA H200" -> "h200"."""
    stem = name.lower().removeprefix("nvidia").strip()
    return "-".join(stem.replace("_", " ").split()) or "unknown"


def parse_table(data: dict[str, Any]) -> dict[TileKey, GemvTiles]:
    """A tile file's entries by key; an entry of an unknown kernel or format, or without a
    launch field, is an error naming it."""
    table: dict[TileKey, GemvTiles] = {}
    for i, entry in enumerate(data.get("tiles", [])):
        try:
            key = TileKey(entry["kernel"], entry["format"], int(entry["n"]), int(entry["k"]),
                          int(entry["rows"]))  # fmt: skip
            tiles = tiles_from(entry)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"tile entry {i}: {exc!r} in {entry}") from None
        if key.kernel not in KERNELS or key.fmt not in FORMATS:
            raise ValueError(f"tile entry {i}: unknown kernel or format in {entry}")
        table[key] = tiles
    return table


@functools.cache
def _table(gpu: str) -> dict[TileKey, GemvTiles]:
    path = TUNED_DIR / f"{gpu_key(gpu)}.json"
    if not path.is_file():
        return {}
    return parse_table(json.loads(path.read_text()))


@functools.cache
def current_gpu() -> str:
    """The CUDA device's name ("cpu" without one: the heuristic then)."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def heuristic(kernel: str, fmt: str, n: int, k: int, rows: int) -> GemvTiles:
    """The launch shape for a shape no file has: the kernel's default; the dense GEMV with
    narrower row tiles where a narrow matrix would leave the H200's 132 multiprocessors with
    fewer than two programs each (a GEMV is as fast as the bytes it keeps in flight)."""
    tiles = _DEFAULTS[kernel]
    if kernel == "fp8_gemv":
        while tiles.block_n > 4 and -(-n // tiles.block_n) * rows < 264:
            tiles = tiles._replace(block_n=tiles.block_n // 2)
    return tiles


def gemv_tiles(kernel: str, fmt: str, n: int, k: int, rows: int, gpu: str | None = None) -> (
    GemvTiles
):  # fmt: skip
    """Tiles for this shape: a sweep's (`add_tiles`), the GPU's file's, else `heuristic`."""
    key = TileKey(kernel, fmt, n, k, rows)
    if key in _added:
        return _added[key]
    tuned = _table(gpu or current_gpu()).get(key)
    return tuned if tuned is not None else heuristic(kernel, fmt, n, k, rows)


def add_tiles(table: dict[TileKey, GemvTiles]) -> int:
    """Entries that take precedence over the files (a sweep just run); returns how many."""
    _added.update(table)
    return len(table)
