"""Fake runners for the engine's own tests, and the naive loop they must agree with.

`CacheSimRunner` simulates a model *through the cache only*: it writes every query token at its
append slot in one shared arena (all groups share it, like the real one), reads the context back
through the plan's page rows, and derives the next token from what it read:
- History: a hash of every token at positions 0..p;
- Window(W): a hash of the tokens at positions (p - W, p];
- State: a running fold over all tokens, carried in State pages (state_in -> state_out,
  checkpoints stored where the plan asks, copy-on-write copies done first).
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

MASK64 = (1 << 64) - 1


class FakeRunnerBug(AssertionError):
    """The plan asked the fake runner for something impossible (an engine bug)."""


def _digest(values: Sequence[int]) -> int:
    data = np.asarray(values, dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


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
        )

    def bind(self, layout: CacheLayout) -> None:
        if self.layout is not None:
            raise FakeRunnerBug("bind called twice")
        self.layout = layout
        # One arena for every group: a page is ps token slots, or (State) a state in slot 0.
        self.arena = np.full(layout.num_pages * layout.page_size, -1, dtype=np.int64)
        self.states = np.zeros(layout.num_pages, dtype=np.uint64)

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
            if not isinstance(spec, State):
                self.arena[gp.append_slots] = plan.input_ids
        out: list[int] = []
        for i in range(plan.num_sequences):
            lo, hi = int(plan.query_indptr[i]), int(plan.query_indptr[i + 1])
            parts: list[int] = []
            for spec, gp in zip(self.groups, plan.cache_groups, strict=True):
                if isinstance(spec, State):
                    parts.append(self._run_state(plan, gp, i, lo, hi))
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
        state = 0 if sin < 0 else int(self.states[sin])
        cps = gp.checkpoint_indptr  # type: ignore[attr-defined]
        checkpoints = {}
        if cps.size:
            for c in range(int(cps[i]), int(cps[i + 1])):
                checkpoints[int(gp.checkpoint_token[c])] = int(gp.checkpoint_page[c])  # type: ignore[attr-defined]
        for t in range(lo, hi):
            state = fold_state(state, int(plan.input_ids[t]))
            if t in checkpoints:
                self.states[checkpoints[t]] = np.uint64(state)
        self.states[sout] = np.uint64(state)
        return state

    def _copy_page(self, src: int, dst: int) -> None:
        ps = self.page_size
        self.arena[dst * ps : (dst + 1) * ps] = self.arena[src * ps : (src + 1) * ps]
        self.states[dst] = self.states[src]

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
            if isinstance(spec, State):
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
