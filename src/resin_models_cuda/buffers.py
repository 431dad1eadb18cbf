"""Persistent decode buffers: plan arrays staged on the host, copied to fixed device addresses.

CUDA graphs replay kernels with the pointers they were captured with, so every decode step
writes its plan into the same device tensors. All int32 arrays live in one buffer, in a fixed
order with `page_ids` last; a step fills the pinned host mirror and copies one prefix of it
(up to its last page id) in a single host-to-device transfer. Padding rows (graph bucket
larger than the batch) get a length of 0 and a slot of -1: they read and write no cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resin.plan import BatchPlan

_FIELDS = ("input_ids", "positions", "slots", "seq_lens", "page_start", "page_indptr")


@dataclass(frozen=True, slots=True)
class DecodeViews:
    """Device views of the first `rows` entries (what a bucket's graph reads)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    seq_lens: torch.Tensor
    page_start: torch.Tensor
    page_indptr: torch.Tensor
    page_ids: torch.Tensor


class DecodeBuffers:
    """One int32 device buffer (+ pinned host mirror) for up to `max_rows` rows and
    `max_page_ids` page ids in total."""

    def __init__(self, max_rows: int, max_page_ids: int, device: torch.device | str) -> None:
        self.max_rows = max_rows
        self.max_page_ids = max_page_ids
        sizes = [max_rows] * 5 + [max_rows + 1]
        self._offsets = dict(zip(_FIELDS, np.cumsum([0, *sizes[:-1]]).tolist(), strict=True))
        self._page_ids_at = int(sum(sizes))
        total = self._page_ids_at + max_page_ids
        pin = torch.device(device).type == "cuda"
        self._host_t = torch.zeros(total, dtype=torch.int32, pin_memory=pin)
        self._host = self._host_t.numpy()
        self._device = torch.zeros(total, dtype=torch.int32, device=device)

    def views(self, rows: int) -> DecodeViews:
        """Device views for a graph of `rows` rows (stable addresses)."""
        assert rows <= self.max_rows
        parts = {}
        for name in _FIELDS:
            at = self._offsets[name]
            parts[name] = self._device[at : at + rows + (name == "page_indptr")]
        parts["page_ids"] = self._device[self._page_ids_at :]
        return DecodeViews(**parts)

    def _host_field(self, name: str, n: int) -> np.ndarray:
        at = self._offsets[name]
        return self._host[at : at + n]

    def stage(self, plan: BatchPlan, group: int, rows: int) -> None:
        """Write `plan` (one query token per row) padded to `rows` rows, and copy it over."""
        b = plan.num_sequences
        g = plan.cache_groups[group]
        num_pages = int(g.page_ids.shape[0])
        if not b <= rows <= self.max_rows:
            raise ValueError(f"{b} rows do not fit a buffer of {rows} (max {self.max_rows})")
        if num_pages > self.max_page_ids:
            raise ValueError(f"{num_pages} page ids exceed the buffer ({self.max_page_ids})")
        self.fill(self._host_field("input_ids", rows), plan.input_ids, 0)
        self.fill(self._host_field("positions", rows), plan.positions, 0)
        self.fill(self._host_field("slots", rows), g.append_slots, -1)
        self.fill(self._host_field("seq_lens", rows), plan.total_lens, 0)
        self.fill(self._host_field("page_start", rows), g.page_start, 0)
        self.fill(self._host_field("page_indptr", rows + 1), g.page_indptr, int(g.page_indptr[-1]))
        self._host[self._page_ids_at : self._page_ids_at + num_pages] = g.page_ids
        end = self._page_ids_at + num_pages
        self._device[:end].copy_(self._host_t[:end], non_blocking=True)

    def stage_padding(self, rows: int) -> None:
        """All rows padding (for graph capture and warm-up)."""
        for name, value in zip(_FIELDS, (0, 0, -1, 0, 0, 0), strict=True):
            self._host_field(name, rows + (name == "page_indptr"))[:] = value
        self._device[: self._page_ids_at].copy_(self._host_t[: self._page_ids_at])

    @staticmethod
    def fill(dst: np.ndarray, src: np.ndarray, pad: int) -> None:
        n = src.shape[0]
        dst[:n] = src
        dst[n:] = pad
