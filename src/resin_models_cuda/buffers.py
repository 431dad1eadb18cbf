"""Persistent decode buffers: plan arrays staged on the host, copied to fixed device addresses.

CUDA graphs replay kernels with the pointers they were captured with, so every decode step
writes its plan into the same device tensors. All int32 arrays live in one buffer at fixed
offsets: per-token ids, positions and (per cache group) append slots, sized for `max_query`
query slots per row; per-row lengths, real query counts and previous-token rows; per group
the first page index and page-row offsets; then the page ids of all groups back to back
(group g's offsets are shifted by the page ids before it, so every group indexes the one
page-id region). A step fills a pinned host mirror and copies one prefix of it (up to its last
page id) in a single non-blocking host-to-device transfer. Two mirrors alternate, so the host
can stage step n+1 while step n's copy may still be queued (an event guards each mirror).

A row with q real query tokens (1, or 1 + k drafts, or a short prefill's) fills its first q
slots of `query`; the rest are padding (slot -1, position 0). Padding rows (graph bucket larger
than the batch) get a length of 0 and a slot of -1: they read and write no cache. A model with
a State group (linear attention, declared after the token groups) reads each row's `state_in`
/ `state_out` page (padding: -1, zeros read and nothing written). With one query slot a row,
row b's token is State row b. With more, the State rows split the slots with no gap (the
recurrent kernels run a row's tokens from one offset to the next): row b's real tokens are
State row 2b (its pages and its prefix-cache checkpoints), its padding slots State row 2b + 1
(pages -1: it reads zeros and writes nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from resin.plan import BatchPlan, CacheGroupPlan
from resin_models_cuda.step import GroupTensors

_TOKEN_FIELDS = ("input_ids", "positions")
_ROW_FIELDS = ("seq_lens", "q_lens", "prev_rows")
_STATE_FIELDS = ("state_in", "state_out")
# several query slots a row: State rows 2b (real tokens) and 2b + 1 (padding), see above
_SPLIT_FIELDS = ("split_in", "split_out", "ckpt_indptr", "ckpt_len", "ckpt_page")
_GROUP_FIELDS = ("slots", "entry_at", "page_start", "page_indptr")
_TOKEN_SIZED = ("slots", "entry_at")


@dataclass(frozen=True, slots=True)
class DecodeViews:
    """Device views of the first `rows` rows of `query` slots (what a graph reads)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    q_lens: torch.Tensor
    prev_rows: torch.Tensor
    groups: tuple[GroupTensors, ...]
    state_in: tuple[torch.Tensor, ...]  # one per State group ([2 * rows] when query > 1)
    state_out: tuple[torch.Tensor, ...]
    split: SplitStates | None = None  # query > 1 with State groups: the split State rows


@dataclass(frozen=True, slots=True)
class SplitStates:
    """The State rows of a step of several query slots a row (module docstring): `indptr`
    [2 * rows + 1] and `token_row` [rows * query] shared, and per State group its
    checkpoints (`StateRows`' `ckpt_indptr` [2 * rows + 1], `ckpt_len` / `ckpt_page`)."""

    indptr: torch.Tensor
    token_row: torch.Tensor
    ckpt_indptr: tuple[torch.Tensor, ...]
    ckpt_len: tuple[torch.Tensor, ...]
    ckpt_page: tuple[torch.Tensor, ...]


class DecodeBuffers:
    """One int32 device buffer (+ two pinned host mirrors) for up to `max_rows` rows of up to
    `max_query` query tokens, `num_groups` token cache groups, `num_states` State groups after
    them and `max_page_ids` page ids in total. `split_states`: steps of several query slots a
    row split the State rows (module docstring; a model whose State kernels read a row's
    tokens by offset); False: State row b is row b (DeepSeek-V4's rings)."""

    def __init__(
        self,
        max_rows: int,
        max_page_ids: int,
        device: torch.device | str,
        num_groups: int = 1,
        max_query: int = 1,
        num_states: int = 1,
        split_states: bool = True,
    ) -> None:
        self.max_rows, self.max_page_ids, self.num_groups = max_rows, max_page_ids, num_groups
        self.max_query, self.num_states = max_query, max(num_states, 1)
        self._offsets: dict[tuple[str, int], int] = {}
        at = 0
        for name in _TOKEN_FIELDS:
            self._offsets[name, 0] = at
            at += max_rows * max_query
        for name in _ROW_FIELDS:
            self._offsets[name, 0] = at
            at += max_rows
        for s in range(self.num_states):
            for name in _STATE_FIELDS:
                self._offsets[name, s] = at
                at += max_rows
        self.split_states = split_states and num_states > 0 and max_query > 1
        if self.split_states:
            t = max_rows * max_query
            for name, size in (("split_indptr", 2 * max_rows + 1), ("token_row", t)):
                self._offsets[name, 0] = at
                at += size
            sizes = (2 * max_rows, 2 * max_rows, 2 * max_rows + 1, t + 1, t + 1)
            for s in range(self.num_states):
                for name, size in zip(_SPLIT_FIELDS, sizes, strict=True):
                    self._offsets[name, s] = at
                    at += size
        for g in range(num_groups):
            for name in _GROUP_FIELDS:
                self._offsets[name, g] = at
                at += (
                    max_rows * max_query
                    if name in _TOKEN_SIZED
                    else max_rows + (name == "page_indptr")
                )
        self._page_ids_at = at
        total = at + max_page_ids
        self._pinned = torch.device(device).type == "cuda"
        self._hosts = [
            torch.zeros(total, dtype=torch.int32, pin_memory=self._pinned) for _ in range(2)
        ]
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self._host = self._hosts[0].numpy()
        self._device = torch.zeros(total, dtype=torch.int32, device=device)

    def _dev(self, name: str, group: int, n: int) -> torch.Tensor:
        at = self._offsets[name, group]
        return self._device[at : at + n]

    def _field(self, name: str, group: int, n: int) -> np.ndarray:
        at = self._offsets[name, group]
        return self._host[at : at + n]

    def views(self, rows: int, query: int = 1) -> DecodeViews:
        """Device views for a graph of `rows` rows of `query` slots (stable addresses)."""
        assert rows <= self.max_rows and query <= self.max_query
        page_ids = self._device[self._page_ids_at :]
        t = rows * query
        groups = tuple(
            GroupTensors(
                self._dev("slots", g, t),
                self._dev("page_indptr", g, rows + 1),
                page_ids,
                self._dev("page_start", g, rows),
                entry_at=self._dev("entry_at", g, t),
            )
            for g in range(self.num_groups)
        )
        states = range(self.num_states)
        split = None
        if not (self.split_states and query > 1):
            state_in = tuple(self._dev("state_in", s, rows) for s in states)
            state_out = tuple(self._dev("state_out", s, rows) for s in states)
        else:
            state_in = tuple(self._dev("split_in", s, 2 * rows) for s in states)
            state_out = tuple(self._dev("split_out", s, 2 * rows) for s in states)
            split = SplitStates(
                self._dev("split_indptr", 0, 2 * rows + 1),
                self._dev("token_row", 0, t),
                tuple(self._dev("ckpt_indptr", s, 2 * rows + 1) for s in states),
                tuple(self._dev("ckpt_len", s, t + 1) for s in states),
                tuple(self._dev("ckpt_page", s, t + 1) for s in states),
            )
        return DecodeViews(
            self._dev("input_ids", 0, t),
            self._dev("positions", 0, t),
            self._dev("seq_lens", 0, rows),
            self._dev("q_lens", 0, rows),
            self._dev("prev_rows", 0, rows),
            groups,
            state_in,
            state_out,
            split,
        )

    def _next_mirror(self) -> None:
        """Switch to the other host mirror, once its last copy has left it."""
        self._turn ^= 1
        event = self._events[self._turn]
        if event is not None:
            event.synchronize()  # type: ignore[no-untyped-call]
        self._host = self._hosts[self._turn].numpy()

    def _send(self, upto: int) -> None:
        host = self._hosts[self._turn]
        self._device[:upto].copy_(host[:upto], non_blocking=self._pinned)
        if self._pinned:
            event = torch.cuda.Event()
            event.record()  # type: ignore[no-untyped-call]
            self._events[self._turn] = event

    def stage(self, plan: BatchPlan, rows: int, query: int = 1) -> None:
        """Write `plan` (rows of at most `query` tokens: decode, verify or a short prefill)
        padded to `rows` rows, and copy it over. Row i's tokens go to slots `i * query ..`."""
        b = plan.num_sequences
        if not b <= rows <= self.max_rows or query > self.max_query:
            raise ValueError(f"{b} rows do not fit a buffer of {rows} (max {self.max_rows})")
        num_pages = sum(int(g.page_ids.shape[0]) for g in plan.cache_groups)
        if num_pages > self.max_page_ids:
            raise ValueError(f"{num_pages} page ids exceed the buffer ({self.max_page_ids})")
        self._next_mirror()
        t = rows * query
        if query == 1:
            if plan.num_tokens != b:
                raise ValueError("a one-token buffer needs one query token per row")
            dest = None
            self.fill(self._field("q_lens", 0, rows), np.ones(b, np.int32), 0)
        else:
            qlens = np.diff(plan.query_indptr)
            if int(qlens.max(initial=1)) > query:
                raise ValueError(f"a row has more than {query} query tokens")
            self.fill(self._field("q_lens", 0, rows), qlens, 0)
            starts = np.repeat(plan.query_indptr[:-1], qlens)
            dest = np.repeat(np.arange(b) * query, qlens) + np.arange(plan.num_tokens) - starts
        self._scatter(self._field("input_ids", 0, t), plan.input_ids, dest, 0)
        self._scatter(self._field("positions", 0, t), plan.positions, dest, 0)
        self.fill(self._field("seq_lens", 0, rows), plan.total_lens, 0)
        prev = plan.prev_token_rows
        self.fill(self._field("prev_rows", 0, rows), prev if prev.size else np.full(b, -1), -1)
        states = plan.cache_groups[self.num_groups :]
        if len(states) > self.num_states:
            raise ValueError(f"{len(states)} State groups exceed the buffer ({self.num_states})")
        for s, g in enumerate(states):
            self.fill(self._field("state_in", s, rows), g.state_in, -1)
            self.fill(self._field("state_out", s, rows), g.state_out, -1)
        if states and self.split_states and query > 1:
            self._stage_split(rows, query, plan, states)
        elif any(g.checkpoint_token.size for g in states):
            raise ValueError("State checkpoints need split State rows (several query slots)")
        at = self._page_ids_at
        for gi, g in enumerate(plan.cache_groups[: self.num_groups]):
            shift = at - self._page_ids_at
            self._scatter(self._field("slots", gi, t), g.append_slots, dest, -1)
            entry_at = self._field("entry_at", gi, t)
            entry_at[:] = -1
            if g.entry_token.size:  # each completing token's entry (one at most a token)
                tokens = g.entry_token if dest is None else dest[g.entry_token]
                entry_at[tokens] = g.entry_slots
            self.fill(self._field("page_start", gi, rows), g.page_start, 0)
            indptr = self._field("page_indptr", gi, rows + 1)
            self.fill(indptr, g.page_indptr, int(g.page_indptr[-1]))
            indptr += shift
            n = int(g.page_ids.shape[0])
            self._host[at : at + n] = g.page_ids
            at += n
        self._send(at)

    def _stage_split(
        self, rows: int, query: int, plan: BatchPlan | None = None,
        states: tuple[CacheGroupPlan, ...] = (),
    ) -> None:  # fmt: skip
        """The split State rows (module docstring) of `plan` and its State groups' plans
        padded to `rows` rows (no plan: all padding)."""
        b = 0 if plan is None else plan.num_sequences
        lens = np.zeros(rows, np.int64)
        if plan is not None:
            lens[:b] = np.diff(plan.query_indptr)
        base = np.arange(rows, dtype=np.int64) * query
        indptr = self._field("split_indptr", 0, 2 * rows + 1)
        indptr[0] = 0
        indptr[1::2] = base + lens
        indptr[2::2] = base + query
        slot = np.arange(rows * query)
        row = slot // query
        self._field("token_row", 0, rows * query)[:] = 2 * row + (slot - base[row] >= lens[row])
        for s in range(self.num_states):
            g = states[s] if s < len(states) else None
            for name in ("split_in", "split_out"):
                split = self._field(name, s, 2 * rows)
                split[:] = -1
                if g is not None:
                    split[: 2 * b : 2] = g.state_in if name == "split_in" else g.state_out
            ckpt = self._field("ckpt_indptr", s, 2 * rows + 1)
            counts = np.zeros(2 * rows, np.int64)
            if g is not None and g.checkpoint_token.size:
                counts[: 2 * b : 2] = np.diff(g.checkpoint_indptr)
            ckpt[0] = 0
            ckpt[1:] = np.cumsum(counts)
            n = int(ckpt[-1])
            if n:  # after flat query token i: the row's tokens up to and including i
                assert plan is not None and g is not None
                owner = np.repeat(np.arange(b), counts[: 2 * b : 2])
                covered = g.checkpoint_token - plan.query_indptr[owner] + 1
                self._field("ckpt_len", s, n)[:] = covered
                self._field("ckpt_page", s, n)[:] = g.checkpoint_page
            self._field("ckpt_len", s, n + 1)[n] = 0  # the kernels read one past the last
            self._field("ckpt_page", s, n + 1)[n] = -1

    def stage_padding(self, rows: int, query: int = 1) -> None:
        """All rows padding (for graph capture and warm-up)."""
        self._next_mirror()
        t = rows * query
        for name in _TOKEN_FIELDS:
            self._field(name, 0, t)[:] = 0
        self._field("seq_lens", 0, rows)[:] = 0
        self._field("q_lens", 0, rows)[:] = 1
        self._field("prev_rows", 0, rows)[:] = -1
        for s in range(self.num_states):
            self._field("state_in", s, rows)[:] = -1
            self._field("state_out", s, rows)[:] = -1
        if self.split_states and query > 1:
            self._stage_split(rows, query)
        for g in range(self.num_groups):
            self._field("slots", g, t)[:] = -1
            self._field("entry_at", g, t)[:] = -1
            self._field("page_start", g, rows)[:] = 0
            self._field("page_indptr", g, rows + 1)[:] = 0
        self._send(self._page_ids_at)

    @staticmethod
    def fill(dst: np.ndarray, src: np.ndarray, pad: int) -> None:
        n = src.shape[0]
        dst[:n] = src
        dst[n:] = pad

    @staticmethod
    def _scatter(dst: np.ndarray, src: np.ndarray, dest: np.ndarray | None, pad: int) -> None:
        if dest is None:
            DecodeBuffers.fill(dst, src, pad)
            return
        dst[:] = pad
        if src.size:  # a group without per-token slots (DeepSeek-V4's Compressed ones): all pad
            dst[dest] = src
