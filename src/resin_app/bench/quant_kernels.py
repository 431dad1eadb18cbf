"""Quantized-weight kernels against their bf16 counterparts on one GPU, timed the way the model
runs them (`resin bench tune-moe --graph`): `L` layers of distinct weights captured in one CUDA
graph and replayed, so every layer reads its weights from DRAM and launch gaps count; per
layer microseconds are the median of 5 timed rounds of 10 replays (compile and capture
excluded). A few tile shapes per kernel; prints the best of each (format, implementation)
beside bf16 and writes every row as JSONL.

    resin bench quant-kernels --output bench/quant_kernels.jsonl

Cases: Llama-3.1-8B's dense projections (qkv, o, gate_up, down) at 1, 64 and 4,096 tokens
(bf16 cuBLAS; FP8 per-channel: weight-only Triton GEMM / GEMV, w8a8 per token through the
Triton GEMM or cuBLASLt `torch._scaled_mm`; FP8 128x128 blocks: weight-only, w8a8 pre-quantized
per group, w8a8 with the activation quantization fused into the GEMM); Qwen3-30B-A3B's experts
in block FP8 and gpt-oss-120b's in MXFP4 at batch 1 (expert GEMV and grouped GEMM) and 64
(grouped GEMM), uniform random routing, each token's experts distinct; MXFP4 through
`tl.dot_scaled` with fast math (the default), without it (`_exact`) and dequantized in
registers (`_regs`). Weights are random of the real shapes (speed only). `bytes` is the least
traffic (weights of the touched experts and their scales, activations in, outputs out);
`frac` is TB/s over `--copy-tbs` (the H200's measured copy bandwidth). About 110 s on an H200.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from resin_models_cuda.kernels.fp8_gemm import GemmTiles, fp8_gemm, scaled_mm_fp8
from resin_models_cuda.kernels.fp8_quant import quantize_fp8_rows
from resin_models_cuda.kernels.moe_fp8 import (
    Fp8Experts,
    fp8_expert_down,
    fp8_expert_gate_up,
    fp8_grouped_gemm,
)
from resin_models_cuda.kernels.moe_gemv import GemvTiles, expert_down, expert_gate_up, tiles_for
from resin_models_cuda.kernels.moe_grouped import AlignedPairs, align_pairs, grouped_gemm
from resin_models_cuda.kernels.moe_mxfp4 import (
    Mxfp4Experts,
    mxfp4_expert_down,
    mxfp4_expert_gate_up,
    mxfp4_grouped_gemm,
)

BF = torch.bfloat16
FP8 = torch.float8_e4m3fn
LLAMA = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


@dataclass(frozen=True)
class MoeCase:
    experts: int
    hidden: int
    inner: int
    top_k: int
    fmt: str  # "fp8_block" | "mxfp4"
    act: str
    bias: bool
    layers: int


MOE = {
    "qwen3-30b-a3b": MoeCase(128, 2048, 768, 8, "fp8_block", "silu", False, 6),
    "gpt-oss-120b": MoeCase(128, 2880, 2880, 4, "mxfp4", "swiglu_clamp", True, 3),
}


@dataclass
class Row:
    case: str
    kernel: str
    tokens: int
    fmt: str
    impl: str
    tiles: str
    us: float
    bytes: float
    flops: float

    @property
    def tbs(self) -> float:
        return self.bytes / (self.us * 1e-6) / 1e12


class Bench:
    """Times lists of per-layer calls in one CUDA graph; collects rows."""

    def __init__(self, replays: int = 10, rounds: int = 5) -> None:
        self.replays, self.rounds = replays, rounds
        self.rows: list[Row] = []

    def time(self, layer_fns: list[Callable[[], Any]]) -> float:
        """Per-layer microseconds, or inf when a tile does not compile or fit."""
        try:
            for fn in layer_fns:  # compile and warm outside the capture
                fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for fn in layer_fns:
                    fn()
            graph.replay()
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            times = []
            for _ in range(self.rounds):
                start.record()
                for _ in range(self.replays):
                    graph.replay()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3 / (self.replays * len(layer_fns)))
            return float(sorted(times)[len(times) // 2])
        except Exception as exc:  # a tile shape out of shared memory or registers
            print("  failed:", type(exc).__name__, str(exc).splitlines()[0][:200])
            torch.cuda.synchronize()
            return math.inf

    def add(self, row: Row) -> None:
        self.rows.append(row)


def _rand_fp8(*shape: int) -> torch.Tensor:
    return (torch.randn(*shape, device="cuda", dtype=BF) * 0.05).to(FP8)


@dataclass(frozen=True)
class Variant:
    """One implementation at one launch shape: `layer(i)` runs layer i's matmul."""

    fmt: str
    impl: str
    tiles: str
    layer: Callable[[int], Any]


def measure(
    b: Bench, case: str, kernel: str, tokens: int, layers: int, variants: list[Variant],
    bytes_of: Callable[[str], float], flops: float,
) -> None:  # fmt: skip
    for v in variants:
        us = b.time([partial(v.layer, i) for i in range(layers)])
        b.add(Row(case, kernel, tokens, v.fmt, v.impl, v.tiles, us, bytes_of(v.fmt), flops))


# ---------------------------------------------------------------------------------------------
# Dense: Llama-3.1-8B projections


@dataclass(frozen=True)
class DenseWeights:
    """Per layer: bf16 [N, K], e4m3 [N, K], per-channel scales [N, 1], 128 x 128 block
    scales (the same e4m3 values read under either scheme: speed only)."""

    bf: list[torch.Tensor]
    q: list[torch.Tensor]
    channel: list[torch.Tensor]
    block: list[torch.Tensor]

    @staticmethod
    def random(n: int, k: int, layers: int) -> DenseWeights:
        return DenseWeights(
            [torch.randn(n, k, device="cuda", dtype=BF) * 0.02 for _ in range(layers)],
            [_rand_fp8(n, k) for _ in range(layers)],
            [torch.rand(n, 1, device="cuda") * 1e-2 for _ in range(layers)],
            [torch.rand(n // 128, k // 128, device="cuda") * 1e-2 for _ in range(layers)],
        )


def _linear(x: torch.Tensor, w: DenseWeights, i: int) -> torch.Tensor:
    return F.linear(x, w.bf[i])


def _scaled_mm(x: torch.Tensor, w: DenseWeights, i: int) -> torch.Tensor:
    return scaled_mm_fp8(x, w.q[i], w.channel[i])


def _w8a16(x: torch.Tensor, w: DenseWeights, scheme: str, t: GemmTiles, i: int) -> torch.Tensor:
    if scheme == "fp8_channel":
        return fp8_gemm(x, w.q[i], w.channel[i], (1, x.shape[1]), tiles=t)
    return fp8_gemm(x, w.q[i], w.block[i], (128, 128), tiles=t)


def _w8a8_token(x: torch.Tensor, w: DenseWeights, t: GemmTiles, i: int) -> torch.Tensor:
    x_q, x_s = quantize_fp8_rows(x)
    return fp8_gemm(x_q, w.q[i], w.channel[i], (1, x.shape[1]), x_scale=x_s, tiles=t)


def _w8a8_group(x: torch.Tensor, w: DenseWeights, t: GemmTiles, i: int) -> torch.Tensor:
    x_q, x_s = quantize_fp8_rows(x, 128)
    return fp8_gemm(x_q, w.q[i], w.block[i], (128, 128), x_scale=x_s, x_group=128, tiles=t)


def _w8a8_fused(x: torch.Tensor, w: DenseWeights, t: GemmTiles, i: int) -> torch.Tensor:
    return fp8_gemm(x, w.q[i], w.block[i], (128, 128), quantize_group=128, tiles=t)


def _dense_gemv(
    x: torch.Tensor, w: DenseWeights, scheme: str, t: GemvTiles, i: int
) -> torch.Tensor:
    channel = scheme == "fp8_channel"
    scale, block = (w.channel[i], (1, x.shape[1])) if channel else (w.block[i], (128, 128))
    one = torch.zeros(1, dtype=torch.int32, device=x.device)
    unit = torch.ones(1, device=x.device)
    return fp8_expert_down(x, Fp8Experts(w.q[i][None], scale[None], block), one, unit, 1, tiles=t)


def _gemm_tiles(m: int) -> list[GemmTiles]:
    if m <= 64:
        small = [GemmTiles(16, 64, 128, 8, 4, 4), GemmTiles(16, 32, 128, 8, 4, 4),
                 GemmTiles(16, 64, 128, 8, 4, 4, 4), GemmTiles(16, 32, 128, 8, 4, 4, 2),
                 GemmTiles(64, 64, 128, 8, 4, 4)]  # fmt: skip
        return small[:4] if m == 1 else small
    return [GemmTiles(128, 128, 128, 8, 8, 3), GemmTiles(128, 256, 128, 8, 8, 3),
            GemmTiles(64, 128, 128, 8, 4, 4)]  # fmt: skip


def dense_variants(x: torch.Tensor, w: DenseWeights) -> list[Variant]:
    m = x.shape[0]
    out = [Variant("bf16", "cublas", "-", partial(_linear, x, w)),
           Variant("fp8_channel", "scaled_mm_w8a8", "-", partial(_scaled_mm, x, w))]  # fmt: skip
    for t in _gemm_tiles(m):
        name = "x".join(map(str, t[:3])) + f"/g{t.group_m}w{t.num_warps}s{t.num_stages}"
        name += f"k{t.split_k}" if t.split_k > 1 else ""
        if m <= 64:
            for scheme in ("fp8_channel", "fp8_block"):
                out.append(Variant(scheme, "triton_w8a16", name, partial(_w8a16, x, w, scheme, t)))
        if m >= 64:
            out.append(Variant("fp8_channel", "triton_w8a8_token", name,
                               partial(_w8a8_token, x, w, t)))  # fmt: skip
            if t.split_k == 1:
                out.append(Variant("fp8_block", "triton_w8a8_group", name,
                                   partial(_w8a8_group, x, w, t)))  # fmt: skip
                out.append(Variant("fp8_block", "triton_w8a8_fused", name,
                                   partial(_w8a8_fused, x, w, t)))  # fmt: skip
    if m == 1:
        for bn, warps in ((4, 4), (16, 8), (32, 8)):
            for scheme, bk in (("fp8_channel", 512), ("fp8_block", 128)):
                gemv = GemvTiles(bn, bk, warps)
                out.append(Variant(scheme, "triton_gemv", f"{bn}x{bk}/w{warps}",
                                   partial(_dense_gemv, x, w, scheme, gemv)))  # fmt: skip
    return out


def bench_dense(b: Bench, tokens_list: list[int]) -> None:
    for name, (n, k) in LLAMA.items():
        layers = max(2, min(16, math.ceil(1.0e9 / (n * k * 2))))
        w = DenseWeights.random(n, k, layers)
        for m in tokens_list:
            x = torch.randn(m, k, device="cuda", dtype=BF)
            io = 2 * (m * k + m * n)

            def bytes_of(fmt: str, n: int = n, k: int = k, io: int = io) -> float:
                if fmt == "bf16":
                    return 2 * n * k + io
                scales = n if fmt == "fp8_channel" else (n // 128) * (k // 128)
                return n * k + 4 * scales + io

            measure(b, f"llama-8b {name}", "dense", m, layers, dense_variants(x, w), bytes_of,
                    2.0 * m * n * k)  # fmt: skip
        del w
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# MoE experts: Qwen3-30B-A3B (block FP8), gpt-oss-120b (MXFP4)


@dataclass(frozen=True)
class Experts:
    """One projection's per-layer weights, bf16 and quantized, with the routing inputs."""

    case: MoeCase
    proj: str
    bf: list[torch.Tensor]
    q: list[Fp8Experts | Mxfp4Experts]
    bias: torch.Tensor | None

    @property
    def n(self) -> int:
        return self.bf[0].shape[1]

    @property
    def k(self) -> int:
        return self.bf[0].shape[2]


@dataclass(frozen=True)
class Routing:
    ids: list[torch.Tensor]  # int32 [T * top_k] per layer
    aligned: list[AlignedPairs]
    weight: torch.Tensor  # float32 [T * top_k]


def _quant_experts(fmt: str, e: int, n: int, k: int) -> Fp8Experts | Mxfp4Experts:
    if fmt == "fp8_block":
        scale = torch.rand(e, n // 128, k // 128, device="cuda") * 1e-2
        return Fp8Experts(_rand_fp8(e, n, k), scale, (128, 128))
    blocks = torch.randint(0, 256, (e, n, k // 32, 16), dtype=torch.uint8, device="cuda")
    scales = torch.randint(118, 127, (e, n, k // 32), dtype=torch.uint8, device="cuda")
    return Mxfp4Experts(blocks, scales)


def _experts(c: MoeCase, proj: str) -> Experts:
    n, k = (2 * c.inner, c.hidden) if proj == "gate_up" else (c.hidden, c.inner)
    e, layers = c.experts, c.layers
    bf = [torch.randn(e, n, k, device="cuda", dtype=BF) * 0.02 for _ in range(layers)]
    q = [_quant_experts(c.fmt, e, n, k) for _ in range(layers)]
    bias = torch.randn(e, n, device="cuda", dtype=BF) if c.bias else None
    return Experts(c, proj, bf, q, bias)


GEMV: dict[tuple[str, str], Any] = {
    ("bf16", "gate_up"): expert_gate_up, ("bf16", "down"): expert_down,
    ("fp8_block", "gate_up"): fp8_expert_gate_up, ("fp8_block", "down"): fp8_expert_down,
    ("mxfp4", "gate_up"): mxfp4_expert_gate_up, ("mxfp4", "down"): mxfp4_expert_down,
}  # fmt: skip
GROUPED: dict[str, Any] = {
    "bf16": grouped_gemm, "fp8_block": fp8_grouped_gemm, "mxfp4": mxfp4_grouped_gemm,
}  # fmt: skip


def _gemv(src: torch.Tensor, w: Experts, r: Routing, fmt: str, t: GemvTiles, i: int,
          **kw: Any) -> Any:  # fmt: skip
    c, fn = w.case, GEMV[fmt, w.proj]
    weights = w.bf[i] if fmt == "bf16" else w.q[i]
    if w.proj == "gate_up":
        return fn(src, weights, r.ids[i], act=c.act, bias=w.bias, row_div=c.top_k, tiles=t, **kw)
    return fn(src, weights, r.ids[i], r.weight, c.top_k, bias=w.bias, tiles=t, **kw)


def _grouped(src: torch.Tensor, w: Experts, r: Routing, fmt: str, tiles: tuple[int, ...],
             i: int, **kw: Any) -> Any:  # fmt: skip
    pairs, gate_up = r.ids[i].numel(), w.proj == "gate_up"
    out = torch.empty(pairs, w.n, device="cuda", dtype=BF if gate_up else torch.float32)
    bn, bk, stages, warps = tiles
    return GROUPED[fmt](
        src, w.bf[i] if fmt == "bf16" else w.q[i], r.aligned[i], num_pairs=pairs,
        row_div=w.case.top_k if gate_up else 1, out=out, bias=w.bias,
        scale=None if gate_up else r.weight, block_n=bn, block_k=bk, num_stages=stages,
        num_warps=warps, **kw,
    )  # fmt: skip


def moe_variants(src: torch.Tensor, w: Experts, r: Routing) -> list[Variant]:
    c, out = w.case, []
    if r.ids[0].numel() <= 64:  # the runner's expert GEMV range
        bf_tiles = tiles_for(w.proj, w.n, w.k, c.top_k)
        out.append(Variant("bf16", "triton_gemv", str(tuple(bf_tiles)),
                           partial(_gemv, src, w, r, "bf16", bf_tiles)))  # fmt: skip
        sweep = ([GemvTiles(8, 128, 8), GemvTiles(16, 128, 8), GemvTiles(32, 128, 8)]
                 if c.fmt == "fp8_block" else
                 [GemvTiles(32, 128, 4), GemvTiles(64, 128, 4), GemvTiles(64, 256, 8)])  # fmt: skip
        for t in sweep:
            out.append(Variant(c.fmt, "triton_gemv", str(tuple(t)),
                               partial(_gemv, src, w, r, c.fmt, t)))  # fmt: skip
        if c.fmt == "mxfp4":  # through tl.dot_scaled instead of the register decode
            dot = partial(_gemv, src, w, r, c.fmt, sweep[1], dot_scaled=True)
            out.append(Variant(c.fmt, "triton_gemv_dot_scaled", str(tuple(sweep[1])), dot))
    shapes: tuple[tuple[int, int, int, int], ...] = (
        (64, 64, 3, 4),
        (64, 128, 4, 4),
        (128, 64, 3, 4),
        (128, 128, 3, 8),
    )
    for tiles in shapes:
        name = "16x{}x{}/s{}w{}".format(*tiles)
        out.append(Variant("bf16", "triton_grouped", name,
                           partial(_grouped, src, w, r, "bf16", tiles)))  # fmt: skip
        if c.fmt == "mxfp4" or tiles[1] == 128:  # FP8: K tiles of a whole 128-column block
            out.append(Variant(c.fmt, "triton_grouped", name,
                               partial(_grouped, src, w, r, c.fmt, tiles)))  # fmt: skip
    if c.fmt == "mxfp4":
        tiles = (64, 256, 3, 4)
        out.append(Variant(c.fmt, "triton_grouped", "16x64x256/s3w4",
                           partial(_grouped, src, w, r, c.fmt, tiles)))  # fmt: skip
        regs = partial(_grouped, src, w, r, c.fmt, (64, 64, 3, 4), dot_scaled=False)
        out.append(Variant(c.fmt, "triton_grouped_regs", "16x64x64/s3w4", regs))
        exact = partial(_grouped, src, w, r, c.fmt, (64, 128, 4, 4), fast_math=False)
        out.append(Variant(c.fmt, "triton_grouped_exact", "16x64x128/s4w4", exact))
    return out


def bench_moe(b: Bench, name: str, c: MoeCase, tokens_list: list[int]) -> None:
    for proj in ("gate_up", "down"):
        w = _experts(c, proj)
        for t in tokens_list:
            ids = [torch.rand(t, c.experts, device="cuda").topk(c.top_k).indices.flatten()
                   .to(torch.int32) for _ in range(c.layers)]  # fmt: skip
            r = Routing(ids, [align_pairs(i, c.experts, 16) for i in ids],
                        torch.rand(t * c.top_k, device="cuda"))  # fmt: skip
            touched = sum(int(torch.unique(i).numel()) for i in ids) / c.layers
            width = c.hidden if proj == "gate_up" else c.inner
            src = torch.randn(t if proj == "gate_up" else t * c.top_k, width, device="cuda",
                              dtype=BF)  # fmt: skip
            io = 2 * (src.numel() + t * c.top_k * w.n)

            def bytes_of(fmt: str, w: Experts = w, touched: float = touched, io: int = io) -> float:
                per = {"bf16": 2.0, "fp8_block": 1 + 4 / 128**2, "mxfp4": 0.5 + 1 / 32}[fmt]
                return touched * w.n * w.k * per + io

            measure(b, f"{name} experts", proj, t, c.layers, moe_variants(src, w, r), bytes_of,
                    2.0 * t * c.top_k * w.n * w.k)  # fmt: skip
        del w
        torch.cuda.empty_cache()


def report(rows: list[Row], copy_tbs: float) -> None:
    """Best tile of each (case, kernel, tokens, fmt, impl), with the speedup over bf16's best."""
    best: dict[tuple[str, str, int, str, str], Row] = {}
    for r in rows:
        key = (r.case, r.kernel, r.tokens, r.fmt, r.impl)
        if key not in best or r.us < best[key].us:
            best[key] = r
    base: dict[tuple[str, str, int], Row] = {}
    for (case, kernel, tokens, fmt, _), r in best.items():
        key3 = (case, kernel, tokens)
        if fmt == "bf16" and (key3 not in base or r.us < base[key3].us):
            base[key3] = r
    head = f"{'case':<26}{'kernel':<8}{'tok':>5} {'format':<12}{'impl':<19}{'tiles':<28}" \
           f"{'us':>9}{'MB':>9}{'TB/s':>7}{'frac':>6}{'TFLOP/s':>9}{'x bf16':>8}"  # fmt: skip
    print(head)
    for key in sorted(best, key=lambda k: (k[0], k[1], k[2], k[3] != "bf16", best[k].us)):
        r = best[key]
        ref = base.get((r.case, r.kernel, r.tokens))
        speed = ref.us / r.us if ref and math.isfinite(r.us) else float("nan")
        print(f"{r.case:<26}{r.kernel:<8}{r.tokens:>5} {r.fmt:<12}{r.impl:<19}{r.tiles[:27]:<28}"
              f"{r.us:>9.1f}{r.bytes / 1e6:>9.1f}{r.tbs:>7.2f}{r.tbs / copy_tbs:>6.2f}"
              f"{r.flops / (r.us * 1e-6) / 1e12:>9.1f}{speed:>8.2f}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="resin bench quant-kernels",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--output", type=Path, help="JSONL file (appended)")
    p.add_argument("--only", default="dense,qwen3-30b-a3b,gpt-oss-120b")
    p.add_argument("--copy-tbs", type=float, default=4.2)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    bench, started = Bench(), time.time()
    parts = args.only.split(",")
    if "dense" in parts:
        bench_dense(bench, [1, 64, 4096])
        print(f"dense done in {time.time() - started:.0f} s", flush=True)
    for name, case in MOE.items():
        if name in parts:
            bench_moe(bench, name, case, [1, 64])
            print(f"{name} done in {time.time() - started:.0f} s", flush=True)
    report(bench.rows, args.copy_tbs)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("a") as f:
            for r in bench.rows:
                row = {**asdict(r), "tb_s": r.tbs, "device": torch.cuda.get_device_name()}
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
