"""Sweep the GEMV kernels' tiles for the quantized formats and write them as a tile file
(`resin_models_cuda/kernels/tiles.py`'s format): the dense FP8 decode GEMV on real projection
shapes (per-channel and 128 x 128 blocks) and the expert GEMV in FP8 blocks and MXFP4, each
timed as the model runs it: `LAYERS` layers of distinct weights in one CUDA graph, replayed
(one kernel timed alone in a loop reads L2, not DRAM, and ranks tiles wrongly).

    resin bench tune-gemv --output bench/tune_gemv.jsonl --tiles-json tiles_h200.json

Every timing goes to the JSONL (per layer us and TB/s of weight bytes); the tile file holds
the best tiles per (kernel, format, N, K, rows) and, when `--merge` names an existing file,
that file's other entries.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

LAYERS, REPLAYS = 12, 20
CANDIDATES: list[tuple[int, ...]] = []  # `--candidates`: (block_n, block_k, warps) only
TENSOR_CORE: list[bool] = []  # `--tensor-core`
# (block_n, block_k, warps, stages, split_k) of the tensor-core GEMVs, few enough to sweep in
# a minute: 16-64 weight rows per program, K tiles of 128-512 columns (block FP8 runs them as
# 128-column sub-tiles), the software pipeline 3-4 deep, K split in two (the narrow matrices'
# few programs); the expert row-dot 32-64 rows (a 16-row tile leaves a thread fewer bytes
# than one bf16x2 decode takes) on 1-4 warps (compiled for sm_90, a group's [32 rows, 16
# bytes] tile is copied in 8-byte pieces by one warp, in 4-byte ones by four).
TC_DENSE: list[tuple[int, ...]] = [
    (16, 256, 4, 3, 1), (16, 512, 4, 3, 1), (32, 512, 4, 3, 1), (16, 512, 4, 4, 1),
    (16, 512, 4, 3, 2),
]  # fmt: skip
TC_EXPERTS: list[tuple[int, ...]] = [
    (32, 128, 4, 1, 1), (64, 128, 4, 1, 1), (32, 256, 1, 3, 1), (64, 128, 2, 2, 1),
    (64, 256, 2, 3, 1),
]  # fmt: skip
DENSE_SHAPES = {  # (N, K) of batch-1 projections in FP8
    "llama-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
    "qwen3-30b-a3b": [(5120, 2048), (2048, 4096)],
    "glm-4.5-air": [(14336, 4096), (4096, 12288)],
}
EXPERT_SHAPES = {  # format: (model, experts, hidden, width, pairs per token, bias)
    "mxfp4": [("gpt-oss", 32, 2880, 2880, 4, True)],
    "fp8-block": [("qwen3-30b-a3b", 128, 2048, 768, 8, False),
                  ("glm-4.5-air", 129, 4096, 1408, 9, False)],
}  # fmt: skip


def per_layer_us(fn: Callable[[], object]) -> float:
    """Median of three timings of `REPLAYS` graph replays, per layer (inf: does not run)."""
    try:
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        times = []
        for _ in range(3):
            start.record()
            for _ in range(REPLAYS):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / (REPLAYS * LAYERS))
        return float(sorted(times)[1])
    except Exception as exc:  # a tile that does not compile or fit
        print("failed", type(exc).__name__, str(exc)[:200])
        return float("inf")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resin bench tune-gemv")
    p.add_argument("--output", type=Path, help="append every timing as JSONL")
    p.add_argument("--tiles-json", type=Path, help="write the best tiles as a tile file")
    p.add_argument("--merge", type=Path, help="keep this tile file's other entries")
    p.add_argument("--only", default="mxfp4,fp8-block,dense", help="what to sweep")
    p.add_argument("--budget-s", type=float, default=1e9, help="stop sweeping after this long")
    p.add_argument("--candidates", default="",
                   help="only these tiles, BLOCK_NxBLOCK_KxWARPS comma-separated")  # fmt: skip
    p.add_argument("--models", default=",".join(DENSE_SHAPES), help="dense shapes of these")
    p.add_argument("--tensor-core", action="store_true",
                   help="the tensor-core GEMVs' tiles against the tile file's FMA ones (not the "
                        "FMA sweep), and the dense GEMV at 16 rows")  # fmt: skip
    args = p.parse_args(argv)
    TENSOR_CORE[:] = [True] if args.tensor_core else []
    if args.candidates:
        CANDIDATES[:] = [tuple(int(v) for v in c.split("x")) for c in args.candidates.split(",")]
    rows: list[dict[str, Any]] = []
    best: dict[tuple[str, str, int, int, int], dict[str, Any]] = {}
    deadline = time.monotonic() + args.budget_s

    def record(kernel: str, fmt: str, n: int, k: int, r: int, tiles: Any, us: float,
               gbytes: float, model: str, keep: bool = True) -> None:  # fmt: skip
        """One timing; `keep` False: for the JSONL only (not a tile-file candidate)."""
        row = {"kernel": kernel, "format": fmt, "n": n, "k": k, "rows": r, **tiles._asdict(),
               "us": us, "tb_s": gbytes / us * 1e3 if us else 0.0, "model": model}  # fmt: skip
        rows.append(row)
        key = (kernel, fmt, n, k, r)
        if keep and us < float("inf") and (key not in best or us < best[key]["us"]):
            best[key] = row

    only = args.only.split(",")
    for fmt, shapes in EXPERT_SHAPES.items():
        if fmt in only:
            for shape in shapes:
                if time.monotonic() < deadline:
                    _experts(fmt, *shape, record)
    if "dense" in only:
        for model, dense_shapes in DENSE_SHAPES.items():
            if model not in args.models.split(","):
                continue
            for n, k in dense_shapes:
                for fmt in ("fp8-channel", "fp8-block"):
                    if time.monotonic() < deadline and (model == "llama-8b" or fmt == "fp8-block"):
                        _dense(fmt, n, k, model, record)
    for row in best.values():
        print(json.dumps(row))
    if args.output:
        with args.output.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    if args.tiles_json:
        write_tiles(args.tiles_json, list(best.values()), args.merge)
    return 0


def write_tiles(path: Path, best: list[dict[str, Any]], merge: Path | None) -> None:
    """The best rows as a tile file (the GPU's name from this device), `merge`'s entries for
    other keys kept."""
    keys = ("kernel", "format", "n", "k", "rows")
    entries = {tuple(r[k] for k in keys): r for r in best}
    if merge is not None and merge.is_file():
        for old in json.loads(merge.read_text()).get("tiles", []):
            entries.setdefault(tuple(old[k] for k in keys), old)
    tiles = sorted(entries.values(), key=lambda r: tuple(str(r[k]) for k in keys))
    source = "resin bench tune-gemv (12 layers of distinct weights in one CUDA graph)"
    data = {"gpu": torch.cuda.get_device_name(), "source": source, "tiles": tiles}
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {len(entries)} tiles to {path}")


def _chosen(candidates: list[Any], key: tuple[str, str, int, int, int] | None = None,
            tensor_core: Sequence[tuple[int, ...]] | None = None) -> list[Any]:  # fmt: skip
    """`candidates`, or the `--candidates` tiles instead; with `--tensor-core`, the tile
    file's current tiles for `key` and the tensor-core ones instead."""
    from resin_models_cuda.kernels.tiles import GemvTiles, gemv_tiles

    if TENSOR_CORE and key is not None and tensor_core is not None:
        tc = [GemvTiles(bn, bk, w, st, sk, 1) for bn, bk, w, st, sk in tensor_core]
        return [gemv_tiles(*key), *tc]
    if not CANDIDATES:
        return candidates
    return [GemvTiles(*c) for c in CANDIDATES]


def _experts(fmt: str, model: str, e: int, h: int, inner: int, k: int, bias: bool,
             record: Callable[..., None]) -> None:  # fmt: skip
    from resin_model.quant import quantize_fp8, quantize_mxfp4
    from resin_models_cuda.kernels.activation import Activation
    from resin_models_cuda.kernels.moe_fp8 import Fp8Experts, fp8_expert_down, fp8_expert_gate_up
    from resin_models_cuda.kernels.moe_mxfp4 import (
        Mxfp4Experts,
        mxfp4_expert_down,
        mxfp4_expert_gate_up,
    )
    from resin_models_cuda.kernels.tiles import GemvTiles

    def make(n: int, kk: int) -> Any:
        parts = []
        for _ in range(e):
            w = torch.randn(n, kk, device="cuda") * 0.02
            parts.append(quantize_mxfp4(w) if fmt == "mxfp4" else quantize_fp8(w, (128, 128)))
        a, b = (torch.stack(list(t)).contiguous() for t in zip(*parts, strict=True))
        return Mxfp4Experts(a, b) if fmt == "mxfp4" else Fp8Experts(a, b, (128, 128))

    bf = torch.bfloat16
    w_up = [make(2 * inner, h) for _ in range(LAYERS)]
    w_dn = [make(h, inner) for _ in range(LAYERS)]
    b_up = torch.randn(e, 2 * inner, device="cuda", dtype=bf) if bias else None
    b_dn = torch.randn(e, h, device="cuda", dtype=bf) if bias else None
    act_kind: Activation = "swiglu_clamp" if bias else "silu"
    x = torch.randn(1, h, device="cuda", dtype=bf)
    ids = [torch.randperm(e, device="cuda")[:k].to(torch.int32) for _ in range(LAYERS)]
    act = torch.randn(k, inner, device="cuda", dtype=bf)
    scale = torch.rand(k, device="cuda")
    gate_up = mxfp4_expert_gate_up if fmt == "mxfp4" else fp8_expert_gate_up
    down = mxfp4_expert_down if fmt == "mxfp4" else fp8_expert_down
    per_byte = 17 / 32 if fmt == "mxfp4" else 1.0
    ks = (128, 256, 512)
    candidates = [GemvTiles(bn, bk, w) for bn in (4, 8, 16, 32) for bk in ks for w in (4, 8)
                  if bn * bk <= 8192]  # fmt: skip
    chosen = _chosen(candidates, ("gate_up", fmt, 2 * inner, h, k), TC_EXPERTS)
    if TENSOR_CORE:  # the file's down tile too (each candidate is timed on both kernels)
        chosen.insert(1, _chosen(candidates, ("down", fmt, h, inner, k), [])[0])
    for tiles in chosen:

        def up_layers(tiles: Any = tiles) -> None:
            for w, i in zip(w_up, ids, strict=True):
                gate_up(x, w, i, act=act_kind, bias=b_up, row_div=k, tiles=tiles)

        def down_layers(tiles: Any = tiles) -> None:
            for w, i in zip(w_dn, ids, strict=True):
                down(act, w, i, scale, k, bias=b_dn, tiles=tiles)

        gb = k * 2 * inner * h * per_byte / 1e9
        record("gate_up", fmt, 2 * inner, h, k, tiles, per_layer_us(up_layers), gb, model)
        record("down", fmt, h, inner, k, tiles, per_layer_us(down_layers), gb / 2, model)


def _dense(fmt: str, n: int, k: int, model: str, record: Callable[..., None]) -> None:
    from resin_model.quant import quantize_fp8
    from resin_models_cuda.kernels.fp8_gemm import fp8_gemv
    from resin_models_cuda.kernels.tiles import GemvTiles

    block = (128, 128) if fmt == "fp8-block" else (1, k)
    ws = [quantize_fp8(torch.randn(n, k, device="cuda") * 0.02, block) for _ in range(LAYERS)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    candidates = [GemvTiles(bn, bk, w) for bn in (4, 8, 16, 32) for bk in (256, 512, 1024)
                  for w in (4, 8) if bn * bk <= 16384]  # fmt: skip
    best_tc: tuple[float, Any] = (float("inf"), None)
    for tiles in _chosen(candidates, ("fp8_gemv", fmt, n, k, 1), TC_DENSE):

        def layers(tiles: Any = tiles) -> None:
            for w, s in ws:
                fp8_gemv(x, w, s, block, tiles=tiles)

        us = per_layer_us(layers)
        record("fp8_gemv", fmt, n, k, 1, tiles, us, n * k / 1e9, model)
        if tiles.tensor_core and us < best_tc[0]:
            best_tc = (us, tiles)

    def cublas_bf16(x: torch.Tensor = x) -> None:  # the bf16 GEMV of the shape (twice the bytes)
        for w in dense:
            torch.nn.functional.linear(x, w)

    dense = [w.to(torch.bfloat16) for w, _ in ws]
    us = per_layer_us(cublas_bf16)
    print(json.dumps({"cublas_bf16": [n, k], "us": us, "tb_s": 2 * n * k / us / 1e6}))
    record("cublas_bf16", "dense", n, k, 1, GemvTiles(0, 0, 0), us, 2 * n * k / 1e9, model,
           keep=False)  # fmt: skip
    if TENSOR_CORE and best_tc[1] is not None:
        _sixteen_rows(fmt, n, k, model, ws, block, dense, best_tc[1], record)


def _sixteen_rows(fmt: str, n: int, k: int, model: str, ws: list[Any], block: tuple[int, int],
                  dense: list[torch.Tensor], tc: Any,
                  record: Callable[..., None]) -> None:  # fmt: skip
    """16 rows (a batch of 16 decoding): the tensor-core GEMV against the tile GEMM that
    took them before and cuBLAS bf16 (JSONL rows only)."""
    from resin_models_cuda.kernels.fp8_gemm import fp8_gemm, fp8_gemv
    from resin_models_cuda.kernels.tiles import GemvTiles
    from resin_models_cuda.layers.quantized import DECODE_TILES

    x16 = torch.randn(16, k, device="cuda", dtype=torch.bfloat16)
    tiles = DECODE_TILES if block[1] >= k or block[1] % DECODE_TILES.block_k == 0 else (
        DECODE_TILES._replace(block_k=block[1]))  # fmt: skip

    def tc_layers() -> None:
        for w, s in ws:
            fp8_gemv(x16, w, s, block, tiles=tc)

    def gemm_layers() -> None:
        for w, s in ws:
            fp8_gemm(x16, w, s, block, tiles=tiles)

    def cublas() -> None:
        for w in dense:
            torch.nn.functional.linear(x16, w)

    gb = n * k / 1e9
    record("fp8_gemv", fmt, n, k, 16, tc, per_layer_us(tc_layers), gb, model, keep=False)
    zero = GemvTiles(0, 0, 0)
    record("fp8_gemm", fmt, n, k, 16, zero, per_layer_us(gemm_layers), gb, model, keep=False)
    record("cublas_bf16", "dense", n, k, 16, zero, per_layer_us(cublas), 2 * gb, model,
           keep=False)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
