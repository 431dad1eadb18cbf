"""Persistent decode buffers: plan arrays staged on the host, copied to fixed device addresses.

CUDA graphs replay kernels with the pointers they were captured with, so every decode step
writes its plan into the same device tensors. All int32 arrays live in one buffer at fixed
offsets: per-row ids, positions and lengths, then per cache group the append slots, first page
index and page-row offsets, then the page ids of all groups back to back (group g's offsets
are shifted by the page ids before it, so every group indexes the one page-id region). A step
fills the pinned host mirror and copies one prefix of it (up to its last page id) in a single
host-to-device transfer. Padding rows (graph bucket larger than the batch) get a length of 0
and a slot of -1: they read and write no cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resin.plan import BatchPlan
from resin_models_cuda.step import GroupTensors

_ROW_FIELDS = ("input_ids", "positions", "seq_lens")
_GROUP_FIELDS = ("slots", "page_start", "page_indptr")
_PAD = {"input_ids": 0, "positions": 0, "seq_lens": 0, "slots": -1, "page_start": 0}


@dataclass(frozen=True, slots=True)
class DecodeViews:
    """Device views of the first `rows` entries (what a bucket's graph reads)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    groups: tuple[GroupTensors, ...]


class DecodeBuffers:
    """One int32 device buffer (+ pinned host mirror) for up to `max_rows` rows, `num_groups`
    cache groups and `max_page_ids` page ids in total over all groups."""

    def __init__(
        self, max_rows: int, max_page_ids: int, device: torch.device | str, num_groups: int = 1
    ) -> None:
        self.max_rows, self.max_page_ids, self.num_groups = max_rows, max_page_ids, num_groups
        self._offsets: dict[tuple[str, int], int] = {}
        at = 0
        for name in _ROW_FIELDS:
            self._offsets[name, 0] = at
            at += max_rows
        for g in range(num_groups):
            for name in _GROUP_FIELDS:
                self._offsets[name, g] = at
                at += max_rows + (name == "page_indptr")
        self._page_ids_at = at
        total = at + max_page_ids
        pin = torch.device(device).type == "cuda"
        self._host_t = torch.zeros(total, dtype=torch.int32, pin_memory=pin)
        self._host = self._host_t.numpy()
        self._device = torch.zeros(total, dtype=torch.int32, device=device)

    def _dev(self, name: str, group: int, n: int) -> torch.Tensor:
        at = self._offsets[name, group]
        return self._device[at : at + n]

    def _host_field(self, name: str, group: int, n: int) -> np.ndarray:
        at = self._offsets[name, group]
        return self._host[at : at + n]

    def views(self, rows: int) -> DecodeViews:
        """Device views for a graph of `rows` rows (stable addresses)."""
        assert rows <= self.max_rows
        page_ids = self._device[self._page_ids_at :]
        groups = tuple(
            GroupTensors(
                self._dev("slots", g, rows),
                self._dev("page_indptr", g, rows + 1),
                page_ids,
                self._dev("page_start", g, rows),
            )
            for g in range(self.num_groups)
        )
        return DecodeViews(
            self._dev("input_ids", 0, rows),
            self._dev("positions", 0, rows),
            self._dev("seq_lens", 0, rows),
            groups,
        )

    def stage(self, plan: BatchPlan, rows: int) -> None:
        """Write `plan` (one query token per row) padded to `rows` rows, and copy it over."""
        b = plan.num_sequences
        if not b <= rows <= self.max_rows:
            raise ValueError(f"{b} rows do not fit a buffer of {rows} (max {self.max_rows})")
        num_pages = sum(int(g.page_ids.shape[0]) for g in plan.cache_groups)
        if num_pages > self.max_page_ids:
            raise ValueError(f"{num_pages} page ids exceed the buffer ({self.max_page_ids})")
        self.fill(self._host_field("input_ids", 0, rows), plan.input_ids, 0)
        self.fill(self._host_field("positions", 0, rows), plan.positions, 0)
        self.fill(self._host_field("seq_lens", 0, rows), plan.total_lens, 0)
        at = self._page_ids_at
        for gi, g in enumerate(plan.cache_groups):
            shift = at - self._page_ids_at
            self.fill(self._host_field("slots", gi, rows), g.append_slots, -1)
            self.fill(self._host_field("page_start", gi, rows), g.page_start, 0)
            indptr = self._host_field("page_indptr", gi, rows + 1)
            self.fill(indptr, g.page_indptr, int(g.page_indptr[-1]))
            indptr += shift
            n = int(g.page_ids.shape[0])
            self._host[at : at + n] = g.page_ids
            at += n
        self._device[:at].copy_(self._host_t[:at], non_blocking=True)

    def stage_padding(self, rows: int) -> None:
        """All rows padding (for graph capture and warm-up)."""
        for name in _ROW_FIELDS:
            self._host_field(name, 0, rows)[:] = _PAD[name]
        for g in range(self.num_groups):
            self._host_field("slots", g, rows)[:] = -1
            self._host_field("page_start", g, rows)[:] = 0
            self._host_field("page_indptr", g, rows + 1)[:] = 0
        self._device[: self._page_ids_at].copy_(self._host_t[: self._page_ids_at])

    @staticmethod
    def fill(dst: np.ndarray, src: np.ndarray, pad: int) -> None:
        n = src.shape[0]
        dst[:n] = src
        dst[n:] = pad
