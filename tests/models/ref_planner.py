"""A tiny test planner: drives a runner without the Engine (private pages per request, no
prefix sharing), so runner tests do not depend on the engine's scheduling decisions.

Each `run()` prefills every prompt in chunks (all rows' chunks in one prefill plan per round),
then decodes all requests together until each has `max_new` tokens. `fork()` starts a request
from another's cached prefix the way a prefix cache does: full pages shared by reference, the
partial last page copied (copy_src/copy_dst), the conv state resumed from a stored checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from resin.plan import BatchPlan, CacheGroupPlan, MediaItem, Phase, SamplingArrays
from resin.protocols import CacheLayout, History, State, Window


@dataclass
class Seq:
    sid: int
    tokens: list[int]
    prompt_len: int
    params: dict[str, float | int] = field(default_factory=dict)
    computed: int = 0
    pages: dict[int, list[int]] = field(default_factory=dict)
    state_page: dict[int, int] = field(default_factory=dict)  # group -> current checkpoint page
    generated: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    checkpoint_at: set[int] = field(default_factory=set)  # store conv state after N tokens
    checkpoints: dict[tuple[int, int], int] = field(default_factory=dict)  # (group, N) -> page
    shared: set[int] = field(default_factory=set)  # pages this request must not free
    copies: list[tuple[int, int]] = field(default_factory=list)  # pending page copies
    prompt_logprobs: dict[int, float] = field(default_factory=dict)  # position -> logprob
    media: list[MediaItem] = field(default_factory=list)  # `row` is filled in per plan

    def chunk(self, limit: int) -> int:
        """The next prefill chunk: at most `limit`, but never ending inside a bidirectional
        span (extended to the span's end then), as the engine does."""
        end = min(self.computed + limit, self.prompt_len)
        for item in self.media:
            if item.bidirectional and item.position < end < item.end:
                end = item.end if item.position <= self.computed else item.position
        return end - self.computed


class TinyPlanner:
    def __init__(self, runner, num_pages: int = 512) -> None:  # type: ignore[no-untyped-def]
        self.runner = runner
        cfg = runner.runner_config
        self.page_size = cfg.page_size
        self.groups = cfg.cache_groups
        # State pages come from the same free list, so the state region is as large (ids
        # below num_pages are valid in both regions).
        runner.bind(
            CacheLayout(
                num_pages,
                cfg.page_size,
                cfg.page_bytes,
                cfg.cache_groups,
                num_pages if cfg.state_page_bytes else 0,
                cfg.state_page_bytes,
            )
        )
        self.free = list(range(num_pages - 1, -1, -1))
        self.step_id = 0

    def _page_row(
        self, seq: Seq, g: int, spec: History | Window, upto: int, first: int
    ) -> tuple[list[int], int]:
        pages = seq.pages.setdefault(g, [])
        while len(pages) * self.page_size < upto:
            pages.append(self.free.pop())
        start = 0
        if isinstance(spec, Window):
            start = max(0, first - spec.size + 1) // self.page_size
        return pages[start:], start

    def _plan(self, rows: list[tuple[Seq, int]], phase: Phase) -> BatchPlan:
        ids, pos, qind, groups_data, targets = [], [], [0], [], []
        for seq, n in rows:
            for p in range(seq.computed, seq.computed + n):
                targets.append(seq.tokens[p + 1] if p + 1 < len(seq.tokens) else -1)
            ids += seq.tokens[seq.computed : seq.computed + n]
            pos += list(range(seq.computed, seq.computed + n))
            qind.append(qind[-1] + n)
        for g, spec in enumerate(self.groups):
            if isinstance(spec, State):
                s_in, s_out, c_ind, c_tok, c_page = [], [], [0], [], []
                for i, (seq, n) in enumerate(rows):
                    s_in.append(seq.state_page.get(g, -1))
                    s_out.append(self.free.pop())
                    for count in sorted(seq.checkpoint_at):
                        if seq.computed < count <= seq.computed + n:
                            page = self.free.pop()
                            seq.checkpoints[(g, count)] = page
                            c_tok.append(qind[i] + count - 1 - seq.computed)
                            c_page.append(page)
                    c_ind.append(len(c_tok))
                groups_data.append(
                    CacheGroupPlan(
                        group=g,
                        state_in=np.array(s_in, np.int32),
                        state_out=np.array(s_out, np.int32),
                        checkpoint_indptr=np.array(c_ind, np.int32),
                        checkpoint_token=np.array(c_tok, np.int32),
                        checkpoint_page=np.array(c_page, np.int32),
                    )
                )
                continue
            indptr, page_ids, starts, slots = [0], [], [], []
            for seq, n in rows:
                row, start = self._page_row(seq, g, spec, seq.computed + n, seq.computed)
                page_ids += row
                indptr.append(len(page_ids))
                starts.append(start)
                for p in range(seq.computed, seq.computed + n):
                    page = seq.pages[g][p // self.page_size]
                    slots.append(page * self.page_size + p % self.page_size)
            groups_data.append(
                CacheGroupPlan(
                    group=g,
                    page_indptr=np.array(indptr, np.int32),
                    page_ids=np.array(page_ids, np.int32),
                    page_start=np.array(starts, np.int32),
                    append_slots=np.array(slots, np.int64),
                    copy_src=np.array([c[0] for seq, _ in rows for c in seq.copies], np.int32),
                    copy_dst=np.array([c[1] for seq, _ in rows for c in seq.copies], np.int32),
                )
            )
        b = len(rows)
        sample = [seq.computed + n >= seq.prompt_len for seq, n in rows]

        def col(key: str, default: float, dtype: type) -> np.ndarray:
            return np.array([seq.params.get(key, default) for seq, _ in rows], dtype)

        sampling = SamplingArrays(
            temperature=col("temperature", 0.0, np.float32),
            top_p=col("top_p", 1.0, np.float32),
            top_k=col("top_k", 0, np.int32),
            min_p=col("min_p", 0.0, np.float32),
            seed=col("seed", -1, np.int64),
            output_index=np.array([len(seq.generated) for seq, _ in rows], np.int32),
            logprobs=col("logprobs", -1, np.int32),
        )
        self.step_id += 1
        return BatchPlan(
            step_id=self.step_id,
            phase=phase,
            sequence_ids=np.array([seq.sid for seq, _ in rows], np.int64),
            input_ids=np.array(ids, np.int32),
            query_indptr=np.array(qind, np.int32),
            positions=np.array(pos, np.int32),
            cached_lens=np.array([seq.computed for seq, _ in rows], np.int32),
            total_lens=np.array([seq.computed + n for seq, n in rows], np.int32),
            sample_rows=np.array(sample, bool),
            sampling=sampling,
            cache_groups=tuple(groups_data),
            prompt_logprob_rows=np.array(
                [bool(seq.params.get("prompt_logprobs")) for seq, _ in rows]
            ),
            target_ids=np.array(targets, np.int32),
            draft_indptr=np.zeros(b + 1, np.int32),
            draft_ids=np.zeros(0, np.int32),
            media=tuple(
                replace(item, row=i)
                for i, (seq, n) in enumerate(rows)
                for item in seq.media
                if item.position < seq.computed + n
            ),
        )

    def _run(self, rows: list[tuple[Seq, int]], phase: Phase) -> None:
        plan = self._plan(rows, phase)
        out = self.runner.forward(plan)
        for i, (seq, n) in enumerate(rows):
            seq.copies.clear()
            if out.prompt_logprobs is not None:
                start = int(plan.query_indptr[i])
                for j in range(n):
                    if plan.target_ids[start + j] >= 0 and plan.prompt_logprob_rows[i]:
                        seq.prompt_logprobs[seq.computed + j] = float(
                            out.prompt_logprobs[start + j]
                        )
            seq.computed += n
            for g in range(len(self.groups)):
                if isinstance(self.groups[g], State):
                    old = seq.state_page.get(g, -1)
                    if old >= 0 and old not in seq.shared:
                        self.free.append(old)
                    seq.state_page[g] = int(plan.cache_groups[g].state_out[i])
            lo, hi = int(out.token_indptr[i]), int(out.token_indptr[i + 1])
            for j in range(lo, hi):
                seq.generated.append(int(out.token_ids[j]))
                seq.tokens.append(int(out.token_ids[j]))
                if out.logprobs is not None:
                    seq.logprobs.append(float(out.logprobs[j]))

    def fork(self, src: Seq, prefix: int, extra: list[int], sid: int) -> Seq:
        """A new request whose first `prefix` tokens are `src`'s, already cached."""
        seq = Seq(sid=sid, tokens=src.tokens[:prefix] + extra, prompt_len=prefix + len(extra))
        seq.computed = prefix
        for g, spec in enumerate(self.groups):
            if isinstance(spec, State):
                seq.state_page[g] = src.checkpoints[(g, prefix)]
                seq.shared.add(seq.state_page[g])
                continue
            full = prefix // self.page_size
            seq.pages[g] = src.pages[g][:full]
            if prefix % self.page_size:
                page = self.free.pop()
                seq.copies.append((src.pages[g][full], page))
                seq.pages[g].append(page)
        return seq

    def finish(self, seqs: list[Seq], max_new: int, chunk: int = 1 << 30) -> list[Seq]:
        """Prefill what is not computed yet (chunked), then decode everything to `max_new`."""
        while any(s.computed < s.prompt_len for s in seqs):
            rows = [(s, s.chunk(chunk)) for s in seqs if s.computed < s.prompt_len]
            self._run(rows, Phase.PREFILL)
        while any(len(s.generated) < max_new for s in seqs):
            self._run([(s, 1) for s in seqs if len(s.generated) < max_new], Phase.DECODE)
        return seqs

    def run(
        self,
        prompts: list[list[int]],
        max_new: int,
        chunk: int = 1 << 30,
        params: list[dict[str, float | int]] | None = None,
        media: list[list[MediaItem]] | None = None,
    ) -> list[Seq]:
        seqs = [
            Seq(
                sid=100 + i,
                tokens=list(p),
                prompt_len=len(p),
                params=(params or [{}] * len(prompts))[i],
                media=list((media or [[]] * len(prompts))[i]),
            )
            for i, p in enumerate(prompts)
        ]
        return self.finish(seqs, max_new, chunk)
