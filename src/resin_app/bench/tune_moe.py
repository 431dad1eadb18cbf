"""Time the MoE kernels over tile shapes for real MoE shapes, print the best and append JSONL:
which tiles `layers/moe.py` should use.

    resin bench tune-moe --output bench/tune_moe.jsonl   # grouped GEMM, random routing
    resin bench tune-moe --graph --output bench/tiles.jsonl   # expert GEMV (batch 1)
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from triton.testing import do_bench

from resin_models_cuda.kernels.moe_grouped import align_pairs, grouped_gemm

SHAPES = {"qwen3-30b-a3b": (128, 2048, 768, 8), "gpt-oss-20b": (32, 2880, 2880, 4)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resin bench tune-moe")
    p.add_argument("--tokens", default="1,8,64,256,4096", help="token counts (grouped GEMM)")
    p.add_argument("--output", type=Path)
    p.add_argument("--graph", action="store_true",
                   help="expert + batch-1 dense GEMV tiles in CUDA graphs")  # fmt: skip
    args = p.parse_args(argv)
    if args.graph:
        tune_graph(args)
        return 0
    rows: list[dict[str, Any]] = []
    for name, (e, h, inner, k) in SHAPES.items():
        w_up = torch.randn(e, 2 * inner, h, device="cuda", dtype=torch.bfloat16) * 0.02
        w_down = torch.randn(e, h, inner, device="cuda", dtype=torch.bfloat16) * 0.02
        for t in [int(x) for x in args.tokens.split(",")]:
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            ids = torch.randint(0, e, (t * k,), device="cuda")
            act = torch.randn(t * k, inner, device="cuda", dtype=torch.bfloat16)
            touched = int(torch.unique(ids).numel())
            for bm, bn, bk, warps, stages in itertools.product(
                (16, 64) if t * k > 256 else (16,), (32, 64, 128), (64, 128), (4, 8), (3, 4)
            ):
                if bm == 64 and t * k <= 1024:
                    continue
                a = align_pairs(ids, e, bm)
                out_up = torch.empty(t * k, 2 * inner, device="cuda", dtype=torch.bfloat16)
                out_dn = torch.empty(t * k, h, device="cuda", dtype=torch.float32)
                kw: dict[str, Any] = dict(
                    block_n=bn, block_k=bk, num_warps=warps, num_stages=stages
                )

                up = functools.partial(
                    grouped_gemm, x, w_up, a, num_pairs=t * k, row_div=k, out=out_up, **kw
                )
                down = functools.partial(
                    grouped_gemm, act, w_down, a, num_pairs=t * k, row_div=1, out=out_dn, **kw
                )

                try:
                    ms_up, ms_dn = do_bench(up, warmup=5, rep=30), do_bench(down, warmup=5, rep=30)
                except Exception as exc:  # out of shared memory for a tile shape
                    print(name, t, bm, bn, bk, warps, stages, "failed", type(exc).__name__)
                    continue
                gb = touched * 3 * h * inner * 2 / 1e9
                row = {
                    "model": name,
                    "tokens": t,
                    "block_m": bm,
                    "block_n": bn,
                    "block_k": bk,
                    "warps": warps,
                    "stages": stages,
                    "up_ms": ms_up,
                    "down_ms": ms_dn,
                    "tb_s": gb / (ms_up + ms_dn),
                }
                rows.append(row)
        best: dict[tuple[str, int], dict[str, Any]] = {}
        for r in rows:
            key = (r["model"], r["tokens"])
            if r["model"] == name and (key not in best or r["tb_s"] > best[key]["tb_s"]):
                best[key] = r
        for r in best.values():
            print(json.dumps(r))
    if args.output:
        with args.output.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


GEMV_SHAPES = {  # experts (routed + shared), hidden, expert width, pairs per token, bias
    "qwen3-30b-a3b": (128, 2048, 768, 8, False),
    "gpt-oss-20b": (32, 2880, 2880, 4, True),
    "deepseek-v2-lite": (66, 2048, 1408, 8, False),
    "glm-4.5-air": (129, 4096, 1408, 9, False),
}
DENSE_SHAPES = {  # (N, K) of batch-1 projections: qkv, o, and the dense MLP where there is one
    "qwen3-30b-a3b": [(5120, 2048), (2048, 4096)],
    "gpt-oss-20b": [(5120, 2880), (2880, 4096)],
    "deepseek-v2-lite": [(3648, 2048), (2048, 2048)],
    "glm-4.5-air": [(14336, 4096), (4096, 12288)],
    "llama-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
}


def tune_graph(args: argparse.Namespace) -> None:
    """Expert GEMV and batch-1 dense tiles timed as the model runs them: `LAYERS` layers of
    distinct weights (so each reads DRAM, not L2) captured in one CUDA graph, replayed; per
    layer us (`down` with its zero fill and cast). Timing kernels one at a time (`do_bench`)
    ranked the tiles differently and picked slower ones for the model. Writes every row, and a
    `best` row per (kernel, shape) for `resin bench runner --gemv-tiles` / the tile file
    `kernels/tuned/h200.json`; a dense shape gets one only where the GEMV beats cuBLAS by 3%."""
    from resin_models_cuda.kernels.moe_gemv import GemvTiles, expert_down, expert_gate_up

    def dense_gemv(x: torch.Tensor, w: torch.Tensor, tiles: GemvTiles) -> torch.Tensor:
        one = torch.zeros(1, dtype=torch.int32, device=x.device)
        return expert_down(x, w[None], one, torch.ones(1, device=x.device), 1, tiles=tiles)

    layers, replays = 12, 20
    rows: list[dict[str, Any]] = []

    def per_layer_us(fn: Any) -> float:
        try:
            return _per_layer_us(fn)
        except Exception as exc:  # a tile that does not compile or fit
            print("failed", fn, type(exc).__name__, str(exc)[:300])
            return float("inf")

    def _per_layer_us(fn: Any) -> float:
        fn()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        times = []
        for _ in range(3):
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / (replays * layers))
        return float(sorted(times)[1])

    def emit(kernel: str, model: str, n: int, k: int, per_token: int, results: list[Any]) -> None:
        results.sort(key=lambda r: r[1])
        for tiles, us in results:
            rows.append({"model": model, "kernel": kernel, "n": n, "k": k, "per_token": per_token,
                         **({} if tiles is None else tiles._asdict()), "us": us,
                         "impl": "cublas" if tiles is None else "triton"})  # fmt: skip
        best_tiles, best_us = results[0]
        cublas = [us for t, us in results if t is None]
        if best_tiles is not None and (not cublas or best_us < 0.97 * cublas[0]):
            rows.append({"model": model, "kernel": kernel, "n": n, "k": k,
                         "per_token": per_token, **best_tiles._asdict(), "us": best_us,
                         "best": True, "cublas_us": cublas[0] if cublas else None})  # fmt: skip
        print(json.dumps(rows[-1]))

    tiles = [GemvTiles(bn, bk, 8) for bn in (4, 8, 16, 32) for bk in (128, 256, 512)
             if bn * bk <= 4096]  # fmt: skip

    def up_layers(x, ws, ids, *, tiles, **kw) -> None:  # type: ignore[no-untyped-def]
        for w, i in zip(ws, ids, strict=True):
            expert_gate_up(x, w, i, tiles=tiles, **kw)

    def down_layers(act, ws, ids, scale, k, tiles, **kw) -> None:  # type: ignore[no-untyped-def]
        for w, i in zip(ws, ids, strict=True):
            expert_down(act, w, i, scale, k, tiles=tiles, **kw)

    def dense_layers(x, ws, tiles) -> None:  # type: ignore[no-untyped-def]
        for w in ws:
            if tiles is None:
                torch.nn.functional.linear(x, w)
            else:
                dense_gemv(x, w, tiles)

    bf = torch.bfloat16
    for name, (e, h, inner, k, bias) in GEMV_SHAPES.items():
        w_up = [torch.randn(e, 2 * inner, h, device="cuda", dtype=bf) * 0.02 for _ in range(layers)]
        w_dn = [torch.randn(e, h, inner, device="cuda", dtype=bf) * 0.02 for _ in range(layers)]
        b_up = torch.randn(e, 2 * inner, device="cuda", dtype=bf) if bias else None
        b_dn = torch.randn(e, h, device="cuda", dtype=bf) if bias else None
        kind = "swiglu_clamp" if bias else "silu"
        x = torch.randn(1, h, device="cuda", dtype=bf)
        ids = [torch.randperm(e, device="cuda")[:k].to(torch.int32) for _ in range(layers)]
        act = torch.randn(k, inner, device="cuda", dtype=bf)
        scale = torch.rand(k, device="cuda")
        run = functools.partial(up_layers, x, w_up, ids, act=kind, bias=b_up, row_div=k)
        up = [(t, per_layer_us(functools.partial(run, tiles=t))) for t in tiles]
        emit("gate_up", name, 2 * inner, h, k, up)
        down = [(t, per_layer_us(functools.partial(down_layers, act, w_dn, ids, scale, k, t,
                                                   bias=b_dn))) for t in tiles]  # fmt: skip
        emit("down", name, h, inner, k, down)
        del w_up, w_dn
    dense_tiles = [t for t in tiles if t.block_n <= 8]
    for name, shapes in DENSE_SHAPES.items():
        for n, kk in shapes:
            ws = [torch.randn(n, kk, device="cuda", dtype=bf) * 0.02 for _ in range(layers)]
            x = torch.randn(1, kk, device="cuda", dtype=bf)
            dense = [(t, per_layer_us(functools.partial(dense_layers, x, ws, t)))
                     for t in [None, *dense_tiles]]  # fmt: skip
            emit("dense", name, n, kk, 1, dense)
            del ws
    if args.output:
        with args.output.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    sys.exit(main())
