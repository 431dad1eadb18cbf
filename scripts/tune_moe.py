"""Time the fused MoE grouped GEMM over a few tile shapes for real MoE shapes and batch sizes
(random routing), print a table and append JSONL: which tiles `layers/moe.py` should use.

    python scripts/tune_moe.py --output bench/tune_moe.jsonl
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from pathlib import Path
from typing import Any

import torch
from triton.testing import do_bench

from resin_models_cuda.kernels.moe_grouped import align_pairs, grouped_gemm

SHAPES = {"qwen3-30b-a3b": (128, 2048, 768, 8), "gpt-oss-20b": (32, 2880, 2880, 4)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", default="1,8,64,256,4096")
    p.add_argument("--output", type=Path)
    p.add_argument("--gemv", action="store_true", help="sweep the expert GEMV instead")
    args = p.parse_args()
    if args.gemv:
        return tune_gemv(args)
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


def tune_gemv(args: argparse.Namespace) -> None:
    """Expert GEMV tiles (the small-batch path): time gate_up + down per configuration."""
    from resin_models_cuda.kernels.moe_gemv import expert_gemv

    rows: list[dict[str, Any]] = []
    for name, (e, h, inner, k) in SHAPES.items():
        w_up = torch.randn(e, 2 * inner, h, device="cuda", dtype=torch.bfloat16) * 0.02
        w_down = torch.randn(e, h, inner, device="cuda", dtype=torch.bfloat16) * 0.02
        for t in [int(x) for x in args.tokens.split(",")]:
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            ids = torch.randint(0, e, (t * k,), device="cuda", dtype=torch.int32)
            act = torch.randn(t * k, inner, device="cuda", dtype=torch.bfloat16)
            scale = torch.rand(t * k, device="cuda")
            out_up = torch.empty(t * k, 2 * inner, device="cuda", dtype=torch.bfloat16)
            out_dn = torch.zeros(t, h, device="cuda", dtype=torch.float32)
            best: dict[str, Any] | None = None
            for bn, bk, warps in itertools.product((8, 16, 32, 64), (128, 256, 512), (2, 4, 8)):
                kw: dict[str, Any] = dict(block_n=bn, block_k=bk, num_warps=warps)
                up = functools.partial(expert_gemv, x, w_up, ids, out=out_up, row_div=k, **kw)
                down = functools.partial(
                    expert_gemv,
                    act,
                    w_down,
                    ids,
                    out=out_dn,
                    scale=scale,
                    topk=k,
                    **kw,
                )
                ms = do_bench(up, warmup=5, rep=30) + do_bench(down, warmup=5, rep=30)
                gb = len(set(ids.tolist())) * 3 * h * inner * 2 / 1e9
                row = {
                    "model": name,
                    "tokens": t,
                    "kernel": "gemv",
                    "block_n": bn,
                    "block_k": bk,
                    "warps": warps,
                    "ms": ms,
                    "tb_s": gb / ms,
                }
                rows.append(row)
                if best is None or ms < best["ms"]:
                    best = row
            print(json.dumps(best))
            current = [
                r
                for r in rows
                if r["model"] == name
                and r["tokens"] == t
                and (r["block_n"], r["block_k"], r["warps"]) == (16, 256, 4)
            ]
            print("current", json.dumps(current[0]))
    if args.output:
        with args.output.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
