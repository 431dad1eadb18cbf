"""Fake runners for the engine's own tests, and the naive loop they must agree with.

`CacheSimRunner` simulates a model *through the cache only*: it writes every query token at its
append slot in one shared arena (all groups share it, like the real one), reads the context back
through the plan's page rows, and derives the next token from what it read:
- History: a hash of every token at positions 0..p;
- Window(W): a hash of the tokens at positions (p - W, p];
- State: a running fold over all tokens, carried in State pages (state_in -> state_out,
  checkpoints stored where the plan asks, copy-on-write copies done first), together with the
  last few tokens: the pending tail a Compressed group's next entry needs;
- Compressed(m): a hash of its complete entries, entry w being a hash of tokens
  [w*m, (w+1)*m), written at the plan's `entry_slots` when the block completes (a runner with
  a Compressed group must declare a State group too, where the tail lives).
If the engine hands out a wrong page, frees a page still in use, or mis-slices a row, what is
read back differs from the truth and the tokens diverge from `naive_generate`, which sees the
whole token list. Any addressing the runner cannot even perform raises `FakeRunnerBug`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from resin import (
    BatchPlan,
    CacheGroupSpec,
    CacheLayout,
    ForwardOutput,
    History,
    Phase,
    RunnerConfig,
    SamplingParams,
    State,
    Window,
)
from resin.events import FinishReason
from resin.protocols import Compressed

MASK64 = (1 << 64) - 1


class FakeRunnerBug(AssertionError):
    """The plan asked the fake runner for something impossible (an engine bug)."""


def _digest(values: Sequence[int]) -> int:
    data = np.asarray(values, dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def entry_value(block: Sequence[int]) -> int:
    """A Compressed entry: a hash of its block's tokens (fits the int64 arena)."""
    return _digest(block) & ((1 << 62) - 1)


def fold_state(state: int, token: int) -> int:
    return (state * 6364136223846793005 + token + 1442695040888963407) & MASK64


def next_token(
    groups: Sequence[CacheGroupSpec], tokens: Sequence[int], state: int, vocab: int
) -> int:
    """The model's function: what the next token is, given the whole context."""
    parts: list[int] = []
    for g in groups:
        if isinstance(g, History):
            parts.append(_digest(tokens))
        elif isinstance(g, Window):
            parts.append(_digest(tokens[max(0, len(tokens) - g.size) :]))
        elif isinstance(g, Compressed):
            r = g.ratio
            parts.append(
                _digest([entry_value(tokens[w * r : (w + 1) * r]) for w in range(len(tokens) // r)])
            )
        else:
            parts.append(state)
    return _combine(parts) % vocab


def _combine(parts: Sequence[int]) -> int:
    data = b"".join((p & MASK64).to_bytes(8, "little") for p in parts)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def naive_generate(
    groups: Sequence[CacheGroupSpec],
    prompt: Sequence[int],
    params: SamplingParams,
    vocab: int,
    context_length: int,
) -> tuple[list[int], FinishReason]:
    """The reference: one token at a time over the whole token list, same stop rules."""
    tokens = list(prompt)
    state = 0
    for t in tokens:
        state = fold_state(state, t)
    out: list[int] = []
    while True:
        tok = next_token(groups, tokens, state, vocab)
        out.append(tok)
        tokens.append(tok)
        state = fold_state(state, tok)
        stop = tok in params.stop_token_ids and not params.ignore_stop_tokens
        if stop and len(out) >= params.min_output_tokens:
            return out, FinishReason.STOP
        if len(out) >= params.max_output_tokens or len(tokens) >= context_length:
            return out, FinishReason.LENGTH


@dataclass
class CacheSimRunner:
    """See the module docstring. `num_pages` None lets the engine size the arena."""

    groups: tuple[CacheGroupSpec, ...] = (History(),)
    page_size: int = 4
    num_pages: int | None = 64
    vocab: int = 1000
    num_state_pages: int | None = None
    plans: list[BatchPlan] = field(default_factory=list)
    keep_plans: bool = False
    layout: CacheLayout | None = None

    @property
    def runner_config(self) -> RunnerConfig:
        return RunnerConfig(
            vocab_size=self.vocab,
            page_size=self.page_size,
            cache_groups=self.groups,
            num_pages=self.num_pages,
            num_state_pages=self.num_state_pages,
        )

    def bind(self, layout: CacheLayout) -> None:
        if self.layout is not None:
            raise FakeRunnerBug("bind called twice")
        self.layout = layout
        # One arena for every group: a page is ps token slots, or (State) a state in slot 0.
        self.arena = np.full(layout.num_pages * layout.page_size, -1, dtype=np.int64)
        # The state region: (fold, last `tail` tokens) per page.
        self.states: list[tuple[int, tuple[int, ...]]] = [(0, ())] * max(1, layout.state_pages)
        self.tail = max((g.ratio for g in self.groups if isinstance(g, Compressed)), default=1)

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        if self.layout is None:
            raise FakeRunnerBug("forward before bind")
        if self.keep_plans:
            self.plans.append(plan)
        self._check_plan(plan)
        for gp in plan.cache_groups:
            for src, dst in zip(gp.copy_src.tolist(), gp.copy_dst.tolist(), strict=True):
                self._copy_page(src, dst)
        for spec, gp in zip(self.groups, plan.cache_groups, strict=True):
            if isinstance(spec, History | Window):
                self.arena[gp.append_slots] = plan.input_ids
        tails = [self._tail_in(plan, i) for i in range(plan.num_sequences)]
        for spec, gp in zip(self.groups, plan.cache_groups, strict=True):
            if isinstance(spec, Compressed):
                self._emit(plan, spec, gp, tails)
        out: list[int] = []
        for i in range(plan.num_sequences):
            lo, hi = int(plan.query_indptr[i]), int(plan.query_indptr[i + 1])
            parts: list[int] = []
            for spec, gp in zip(self.groups, plan.cache_groups, strict=True):
                if isinstance(spec, State):
                    parts.append(self._run_state(plan, gp, i, lo, hi))
                elif isinstance(spec, Compressed):
                    parts.append(self._read_entries(spec, gp, i, int(plan.total_lens[i])))
                else:
                    parts.append(self._read(spec, gp, i, int(plan.positions[hi - 1])))
            if plan.sample_rows[i]:
                out.append(_combine(parts) % self.vocab)
        ids = np.asarray(out, dtype=np.uint32)
        indptr = np.concatenate([[0], np.cumsum(plan.sample_rows)]).astype(np.uint32)
        return ForwardOutput(token_ids=ids, token_indptr=indptr, **fake_logprobs(plan, ids))

    # -- simulation -------------------------------------------------------------------------
    def _page_of(self, gp_ids: np.ndarray, lo: int, hi: int, start: int, pos: int) -> int:
        k = pos // self.page_size - start
        if not 0 <= k < hi - lo:
            raise FakeRunnerBug(f"position {pos} is outside the row's pages")
        page = int(gp_ids[lo + k])
        if not 0 <= page < self.layout.num_pages:  # type: ignore[union-attr]
            raise FakeRunnerBug(f"page id {page} out of range")
        return page

    def _read(self, spec: History | Window, gp: object, i: int, p: int) -> int:
        ps = self.page_size
        lo, hi = int(gp.page_indptr[i]), int(gp.page_indptr[i + 1])  # type: ignore[attr-defined]
        start = int(gp.page_start[i])  # type: ignore[attr-defined]
        if isinstance(spec, History) and start != 0:
            raise FakeRunnerBug("History rows start at page 0")
        first = 0 if isinstance(spec, History) else max(0, p - spec.size + 1)
        ctx = [
            int(self.arena[self._page_of(gp.page_ids, lo, hi, start, q) * ps + q % ps])  # type: ignore[attr-defined]
            for q in range(first, p + 1)
        ]
        return _digest(ctx)

    def _run_state(self, plan: BatchPlan, gp: object, i: int, lo: int, hi: int) -> int:
        sin, sout = int(gp.state_in[i]), int(gp.state_out[i])  # type: ignore[attr-defined]
        if sin == sout:
            raise FakeRunnerBug("state_in must differ from state_out")
        state, recent = (0, ()) if sin < 0 else self.states[sin]
        cps = gp.checkpoint_indptr  # type: ignore[attr-defined]
        checkpoints = {}
        if cps.size:
            for c in range(int(cps[i]), int(cps[i + 1])):
                checkpoints[int(gp.checkpoint_token[c])] = int(gp.checkpoint_page[c])  # type: ignore[attr-defined]
        for t in range(lo, hi):
            state = fold_state(state, int(plan.input_ids[t]))
            recent = (*recent, int(plan.input_ids[t]))[-self.tail :]
            if t in checkpoints:
                self.states[checkpoints[t]] = (state, recent)
        self.states[sout] = (state, recent)
        return state

    def _tail_in(self, plan: BatchPlan, i: int) -> dict[int, int]:
        """Row i's known tokens by position: the State's pending tail, then this step's."""
        known: dict[int, int] = {}
        cached = int(plan.cached_lens[i])
        for spec, gp in zip(self.groups, plan.cache_groups, strict=True):
            if isinstance(spec, State):
                sin = int(gp.state_in[i])
                recent = () if sin < 0 else self.states[sin][1]
                for k, tok in enumerate(recent):
                    known[cached - len(recent) + k] = tok
                break
        lo, hi = int(plan.query_indptr[i]), int(plan.query_indptr[i + 1])
        for t in range(lo, hi):
            known[int(plan.positions[t])] = int(plan.input_ids[t])
        return known

    def _entry_index(self, spec: Compressed, slot: int) -> int:
        e = spec.entries_per_page(self.page_size)
        page = slot // e
        if not 0 <= page < self.layout.num_pages:  # type: ignore[union-attr]
            raise FakeRunnerBug(f"entry page {page} out of range")
        return page * self.page_size + slot % e

    def _emit(
        self, plan: BatchPlan, spec: Compressed, gp: object, tails: list[dict[int, int]]
    ) -> None:
        r = spec.ratio
        indptr = gp.entry_indptr  # type: ignore[attr-defined]
        for i in range(plan.num_sequences):
            first = int(plan.cached_lens[i]) // r
            for j, e in enumerate(range(int(indptr[i]), int(indptr[i + 1]))):
                w = first + j
                if int(plan.positions[int(gp.entry_token[e])]) != (w + 1) * r - 1:  # type: ignore[attr-defined]
                    raise FakeRunnerBug("entry_token is not the token completing the block")
                try:
                    block = [tails[i][q] for q in range(w * r, (w + 1) * r)]
                except KeyError:
                    raise FakeRunnerBug("a completed block's tail is unknown") from None
                slot = int(gp.entry_slots[e])  # type: ignore[attr-defined]
                self.arena[self._entry_index(spec, slot)] = entry_value(block)

    def _read_entries(self, spec: Compressed, gp: object, i: int, total: int) -> int:
        e = spec.entries_per_page(self.page_size)
        lo, hi = int(gp.page_indptr[i]), int(gp.page_indptr[i + 1])  # type: ignore[attr-defined]
        if int(gp.page_start[i]) != 0 or hi - lo != -(-(total // spec.ratio) // e):  # type: ignore[attr-defined]
            raise FakeRunnerBug("a Compressed row lists the pages of its complete entries")
        values = []
        for w in range(total // spec.ratio):
            page = int(gp.page_ids[lo + w // e])  # type: ignore[attr-defined]
            values.append(int(self.arena[self._entry_index(spec, page * e + w % e)]))
        return _digest(values)

    def _copy_page(self, src: int, dst: int) -> None:
        ps = self.page_size
        self.arena[dst * ps : (dst + 1) * ps] = self.arena[src * ps : (src + 1) * ps]

    def _check_plan(self, plan: BatchPlan) -> None:
        b = plan.num_sequences
        if b < 1 or plan.num_tokens < b:
            raise FakeRunnerBug("empty plan")
        if plan.phase is Phase.DECODE and not np.all(plan.query_lens == 1):
            raise FakeRunnerBug("decode rows have one query token")
        exp = np.concatenate(
            [np.arange(c, t) for c, t in zip(plan.cached_lens, plan.total_lens, strict=True)]
        )
        if not np.array_equal(exp, plan.positions):
            raise FakeRunnerBug("positions disagree with cached/total lens")
        for name in ("input_ids", "positions", "query_indptr"):
            if getattr(plan, name).flags.writeable:
                raise FakeRunnerBug(f"plan.{name} is writeable")
        for spec, gp in zip(self.groups, plan.cache_groups, strict=True):
            if isinstance(spec, Compressed):
                self._check_entries(plan, spec, gp)
            if not isinstance(spec, History | Window):
                continue
            if gp.append_slots.shape != (plan.num_tokens,):
                raise FakeRunnerBug("one append slot per query token")
            rows = np.repeat(np.arange(b), plan.query_lens)
            page = gp.append_slots // self.page_size
            k = plan.positions // self.page_size - gp.page_start[rows]
            idx = gp.page_indptr[rows] + k
            if (k < 0).any() or (idx >= gp.page_indptr[rows + 1]).any():
                raise FakeRunnerBug("append slot outside the row's pages")
            if not np.array_equal(gp.page_ids[idx], page):
                raise FakeRunnerBug("append slot page differs from the row's page")
            if not np.array_equal(
                gp.append_slots % self.page_size, plan.positions % self.page_size
            ):
                raise FakeRunnerBug("append slot offset differs from position")
            if np.unique(gp.append_slots).size != plan.num_tokens:
                raise FakeRunnerBug("two query tokens share an append slot")
            if isinstance(spec, Window):  # the first query token must see its whole window
                oldest = np.maximum(plan.cached_lens - spec.size + 1, 0) // self.page_size
                if (gp.page_start > oldest).any():
                    raise FakeRunnerBug("a Window row starts after the first query's window")

    def _check_entries(self, plan: BatchPlan, spec: Compressed, gp: object) -> None:
        r, e = spec.ratio, spec.entries_per_page(self.page_size)
        want = plan.total_lens // r - plan.cached_lens // r
        if not np.array_equal(np.diff(gp.entry_indptr), want):  # type: ignore[attr-defined]
            raise FakeRunnerBug("entry_indptr disagrees with the blocks completed")
        slots = gp.entry_slots  # type: ignore[attr-defined]
        if np.unique(slots).size != slots.size or gp.append_slots.size:  # type: ignore[attr-defined]
            raise FakeRunnerBug("entries share a slot, or a Compressed group has append slots")
        for row in range(plan.num_sequences):
            lo = int(gp.page_indptr[row])  # type: ignore[attr-defined]
            first = int(plan.cached_lens[row]) // r
            for j, k in enumerate(range(int(gp.entry_indptr[row]), int(gp.entry_indptr[row + 1]))):  # type: ignore[attr-defined]
                w, slot = first + j, int(slots[k])
                if slot != int(gp.page_ids[lo + w // e]) * e + w % e:  # type: ignore[attr-defined]
                    raise FakeRunnerBug("an entry slot is not its entry's place in the row")


def fake_logprob(token: int) -> float:
    """The fake model's logprob of `token` (deterministic, so tests can check alignment)."""
    return -0.25 * (token % 9) - 0.125


def fake_logprobs(plan: BatchPlan, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Logprob columns for a plan: chosen token, top-k alternatives (ids t+1, t+2, ...),
    prompt-token logprobs of `target_ids` (NaN where there is no target)."""
    out: dict[str, np.ndarray] = {}
    if plan.sampling.max_logprobs >= 0:
        out["logprobs"] = np.asarray([fake_logprob(int(t)) for t in ids], dtype=np.float32)
        k = max(plan.sampling.max_logprobs, 1)
        top = ids.astype(np.int32)[:, None] + np.arange(1, k + 1, dtype=np.int32)
        out["top_ids"] = top
        out["top_logprobs"] = np.vectorize(fake_logprob, otypes=[np.float32])(top)
    if plan.prompt_logprob_rows.any():
        t = plan.target_ids
        lp = np.vectorize(fake_logprob, otypes=[np.float32])(np.maximum(t, 0))
        out["prompt_logprobs"] = np.where(t >= 0, lp, np.nan).astype(np.float32)
        k = max(int(plan.sampling.prompt_logprobs.max(initial=0)), 1)
        top = np.maximum(t, 0)[:, None] + np.arange(1, k + 1, dtype=np.int32)
        out["prompt_top_ids"] = top.astype(np.int32)
        out["prompt_top_logprobs"] = np.vectorize(fake_logprob, otypes=[np.float32])(top)
    return out


class ZeroRunner:
    """The one-method runner from the README: always token 0."""

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        return ForwardOutput(
            token_ids=np.zeros(plan.num_sequences, dtype=np.uint32),
            token_indptr=np.arange(plan.num_sequences + 1, dtype=np.uint32),
        )


class SampleZeroRunner:
    """Token 0 for every sampling row, nothing for partial prefill chunks."""

    def forward(self, plan: BatchPlan) -> ForwardOutput:
        indptr = np.zeros(plan.num_sequences + 1, dtype=np.uint32)
        np.cumsum(plan.sample_rows, out=indptr[1:])
        return ForwardOutput(np.zeros(int(indptr[-1]), dtype=np.uint32), indptr)
