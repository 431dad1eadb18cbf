"""CUDA-graph buckets for decode: padded batch sizes and the graph captured for each.

A decode step of B rows of Q query tokens (1, or 1 + k drafts) replays the graph of the
smallest captured shape (bucket >= B, query >= Q); rows and query slots past the plan's are
padding (see `buffers.py`). Buckets are dense at small sizes, where padding costs the most
relative time, and coarser above. Each graph computes the logits and their argmax, so a
greedy step needs no launch after the replay but the token read-back.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_BUCKETS = (
    *(1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64),
    *(80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512),
)
QUERY_BUCKETS = (2, 3, 5, 9, 17, 33)


def buckets_up_to(max_batch: int) -> tuple[int, ...]:
    """Bucket sizes that do not exceed `max_batch`, plus `max_batch` itself."""
    if max_batch < 1:
        raise ValueError("max_batch must be >= 1")
    return tuple(sorted({b for b in DEFAULT_BUCKETS if b < max_batch} | {max_batch}))


def query_buckets(max_query: int) -> tuple[int, ...]:
    """Query slots per row captured for verify steps: 1 + k up to `max_query` (and itself)."""
    if max_query <= 1:
        return ()
    return tuple(sorted({q for q in QUERY_BUCKETS if q < max_query} | {max_query}))


def pick_bucket(batch: int, buckets: tuple[int, ...]) -> int | None:
    """Smallest bucket >= batch, or None when the batch is larger than every bucket."""
    i = bisect.bisect_left(buckets, batch)
    return buckets[i] if i < len(buckets) else None


@dataclass(frozen=True, slots=True)
class CapturedStep:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # the graph's static output [bucket * query, V]
    argmax: torch.Tensor  # int32 [bucket * query]: the greedy tokens
    hidden: torch.Tensor  # [bucket * query, H]: the final hidden states (MTP drafts read them)


def capture(
    shapes: list[tuple[int, int]],
    run: Callable[[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    prepare: Callable[[int, int], None],
) -> dict[tuple[int, int], CapturedStep]:
    """Capture `run(rows, query)` for every shape, largest first so smaller ones reuse its
    memory. `prepare(rows, query)` stages padding inputs; `run` is warmed up once eagerly
    (Triton compiles then, outside the capture) on a side stream, as capture requires."""
    graphs = capture_each(shapes, run, prepare)
    return {s: CapturedStep(g, *out) for s, (g, out) in graphs.items()}


@dataclass(frozen=True, slots=True)
class CapturedDrafts:
    """An MTP pass captured after a decode shape's graph: reads that graph's hidden states
    and argmax, writes the MTP cache layer, and leaves a greedy draft per query slot."""

    graph: torch.cuda.CUDAGraph
    drafts: torch.Tensor  # int32 [bucket * query]


def capture_drafts(
    shapes: list[tuple[int, int]],
    run: Callable[[int, int], torch.Tensor],
    prepare: Callable[[int, int], None],
) -> dict[tuple[int, int], CapturedDrafts]:
    """`capture` for the MTP pass (its own memory pool: the decode graphs' outputs it reads
    stay intact)."""
    graphs = capture_each(shapes, run, prepare)
    return {s: CapturedDrafts(g, out) for s, (g, out) in graphs.items()}


def capture_each(
    shapes: list[tuple[int, int]],
    run: Callable[[int, int], Any],
    prepare: Callable[[int, int], None],
) -> dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Any]]:
    """Each shape's graph and the static outputs of its `run` (see `capture`)."""
    pool = torch.cuda.graph_pool_handle()
    graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, Any]] = {}
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    for rows, query in sorted(shapes, key=lambda s: (s[0] * s[1], s), reverse=True):
        prepare(rows, query)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run(rows, query)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = run(rows, query)
        graphs[rows, query] = (graph, out)
    torch.cuda.synchronize()
    return graphs
