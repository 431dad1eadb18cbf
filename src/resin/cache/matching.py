"""Prefix-cache hits that are valid for every cache group, and State checkpoint positions.

A hit of k pages (h = k * page_size tokens) lets a request start computing at position h. It
is valid only if every group can serve the first query token at h:
- History: the pages of tokens 0 .. h-1 (every node on the path has one);
- Window(W): the pages holding positions max(0, h-W+1) .. h-1;
- State: a checkpoint of the state after exactly h tokens (node k has one).
The last known token is always computed (its logits are needed), so k <= (n - 1) // page_size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from resin.cache.groups import PagedGroup, StateGroup
from resin.cache.trie import Node

I32 = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class Match:
    """`nodes[:k]` serve the first `tokens` = k * page_size tokens (k may be 0)."""

    nodes: tuple[Node, ...]
    tokens: int


NO_MATCH = Match((), 0)


@dataclass(frozen=True, slots=True)
class Checkpoints:
    """State checkpoints of one step: rows' CSR over (flat token index, depth, page/group)."""

    indptr: I32
    token: I32
    depth: I32
    pages: tuple[I32, ...]
    """One page array per State group (aligned with `token`)."""


def best_hit(path: list[Node], groups: list[PagedGroup | StateGroup], page_size: int) -> int:
    """The largest k <= len(path) at which every group can resume (0 if none)."""
    for k in range(len(path), 0, -1):
        if all(_group_ok(path, g, gi, k, page_size) for gi, g in enumerate(groups)):
            return k
    return 0


def _group_ok(path: list[Node], g: PagedGroup | StateGroup, gi: int, k: int, ps: int) -> bool:
    if isinstance(g, StateGroup):
        return path[k - 1].pages[gi] >= 0
    first = 0 if g.window is None else max(0, k * ps - g.window + 1) // ps
    return all(path[j].pages[gi] >= 0 for j in range(first, k))


def checkpoint_positions(cached: I32, totals: I32, page_size: int) -> tuple[I32, I32, I32]:
    """Page-aligned state checkpoints inside each row's new tokens.

    Returns (indptr [B+1], flat query-token index [C], depth [C]): after query token
    `index[c]` the state covers `depth[c] * page_size` tokens.
    """
    lo = cached // page_size + 1
    hi = totals // page_size
    counts = np.maximum(hi - lo + 1, 0).astype(np.int32)
    indptr = np.zeros(cached.size + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    n = int(indptr[-1])
    depth = (np.arange(n) - np.repeat(indptr[:-1] - lo, counts)).astype(np.int32)
    qstart = np.zeros(cached.size + 1, dtype=np.int32)
    np.cumsum(totals - cached, out=qstart[1:])
    rows = np.repeat(np.arange(cached.size), counts)
    index = (qstart[rows] + depth * page_size - 1 - cached[rows]).astype(np.int32)
    return indptr, index, depth
