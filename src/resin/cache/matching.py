"""Prefix-cache hits that are valid for every cache group.

A hit of k pages (h = k * page_size tokens) lets a request start computing at position h. It
is valid only if every group can serve the first query token at h (`Kind.hit_ok`):
- History: the pages of tokens 0 .. h-1 (every node on the path has one);
- Window(W): the pages holding positions max(0, h-W+1) .. h-1;
- Compressed(m): the pages of entries 0 .. h//m - 1 (always whole pages);
- State: a checkpoint of the state after exactly h tokens (node k has one).
The last known token is always computed (its logits are needed), so k <= (n - 1) // page_size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from resin.cache.groups import Kind
from resin.cache.trie import Node


@dataclass(frozen=True, slots=True)
class Match:
    """`nodes[:k]` serve the first `tokens` = k * page_size tokens (k may be 0)."""

    nodes: tuple[Node, ...]
    tokens: int


NO_MATCH = Match((), 0)


def best_hit(path: list[Node], groups: Sequence[Kind]) -> int:
    """The largest k <= len(path) at which every group can resume (0 if none)."""
    for k in range(len(path), 0, -1):
        if all(g.hit_ok(path, k) for g in groups):
            return k
    return 0
