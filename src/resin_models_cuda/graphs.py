"""CUDA-graph buckets for decode: padded batch sizes and the graph captured for each.

A decode step of B rows replays the graph of the smallest bucket >= B; rows past B are
padding (see `buffers.py`). Buckets are dense at small sizes, where padding costs the most
relative time, and coarser above.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

DEFAULT_BUCKETS = (
    *(1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64),
    *(80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512),
)


def buckets_up_to(max_batch: int) -> tuple[int, ...]:
    """Bucket sizes that do not exceed `max_batch`, plus `max_batch` itself."""
    if max_batch < 1:
        raise ValueError("max_batch must be >= 1")
    return tuple(sorted({b for b in DEFAULT_BUCKETS if b < max_batch} | {max_batch}))


def pick_bucket(batch: int, buckets: tuple[int, ...]) -> int | None:
    """Smallest bucket >= batch, or None when the batch is larger than every bucket."""
    i = bisect.bisect_left(buckets, batch)
    return buckets[i] if i < len(buckets) else None


@dataclass(frozen=True, slots=True)
class CapturedStep:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # the graph's static output [bucket, V]


def capture(
    buckets: tuple[int, ...], run: Callable[[int], torch.Tensor], prepare: Callable[[int], None]
) -> dict[int, CapturedStep]:
    """Capture `run(bucket)` for every bucket, largest first so smaller ones reuse its memory.

    `prepare(bucket)` stages padding inputs; `run` is warmed up once eagerly (Triton compiles
    then, outside the capture) on a side stream, as CUDA-graph capture requires.
    """
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[int, CapturedStep] = {}
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    for bucket in sorted(buckets, reverse=True):
        prepare(bucket)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits = run(bucket)
        graphs[bucket] = CapturedStep(graph, logits)
    torch.cuda.synchronize()
    return graphs
