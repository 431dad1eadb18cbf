"""Paged decode attention (`resin_models_cuda/kernels/decode_attention.py`) over its launch
shapes: for a preset's head layout, each (batch, context) and each candidate shape of the
partial kernel (`--shapes`: WARPS/BLOCK_N/STAGES, the first one the runner's default), the
time of one call and the K/V bytes it reads against the copy ceiling.

Every row holds `context` tokens in shuffled pages. The calls cycle over enough layers of
distinct caches that their K/V (256 MB or more in all) cannot sit in L2, as in a model; on CUDA
`--reps` calls are captured in one CUDA graph and replayed, and microseconds a call are the
median of `--rounds` replays (compile and capture excluded). Splits are the runner's
(`decode_splits`). Prints a table (speedup against the first shape) and appends every row to
`--output` as JSONL.

    resin bench decode-attention --output docs/bench/gpu/decode_attention_h200.jsonl

On CPU (`--device cpu`, Triton's interpreter) a tiny preset makes a smoke test:
`--preset tiny --contexts 64 --batch-sizes 1 --shapes 4/16/2`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from resin_app.bench.sparse_attention import DTYPES, add_sweep_args, append_rows, sweep, time_call
from resin_model.presets import preset
from resin_models_cuda.kernels import PagedKV, decode_attention, decode_splits

MIN_BYTES = 256 << 20  # K/V the cycled layers hold together: past any L2


@dataclass(frozen=True)
class Shape:
    warps: int
    block_n: int
    stages: int

    def __str__(self) -> str:
        return f"{self.warps}/{self.block_n}/{self.stages}"


def parse_shapes(text: str) -> list[Shape]:
    shapes = []
    for spec in text.split(","):
        try:
            warps, block_n, stages = (int(x) for x in spec.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{spec!r}: a shape is WARPS/BLOCK_N/STAGES") from None
        shapes.append(Shape(warps, block_n, stages))
    return shapes


@dataclass(frozen=True)
class Row:
    context: int
    batch: int
    shape: str
    splits: int
    layers: int
    us: float
    bytes: float  # K and V of every row's context, read once

    @property
    def tbs(self) -> float:
        return self.bytes / (self.us * 1e-6) / 1e12 if self.us > 0 else 0.0


def _caches(
    batch: int, context: int, kv_heads: int, head_dim: int, page: int, layers: int,
    dtype: torch.dtype, device: torch.device,
) -> tuple[list[PagedKV], torch.Tensor]:  # fmt: skip
    """`layers` caches of `batch` rows of `context` tokens in shuffled pages, one page table."""
    per_row = -(-context // page)
    pages = batch * per_row
    arena = torch.empty((layers, 2, pages, page, kv_heads, head_dim), dtype=dtype, device=device)
    arena.normal_()
    ids = torch.randperm(pages, device=device).to(torch.int32)
    indptr = torch.arange(0, pages + 1, per_row, dtype=torch.int32, device=device)
    start = torch.zeros(batch, dtype=torch.int32, device=device)
    kvs = [PagedKV(arena[i, 0], arena[i, 1], indptr, ids, start) for i in range(layers)]
    return kvs, torch.full((batch,), context, dtype=torch.int32, device=device)


def bench_case(
    name: str, context: int, batch: int, shapes: list[Shape],
    device: torch.device, dtype: torch.dtype, page: int, reps: int, rounds: int,
) -> list[Row]:  # fmt: skip
    config = preset(name)
    hq, hkv, d = config.num_heads, config.num_kv_heads, config.head_dim
    kv_bytes = 2 * batch * context * hkv * d * dtype.itemsize
    layers = max(1, min(32, -(-MIN_BYTES // kv_bytes))) if device.type == "cuda" else 1
    kvs, lens = _caches(batch, context, hkv, d, page, layers, dtype, device)
    q = torch.randn((batch, hq, d), device=device).to(dtype)
    out = torch.empty_like(q)
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 1
    )
    splits = decode_splits(batch, hkv, sms)
    rows = []
    for shape in shapes:
        turn = [0]  # the layer of the next call

        def call(shape: Shape = shape, turn: list[int] = turn) -> None:
            turn[0] += 1
            decode_attention(
                q, kvs[turn[0] % layers], lens, scale=d**-0.5, splits=splits, window=0,
                out=out, block_n=shape.block_n, num_warps=shape.warps, num_stages=shape.stages,
            )  # fmt: skip

        us = time_call(call, device, reps * layers, rounds)
        rows.append(Row(context, batch, str(shape), splits, layers, us, kv_bytes))
        print(f"  {name} context {context} batch {batch} {shape}: {us:.1f} us", flush=True)
    return rows


def report(rows: list[Row], copy_tbs: float) -> None:
    first: dict[tuple[int, int], float] = {}
    for r in rows:
        first.setdefault((r.context, r.batch), r.us)
    print(f"{'context':>8}{'batch':>6} {'shape':<10}{'splits':>7}{'us':>9}"
          f"{'TB/s':>7}{'frac':>6}{'speedup':>9}")  # fmt: skip
    for r in rows:
        base = first[(r.context, r.batch)]
        speed = base / r.us if r.us > 0 and math.isfinite(r.us) else 0.0
        print(f"{r.context:>8}{r.batch:>6} {r.shape:<10}{r.splits:>7}{r.us:>9.1f}"
              f"{r.tbs:>7.2f}{r.tbs / copy_tbs:>6.2f}{speed:>8.2f}x")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="resin bench decode-attention",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument("--preset", default="llama-8b", help="whose head layout (any attention preset)")
    p.add_argument("--shapes", type=parse_shapes, default=parse_shapes("4/64/2,8/64/2,4/32/2,"
                   "8/32/2,4/64/3,8/128/2"),
                   help="partial kernel launch shapes WARPS/BLOCK_N/STAGES, comma-separated; "
                        "the first is the baseline (the runner's default: 4/64/2)")  # fmt: skip
    add_sweep_args(p, contexts="1024,8192,32768", batch_sizes="1,8", page_size=16, reps=4)
    args = p.parse_args(argv)
    rows, device = sweep(p, args, lambda context, batch, device: bench_case(
        args.preset, context, batch, args.shapes, device, DTYPES[args.dtype], args.page_size,
        args.reps, args.rounds))  # fmt: skip
    report(rows, args.copy_tbs)
    if args.output:
        append_rows(args.output, rows, device, preset=args.preset, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
