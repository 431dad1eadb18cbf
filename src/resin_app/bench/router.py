"""The MoE router at decode sizes, fused against unfused (issue 39 item 3): `unfused` is what
`MoE.route` ran before (`F.linear` on cuBLAS into [T, E] logits, then `router_topk`), `fused`
is `fused_router_topk` (the linear and the routing rule in one launch). Per preset: its
experts, hidden size, top-k, scoring, group limit, biases and shared experts, the router in
float32 where the model routes in float32 (DeepSeek, GLM).

Timed as the model runs them (docs/PERF.md): `layers` routers of distinct random weights
(enough that together they overflow L2, so each reads DRAM as in a model) called back to
back, captured in one CUDA graph, replayed; a row's `us` is the median over `--reps` replays
per layer. `agree` is the share of (token, expert) choices the fused path shares with the
unfused one on the same inputs (random normal: only ulp-close logits may differ). With
`--sweep`, every fused launch shape of `--block-e` x `--block-k` x `--warps` is timed too
(`tiles` in the row; the default shape is `fused_tiles`'). Prints one line a row and appends
them to `--output` as JSONL.

    resin bench router --output docs/bench/gpu/router_h200.jsonl
    resin bench router --sweep --output docs/bench/gpu/router_sweep_h200.jsonl

CPU smoke run (Triton's interpreter, `TRITON_INTERPRET=1`): `--device cpu --presets tiny
--tokens 1,3 --reps 1`, eager and wall-clocked (the plumbing only).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from resin_app.bench.report import write_jsonl
from resin_model.config import MoeConfig
from resin_model.presets import preset
from resin_models_cuda.kernels.router import (
    FusedTiles,
    fused_router_topk,
    fused_tiles,
    router_topk,
)

L2_BYTES = 128 * 2**20  # routers of one run together: over twice the H200's L2
FP32_ROUTER = ("deepseek-v4-flash", "glm-5.3-flash", "deepseek-v3-4l")
DEFAULT_PRESETS = "qwen3-30b-a3b,gpt-oss-20b,deepseek-v4-flash,glm-5.3-flash,deepseek-v3-4l"


@dataclass(frozen=True)
class RouterShape:
    """One model's router: `moe` its rule, `shared` always-chosen experts appended."""

    name: str
    hidden: int
    moe: MoeConfig
    shared: int
    router_dtype: torch.dtype

    @property
    def router_bytes(self) -> int:
        return self.moe.num_experts * self.hidden * self.router_dtype.itemsize


def shape_of(name: str) -> RouterShape:
    """A preset's router (`tiny`: a small grouped sigmoid one, for the CPU smoke run)."""
    if name == "tiny":
        moe = MoeConfig(13, 3, 8, True, (True,), scoring="sigmoid", num_groups=1,
                        routed_scale=2.5, score_bias=True)  # fmt: skip
        return RouterShape(name, 40, moe, 1, torch.float32)
    config = preset(name)
    rule = config.moe
    assert rule is not None, f"{name} has no MoE"
    shared = rule.shared_intermediate_size // rule.intermediate_size
    dtype = torch.float32 if name in FP32_ROUTER else torch.bfloat16
    return RouterShape(name, config.hidden_size, rule, shared, dtype)


@dataclass
class Layers:
    """`count` routers of one shape, each with its own weights (and biases), and a ticket."""

    shape: RouterShape
    weights: list[torch.Tensor]
    router_bias: list[torch.Tensor | None]
    score_bias: list[torch.Tensor | None]
    tickets: list[torch.Tensor]

    @classmethod
    def random(cls, shape: RouterShape, count: int, device: torch.device) -> Layers:
        e, h, moe = shape.moe.num_experts, shape.hidden, shape.moe

        def r(*size: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.randn(size, device=device).mul_(0.02).to(dtype)

        return cls(
            shape,
            [r(e, h, dtype=shape.router_dtype) for _ in range(count)],
            [r(e, dtype=shape.router_dtype) if moe.router_bias else None for _ in range(count)],
            [r(e, dtype=torch.float32) if moe.score_bias else None for _ in range(count)],
            [torch.zeros(1, dtype=torch.int32, device=device) for _ in range(count)],
        )

    def unfused(self, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.shape
        return [
            router_topk(F.linear(x.to(w.dtype), w, b), s.moe, sb, s.shared)
            for w, b, sb in zip(self.weights, self.router_bias, self.score_bias, strict=True)
        ]

    def fused(
        self, x: torch.Tensor, tiles: FusedTiles | None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        s = self.shape
        parts = zip(self.weights, self.router_bias, self.score_bias, self.tickets, strict=True)
        return [
            fused_router_topk(x, w, b, s.moe, ticket, sb, s.shared, tiles)
            for w, b, sb, ticket in parts
        ]


def per_layer_us(
    fn: Callable[[], object], layers: int, device: torch.device, reps: int, replays: int
) -> float:
    """Median microseconds a layer: `fn` (all layers) captured in a CUDA graph and replayed
    `replays` times a rep (CPU: `fn` eagerly, wall clock)."""
    fn()  # compile outside the capture
    run: Callable[[], object] = fn
    if device.type == "cuda":
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        run = graph.replay
    else:
        replays = 1
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record()
            for _ in range(replays):
                run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            started = time.perf_counter()
            run()
            times.append((time.perf_counter() - started) * 1e6)
    return float(statistics.median(times)) / (replays * layers)


Routed = list[tuple[torch.Tensor, torch.Tensor]]  # (weights, experts) a layer


def agreement(a: Routed, b: Routed) -> float:
    """The share of (token, slot) expert choices two routings share, over every layer."""
    same = sum(int((x[1] == y[1]).sum()) for x, y in zip(a, b, strict=True))
    return same / sum(x[1].numel() for x in a)


def sweep_tiles(args: argparse.Namespace) -> list[FusedTiles]:
    sizes = (args.block_e, args.block_k, args.sub_t, args.warps)
    ints = [[int(v) for v in s.split(",")] for s in sizes]
    return [FusedTiles(*t) for t in itertools.product(*ints)]


def bench_shape(
    shape: RouterShape, args: argparse.Namespace, device: torch.device
) -> list[dict[str, Any]]:
    count = args.layers or max(4, min(512, math.ceil(L2_BYTES / shape.router_bytes)))
    if device.type != "cuda":
        count = 2
    layers = Layers.random(shape, count, device)
    rows = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        x = torch.randn(tokens, shape.hidden, device=device).to(torch.bfloat16)
        want = layers.unfused(x)
        base = {"preset": shape.name, "tokens": tokens, "experts": shape.moe.num_experts,
                "hidden": shape.hidden, "top_k": shape.moe.top_k, "scoring": shape.moe.scoring,
                "groups": shape.moe.num_groups, "router_dtype": str(shape.router_dtype),
                "layers": count, "device": _device_name(device)}  # fmt: skip
        unfused_us = per_layer_us(
            functools.partial(layers.unfused, x), count, device, args.reps, args.replays
        )
        done = [{**base, "path": "unfused", "us": unfused_us}]
        default = fused_tiles(tokens, shape.moe.num_experts, shape.hidden)
        candidates = [None, *(sweep_tiles(args) if args.sweep else [])]
        for tiles in candidates:
            if tiles == default:
                continue
            try:
                got = layers.fused(x, tiles)
                run = functools.partial(layers.fused, x, tiles)
                us = per_layer_us(run, count, device, args.reps, args.replays)
            except Exception as exc:  # a launch shape that does not compile or fit
                print("failed", shape.name, tokens, tiles, type(exc).__name__, str(exc)[:200])
                continue
            done.append({**base, "path": "fused", "tiles": (tiles or default)._asdict(),
                         "us": us, "default": tiles is None, "agree": agreement(got, want),
                         "x_unfused": unfused_us / us})  # fmt: skip
        for r in done:
            print(_line(r), flush=True)
        rows += done
    return rows


def _line(r: dict[str, Any]) -> str:
    tiles = r.get("tiles")
    shape = "" if tiles is None else "{block_e}x{block_k}x{sub_t}/{num_warps}w".format(**tiles)
    extra = "" if r["path"] == "unfused" else f"  x{r['x_unfused']:.2f}  agree {r['agree']:.4f}"
    return (
        f"{r['preset']:<18} T={r['tokens']:<3} {r['path']:<8} {shape:<12} {r['us']:8.2f} us{extra}"
    )


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="resin bench router", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--presets", default=DEFAULT_PRESETS, help="comma-separated (or `tiny`)")
    p.add_argument("--tokens", default="1,4,16", help="decode token counts (1..16)")
    p.add_argument("--layers", type=int, default=0, help="routers a graph (0: overflow L2)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--replays", type=int, default=10, help="graph replays a rep")
    p.add_argument("--sweep", action="store_true", help="time every fused launch shape too")
    p.add_argument("--block-e", default="1,2,4,8")
    p.add_argument("--block-k", default="512,1024,2048")
    p.add_argument("--sub-t", default="1,2,4", help="tokens a product (fused_tiles' sub_t)")
    p.add_argument("--warps", default="4,8")
    p.add_argument("--device", default="cuda")
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    for name in args.presets.split(","):
        rows += bench_shape(shape_of(name), args, device)
    if args.output:
        write_jsonl(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
