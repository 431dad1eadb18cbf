"""A minimal paged-sequence planner that builds `BatchPlan`s without the Engine.

The benchmark and the correctness checks drive a runner directly with it: sequences own page
lists (a prefix of full pages may be shared with another sequence, like the prefix cache
does), and `plan()` turns (sequence, new tokens) rows into a frozen plan with exact append
slots. It does no scheduling and no eviction: it is a test and benchmark harness, not an engine.
With several cache groups (a sliding-window model), each group gets its own page range of the
arena and lists every page of the row (page_start 0): the kernels bound the window themselves.
With `state=True` (a model with a State group, declared after the token groups) row i of a
step reads and writes State page i in place (a sequence's first step starts from zeros).
`specs` (a runner's declared groups) replaces both: every token group gets its own page range
(`group_pages` pages each, by default an equal share; `group_pages()` sizes them for a
workload) and a sequence holds its own pages in each: a History group every page of its
tokens, a Window group only the pages of the window its step's queries still see (the ones
behind it go back to the group's free list, as the engine releases them; `page_start` names
the first one held), a Compressed group the entry pages of its complete entries (with the
entry slots its rows complete); State group k gives row i State page k * max rows + i
(`max_rows` rows at most a step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from resin.cache.groups import Kind, make_kind
from resin.cache.pool import PagePool
from resin.plan import BatchPlan, CacheGroupPlan, Phase, SamplingArrays
from resin.protocols import CacheGroupSpec


def _kinds(specs: tuple[CacheGroupSpec, ...], page_size: int) -> dict[int, Kind]:
    """The cache manager's kind of each declared token group, by group index: what sizes
    their page ranges (`max_pages_for`)."""
    pools = [PagePool(1), PagePool(1)]
    return {
        i: make_kind(spec, i, pools, 1, 1, page_size)
        for i, spec in enumerate(specs)
        if not spec.state_region
    }


def group_pages(
    specs: tuple[CacheGroupSpec, ...],
    page_size: int,
    rows: int,
    decode_tokens: int,
    prefill_tokens: int,
    spare: int = 8,
) -> tuple[int, ...]:
    """Pages each declared token group needs (in declaration order) for a decode of `rows`
    rows of up to `decode_tokens` tokens, one token a step, beside one prefill of
    `prefill_tokens` in a single step, plus `spare`: what `PagedPlanner(group_pages=...)`
    takes; their sum is the arena's token pages."""
    return tuple(
        rows * kind.max_pages_for(decode_tokens, 1, False)
        + kind.max_pages_for(prefill_tokens, prefill_tokens, False)
        + spare
        for kind in _kinds(specs, page_size).values()
    )


@dataclass
class Sequence:
    seq_id: int
    tokens: list[int]
    pages: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the cache
    held: dict[int, list[int]] = field(default_factory=dict)  # declared group -> its pages
    first: dict[int, int] = field(default_factory=dict)  # the first held page's logical index


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = -1
    logprobs: int = -1


class PagedPlanner:
    def __init__(
        self,
        num_pages: int,
        page_size: int,
        num_groups: int = 1,
        state: bool = False,
        specs: tuple[CacheGroupSpec, ...] | None = None,
        max_rows: int = 0,
        group_pages: tuple[int, ...] | None = None,
    ) -> None:
        self.specs, self.max_rows = specs, max_rows
        if specs is not None:
            num_groups = sum(not g.state_region for g in specs)
            state = False
        self.page_size, self.num_groups, self.state = page_size, num_groups, state
        self.pages_per_group = num_pages // num_groups
        self._free = list(range(self.pages_per_group - 1, -1, -1))
        # a declared token group's free pages, by group index (module docstring)
        self._group_free: dict[int, list[int]] = {}
        if specs is not None:
            sizes = group_pages or (self.pages_per_group,) * num_groups
            assert len(sizes) == num_groups and sum(sizes) <= num_pages
            tokens = [i for i, g in enumerate(specs) if not g.state_region]
            starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
            for i, lo, hi in zip(tokens, starts[:-1], starts[1:], strict=True):
                self._group_free[i] = list(range(hi - 1, lo - 1, -1))
        self._next_id = 0
        self._step = 0

    def new_sequence(
        self, tokens: list[int], share: Sequence | None = None, shared_tokens: int = 0
    ) -> Sequence:
        """A sequence; with `share`, it reuses `share`'s first full pages covering
        `shared_tokens` (rounded down to whole pages) as its cached prefix."""
        seq = Sequence(self._next_id, list(tokens))
        self._next_id += 1
        if share is not None:
            full = min(shared_tokens, share.cached) // self.page_size
            seq.pages = share.pages[:full]
            seq.cached = full * self.page_size
        return seq

    def _ensure_pages(self, seq: Sequence, total: int) -> None:
        while len(seq.pages) * self.page_size < total:
            if not self._free:
                raise MemoryError("planner ran out of pages")
            seq.pages.append(self._free.pop())

    def plan(
        self,
        rows: list[tuple[Sequence, int]],
        phase: Phase,
        sampling: list[Sampling] | None = None,
        output_index: list[int] | None = None,
    ) -> BatchPlan:
        """One step: row (seq, n) computes the sequence's next n uncached tokens."""
        ids, pos, slots, qlens, cached, total, pages, counts, samples = (
            [],
            [],
            [],
            [],
            [],
            [],
            [],
            [],
            [],
        )
        for seq, n in rows:
            start, end = seq.cached, seq.cached + n
            if end > len(seq.tokens):
                raise ValueError("row asks for more tokens than the sequence has")
            p = np.arange(start, end)
            if self.specs is None:
                self._ensure_pages(seq, end)
                page_arr = np.asarray(seq.pages, dtype=np.int64)
                slots.append(page_arr[p // self.page_size] * self.page_size + p % self.page_size)
                used = -(-end // self.page_size)
                pages.append(page_arr[:used].astype(np.int32))
                counts.append(used)
            ids.append(np.asarray(seq.tokens[start:end], dtype=np.int32))
            pos.append(p.astype(np.int32))
            qlens.append(n)
            cached.append(start)
            total.append(end)
            samples.append(end == len(seq.tokens))
        b = len(rows)
        sampling = sampling or [Sampling()] * b
        out_idx = np.asarray(output_index or [0] * b, dtype=np.int32)
        i32 = np.int32
        if self.specs is not None:
            groups = self._declared(rows)
        else:
            groups = tuple(
                CacheGroupPlan(
                    group=g,
                    page_indptr=np.concatenate([[0], np.cumsum(counts)]).astype(i32),
                    page_ids=(np.concatenate(pages) + g * self.pages_per_group).astype(i32),
                    page_start=np.zeros(b, dtype=i32),
                    append_slots=(
                        np.concatenate(slots) + g * self.pages_per_group * self.page_size
                    ).astype(np.int64),
                )
                for g in range(self.num_groups)
            )
        if self.state:
            rows_i32 = np.arange(b, dtype=i32)
            state_in = np.where(np.asarray(cached) > 0, rows_i32, -1).astype(i32)
            groups += (
                CacheGroupPlan(
                    group=self.num_groups,
                    state_in=state_in,
                    state_out=rows_i32,
                    checkpoint_indptr=np.zeros(b + 1, dtype=i32),
                ),
            )
        arrays = SamplingArrays(
            temperature=np.array([s.temperature for s in sampling], dtype=np.float32),
            top_p=np.array([s.top_p for s in sampling], dtype=np.float32),
            top_k=np.array([s.top_k for s in sampling], dtype=i32),
            min_p=np.array([s.min_p for s in sampling], dtype=np.float32),
            seed=np.array([s.seed for s in sampling], dtype=np.int64),
            output_index=out_idx,
            logprobs=np.array([s.logprobs for s in sampling], dtype=i32),
        )
        t = int(sum(qlens))
        self._step += 1
        return BatchPlan(
            step_id=self._step,
            phase=phase,
            sequence_ids=np.array([s.seq_id for s, _ in rows], dtype=np.int64),
            input_ids=np.concatenate(ids),
            query_indptr=np.concatenate([[0], np.cumsum(qlens)]).astype(i32),
            positions=np.concatenate(pos),
            cached_lens=np.asarray(cached, dtype=i32),
            total_lens=np.asarray(total, dtype=i32),
            sample_rows=np.asarray(samples, dtype=bool),
            sampling=arrays,
            cache_groups=groups,
            prompt_logprob_rows=np.zeros(b, dtype=bool),
            target_ids=np.full(t, -1, dtype=i32),
            draft_indptr=np.zeros(b + 1, dtype=i32),
            draft_ids=np.zeros(0, dtype=i32),
        )

    def _declared(self, rows: list[tuple[Sequence, int]]) -> tuple[CacheGroupPlan, ...]:
        """The plan rows of the runner's declared groups (`specs`, module docstring)."""
        assert self.specs is not None
        i32, b = np.int32, len(rows)
        groups: list[CacheGroupPlan] = []
        state_group = 0
        for index, spec in enumerate(self.specs):
            if spec.state_region:
                first = state_group * self.max_rows
                rows_i32 = np.arange(b, dtype=i32) + first
                state_in = np.where(np.asarray([s.cached for s, _ in rows]) > 0, rows_i32, -1)
                groups.append(CacheGroupPlan(
                    group=index, state_in=state_in.astype(i32), state_out=rows_i32,
                    checkpoint_indptr=np.zeros(b + 1, dtype=i32),
                ))  # fmt: skip
                state_group += 1
            elif (ratio := getattr(spec, "ratio", None)) is not None:  # Compressed entries
                groups.append(self._entries(index, ratio, rows))
            else:
                groups.append(self._tokens(index, rows))
        return tuple(groups)

    def _hold(self, seq: Sequence, group: int, first: int, end: int) -> list[int]:
        """`seq`'s pages of `group` for logical pages [first, end): those before `first` go
        back to the group's free list, missing ones are taken from it."""
        held = seq.held.setdefault(group, [])
        at = seq.first.get(group, first)
        while held and at < first:
            self._group_free[group].append(held.pop(0))
            at += 1
        if not held:
            at = first
        seq.first[group] = at
        while at + len(held) < end:
            if not self._group_free[group]:
                raise MemoryError(f"planner ran out of pages in group {group}")
            held.append(self._group_free[group].pop())
        return held

    def _tokens(self, index: int, rows: list[tuple[Sequence, int]]) -> CacheGroupPlan:
        """A History or Window group's rows: the pages from the first one the step's first
        query reads (a Window's `size` back; page 0 for History), and the append slots."""
        ps = self.page_size
        size = getattr(self.specs[index] if self.specs else None, "size", None)  # a Window's
        ids, counts, starts, slots = [], [], [], []
        for seq, n in rows:
            start, end = seq.cached, seq.cached + n
            first = max(0, start - size + 1) // ps if size else 0
            held = self._hold(seq, index, first, -(-end // ps))
            at = seq.first[index]
            used = -(-end // ps) - at
            pages = np.asarray(held[:used], dtype=np.int64)
            p = np.arange(start, end)
            ids.append(pages)
            counts.append(used)
            starts.append(at)
            slots.append(pages[p // ps - at] * ps + p % ps)
        return CacheGroupPlan(
            group=index,
            page_indptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
            page_ids=np.concatenate(ids).astype(np.int32),
            page_start=np.asarray(starts, dtype=np.int32),
            append_slots=np.concatenate(slots).astype(np.int64),
        )

    def _entries(self, index: int, ratio: int, rows: list[tuple[Sequence, int]]) -> CacheGroupPlan:
        """A Compressed group's rows (`ratio` tokens an entry): the entry pages of every
        complete entry, and the slots and query tokens of the entries the step completes."""
        per_page = max(1, self.page_size // ratio)  # `Compressed.entries_per_page`
        ids, counts, new, entry_slots, entry_token = [], [], [], [], []
        qstart = 0
        for seq, n in rows:
            start, end = seq.cached, seq.cached + n
            used = -(-(end // ratio) // per_page)
            pages = np.asarray(self._hold(seq, index, 0, used)[:used], dtype=np.int64)
            ids.append(pages)
            counts.append(used)
            w = np.arange(start // ratio, end // ratio)
            new.append(w.size)
            entry_slots.append(pages[w // per_page] * per_page + w % per_page)
            entry_token.append(qstart + (w + 1) * ratio - 1 - start)
            qstart += n
        i32 = np.int32
        return CacheGroupPlan(
            group=index,
            page_indptr=np.concatenate([[0], np.cumsum(counts)]).astype(i32),
            page_ids=np.concatenate(ids).astype(i32),
            page_start=np.zeros(len(rows), dtype=i32),
            entry_indptr=np.concatenate([[0], np.cumsum(new)]).astype(i32),
            entry_slots=np.concatenate(entry_slots).astype(np.int64),
            entry_token=np.concatenate(entry_token).astype(i32),
        )

    def free(self, seq: Sequence, shared_pages: int = 0) -> None:
        """Return a finished sequence's own pages (all but its first `shared_pages`; a
        declared group's pages all)."""
        self._free.extend(reversed(seq.pages[shared_pages:]))
        for group, held in seq.held.items():
            self._group_free[group].extend(reversed(held))
        seq.pages, seq.held, seq.first = [], {}, {}
        seq.cached = 0

    @staticmethod
    def commit(rows: list[tuple[Sequence, int]]) -> None:
        """Mark the planned tokens as cached (after the runner ran the plan)."""
        for seq, n in rows:
            seq.cached += n
