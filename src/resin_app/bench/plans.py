"""A minimal paged-sequence planner that builds `BatchPlan`s without the Engine.

The benchmark and the correctness checks drive a runner directly with it: sequences own page
lists (a prefix of full pages may be shared with another sequence, like the prefix cache
does), and `plan()` turns (sequence, new tokens) rows into a frozen plan with exact append
slots. It does no scheduling and no eviction: it is a test and benchmark harness, not an engine.
With several cache groups (a sliding-window model), each group gets its own page range of the
arena and lists every page of the row (page_start 0): the kernels bound the window themselves.
With `state=True` (a model with a State group, declared after the token groups) row i of a
step reads and writes State page i in place (a sequence's first step starts from zeros).
`specs` (a runner's declared groups) replaces both: every token group gets its page range
(a Compressed group its entry pages: entry page j lives on the page of the sequence's token
page that starts its span, with the entry slots its rows complete), and State group k gives
row i State page k * max rows + i (`max_rows` rows at most a step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from resin.plan import BatchPlan, CacheGroupPlan, Phase, SamplingArrays
from resin.protocols import CacheGroupSpec


@dataclass
class Sequence:
    seq_id: int
    tokens: list[int]
    pages: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the cache


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
    ) -> None:
        self.specs, self.max_rows = specs, max_rows
        if specs is not None:
            num_groups = sum(not g.state_region for g in specs)
            state = False
        self.page_size, self.num_groups, self.state = page_size, num_groups, state
        self.pages_per_group = num_pages // num_groups
        self._free = list(range(self.pages_per_group - 1, -1, -1))
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
            self._ensure_pages(seq, end)
            p = np.arange(start, end)
            page_arr = np.asarray(seq.pages, dtype=np.int64)
            slots.append(page_arr[p // self.page_size] * self.page_size + p % self.page_size)
            ids.append(np.asarray(seq.tokens[start:end], dtype=np.int32))
            pos.append(p.astype(np.int32))
            qlens.append(n)
            cached.append(start)
            total.append(end)
            used = -(-end // self.page_size)
            pages.append(page_arr[:used].astype(np.int32))
            counts.append(used)
            samples.append(end == len(seq.tokens))
        b = len(rows)
        sampling = sampling or [Sampling()] * b
        out_idx = np.asarray(output_index or [0] * b, dtype=np.int32)
        i32 = np.int32
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
        if self.specs is not None:
            groups = self._declared(rows, slots, pages, counts)
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

    def _declared(
        self,
        rows: list[tuple[Sequence, int]],
        slots: list[np.ndarray],
        pages: list[np.ndarray],
        counts: list[int],
    ) -> tuple[CacheGroupPlan, ...]:
        """The plan rows of the runner's declared groups (`specs`, class docstring)."""
        assert self.specs is not None
        i32, b, ps, ppg = np.int32, len(rows), self.page_size, self.pages_per_group
        groups: list[CacheGroupPlan] = []
        token_group = state_group = 0
        qstart = np.concatenate([[0], np.cumsum([n for _, n in rows])])
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
                continue
            offset = token_group * ppg
            token_group += 1
            ratio = getattr(spec, "ratio", None)  # a Compressed group's entries
            if ratio is None:
                groups.append(CacheGroupPlan(
                    group=index,
                    page_indptr=np.concatenate([[0], np.cumsum(counts)]).astype(i32),
                    page_ids=(np.concatenate(pages) + offset).astype(i32),
                    page_start=np.zeros(b, dtype=i32),
                    append_slots=(np.concatenate(slots) + offset * ps).astype(np.int64),
                ))  # fmt: skip
                continue
            per_page = max(1, ps // ratio)
            span = max(ps, ratio) // ps  # token pages an entry page spans
            ids, page_counts, new, entry_slots, entry_token = [], [], [], [], []
            for row, (seq, n) in enumerate(rows):
                start, end = seq.cached, seq.cached + n
                owned = np.asarray(seq.pages, dtype=np.int64)[::span] + offset
                used = -(-(end // ratio) // per_page)
                ids.append(owned[:used])
                page_counts.append(used)
                w = np.arange(start // ratio, end // ratio)
                new.append(w.size)
                entry_slots.append(owned[w // per_page] * per_page + w % per_page)
                entry_token.append(qstart[row] + (w + 1) * ratio - 1 - start)
            groups.append(CacheGroupPlan(
                group=index,
                page_indptr=np.concatenate([[0], np.cumsum(page_counts)]).astype(i32),
                page_ids=np.concatenate(ids).astype(i32),
                page_start=np.zeros(b, dtype=i32),
                entry_indptr=np.concatenate([[0], np.cumsum(new)]).astype(i32),
                entry_slots=np.concatenate(entry_slots).astype(np.int64),
                entry_token=np.concatenate(entry_token).astype(i32),
            ))  # fmt: skip
        return tuple(groups)

    def free(self, seq: Sequence, shared_pages: int = 0) -> None:
        """Return a finished sequence's own pages (all but its first `shared_pages`)."""
        self._free.extend(reversed(seq.pages[shared_pages:]))
        seq.pages = []
        seq.cached = 0

    @staticmethod
    def commit(rows: list[tuple[Sequence, int]]) -> None:
        """Mark the planned tokens as cached (after the runner ran the plan)."""
        for seq, n in rows:
            seq.cached += n
