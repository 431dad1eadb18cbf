"""Which requests run in the next step, and in which phase.

Policy (sticky continuous batching, phase-homogeneous steps):
- Prefill has priority, but after `max_prefill_streak` consecutive prefill steps with decodes
  waiting, or when decodes waited `max_decode_wait_s` since the last decode step, one decode
  step runs (the queue-age rule: decode is never starved by a stream of new prompts).
- A prefill step first continues admitted requests' chunks (sticky), then admits waiting ones in
  arrival order while the token budget (`max_batch_tokens`), the sequence cap and the cache
  allow. Long prompts are split into chunks of at most `prefill_chunk_tokens`.
- Admission never over-commits: a request is admitted only when the cache can hold all its known
  tokens on top of what admitted prefills still need, plus headroom (a page per running
  sequence and group, and a 1% watermark) for running decodes to grow.
- When a step's new pages do not fit anyway (decodes grew), the youngest admitted request is
  retracted: its pages are freed, it keeps its generated tokens and goes back to the head of the
  queue to recompute later. Victims are always the youngest, so the oldest keeps making
  progress, and the headroom rule keeps a retracted request out until it fits again: no thrash.

Ownership: the scheduler is the one owner of the `CacheManager`, the `SlotStore` and every
request's progress (its tokens, status, slot, retries, outcome), and the one table of live
requests. Every page operation and every progress write goes through it: admission
(`schedule`), `reserve` (a `ReservedCohort`: the cohort, its pages and its plan rows), `commit`
(a validated step: the stop rule, the cache, the slot store and the requests take it),
`launched` (an overlapped plan is in flight), `retried`, `rollback` / `abandon` (a failed
step), `retract` and `drop` (a request leaves: its slot and pages are freed). Other engine
modules never see the cache and hand the scheduler results (`tests/test_ownership.py`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from resin.cache.manager import CacheManager, PageReservation, Pages
from resin.cache.matching import NO_MATCH, Match
from resin.cache.pool import OutOfPagesError
from resin.engine.engine_config import EngineConfig
from resin.engine.media import chunk_end
from resin.engine.request import Request, Status
from resin.engine.slots import SlotStore
from resin.events import FinishReason
from resin.plan import BatchPlan, CacheGroupPlan, ForwardOutput, Phase
from resin.protocols import CacheLayout

I32 = npt.NDArray[np.int32]

_OUTPUT = attrgetter("output_token_ids")
_RETRIES = attrgetter("retries")


class Committed(NamedTuple):
    """What `Scheduler.commit` recorded, for the step's events: row i kept `kept[i]` tokens,
    `tokens[offsets[i]:offsets[i] + kept[i]]` (`offsets` / `kept` None: one token per row,
    token i); `ends`: {row: reason} for the rows that end (the caller finishes them)."""

    tokens: list[int]
    offsets: list[int] | None
    kept: list[int] | None
    ends: dict[int, FinishReason]


@dataclass(frozen=True, slots=True)
class Cohort:
    """The requests of one step: row i computes positions `cached[i] .. totals[i] - 1` of
    `requests[i]`, whose slot is `slots[i]` (decode: one token per row)."""

    phase: Phase
    requests: tuple[Request, ...]
    slots: I32
    cached: I32
    totals: I32


@dataclass(frozen=True, slots=True)
class ReservedCohort:
    """A cohort whose pages are reserved: what one step computes, laid out for its plan.

    Query tokens are flat: row i's are `query_indptr[i] .. query_indptr[i+1] - 1`, at
    `positions`; `cache_groups` are the plan's rows per cache group (pages, append slots for
    every query token, State slots and checkpoints); `pages` is what `reserve` took."""

    cohort: Cohort
    pages: PageReservation
    query_indptr: I32
    positions: I32
    cache_groups: tuple[CacheGroupPlan, ...]

    @property
    def slots(self) -> I32:
        return self.cohort.slots

    @property
    def requests(self) -> tuple[Request, ...]:
        return self.cohort.requests


class CacheUsage(NamedTuple):
    """The cache's gauges (`Engine.metrics`)."""

    live: float
    """Pages held by live requests, 0-1 (evictable prefix-cache pages not counted)."""
    prefix: float
    """Pages held only by the prefix cache (evictable on demand), 0-1."""
    prefix_queries: int
    prefix_hits: int


class Scheduler:
    """Owns the live requests, their queues and slots, the `SlotStore` and the
    `CacheManager` (see the module docstring)."""

    def __init__(self, config: EngineConfig, layout: CacheLayout) -> None:
        self.config = config
        self.cache = CacheManager(
            layout,
            config.max_sequences,
            config.page_table_width(layout.page_size),
            prefix_cache=config.prefix_cache,
        )
        self.slot_store = SlotStore(config.max_sequences, config.context_length)
        self.live: dict[int, Request] = {}
        """Every request submitted and not finished, by id (queued or admitted)."""
        self._decode_slots: I32 | None = None
        """Slots of `running` in order, cached while `running` does not change."""
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.running: list[Request] = []
        self.free_slots = list(range(config.max_sequences - 1, -1, -1))
        self.prefill_streak = 0
        self._last_decode = time.monotonic()
        self.num_preemptions = 0
        self._arrivals = 0
        growing = self.cache.growing_groups > 0
        self._watermark = np.where(growing, np.maximum(1, self.cache.capacity // 100), 0)
        """Pages (per pool) kept free for running requests' growth when admitting; none in a
        pool whose pages never grow (the state region: rings are taken at admission)."""
        self.held: Collection[Request] = ()
        """Running requests the next decode cohort leaves out (the engine's constraints set
        it: their grammar masks are still filling off the engine thread)."""

    @property
    def num_admitted(self) -> int:
        return len(self.prefilling) + len(self.running)

    def add(self, request: Request) -> None:
        """Register and queue a new request; its arrival order is what retraction ranks by."""
        request.times.arrival = time.monotonic()
        request.arrival = self._arrivals
        self._arrivals += 1
        self.live[request.id] = request
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def hold(self, requests: Collection[Request]) -> None:
        """Running requests the next decode cohort leaves out (`held`)."""
        self.held = requests

    # -- the step decision ----------------------------------------------------------------
    def schedule(self) -> Cohort | None:
        decode_waiting = bool(self.running)
        starve = decode_waiting and (
            self.prefill_streak >= self.config.max_prefill_streak
            or time.monotonic() - self._last_decode > self.config.max_decode_wait_s
        )
        if not starve and (self.prefilling or self.waiting):
            cohort = self._prefill_cohort()
            if cohort is not None:
                self.prefill_streak = self.prefill_streak + 1 if decode_waiting else 0
                return cohort
        self.prefill_streak = 0
        if self.running:
            self._last_decode = time.monotonic()
            return self._decode_cohort()
        return None

    # -- prefill --------------------------------------------------------------------------
    def _prefill_cohort(self) -> Cohort | None:
        budget = self.config.max_batch_tokens
        chosen: list[Request] = []
        chunks: list[int] = []
        for request in self.prefilling:
            if budget <= 0:
                break
            n = self._chunk(request, budget)
            if n == 0:
                continue
            chosen.append(request)
            chunks.append(n)
            budget -= n
        outstanding = sum((self._outstanding(r) for r in self.prefilling), self._no_pages())
        while budget > 0 and self.waiting and self.free_slots:
            match = self._admissible(self.waiting[0], outstanding)
            if match is None:
                break
            request = self.waiting.popleft()
            self._admit(request, match)
            outstanding += self._outstanding(request)
            n = self._chunk(request, budget)
            if n == 0:
                continue
            chosen.append(request)
            chunks.append(n)
            budget -= n
        if not chosen:
            return None
        return self._fit(Phase.PREFILL, chosen, chunks)

    def _chunk(self, request: Request, budget: int) -> int:
        n = min(self._remaining(request), self.config.prefill_chunk_tokens, budget)
        if not request.media:
            return n
        return chunk_end(request.media, int(self.slot_store.num_computed[request.slot]), n)

    def _remaining(self, request: Request) -> int:
        return request.num_tokens - int(self.slot_store.num_computed[request.slot])

    def _no_pages(self) -> Pages:
        return np.zeros_like(self._watermark)

    def _outstanding(self, request: Request) -> Pages:
        """Pages an admitted prefill may still take before its known tokens are computed: its
        peak (`max_pages_for`) less what it holds now (a Window after a prefix hit or a slide
        holds fewer pages than the bound for its length)."""
        cache = self.cache
        more: Pages = cache.max_pages_for(
            request.num_tokens, self.config.prefill_chunk_tokens
        ) - cache.held(request.slot)
        np.maximum(more, 0, out=more)
        return more

    def _admissible(self, request: Request, outstanding: Pages) -> Match | None:
        """The prefix match to admit the request with, if the cache can take it now with
        headroom (a hit whose locked pages cost more than they save is dropped), else None.
        `outstanding`: pages admitted prefills may still take."""
        match = (
            NO_MATCH  # its prompt logits are needed: compute every prompt token
            if request.sampling_params.prompt_logprobs is not None
            else self.cache.match(request.cache_keys(request.num_tokens))
        )
        if self._room_for(request, match, outstanding):
            return match
        if match.nodes and self._room_for(request, NO_MATCH, outstanding):
            return NO_MATCH
        return None

    def _room_for(self, request: Request, match: Match, outstanding: Pages) -> bool:
        cache = self.cache
        need = cache.max_pages_for(request.num_tokens, self.config.prefill_chunk_tokens)
        spare = (
            cache.available()
            - cache.lock_cost(match)
            - outstanding
            - (need - cache.hit_pages(match))
        )
        if self.num_admitted == 0:
            return bool((spare >= 0).all())  # alone it must be able to run, or nothing would
        headroom = self._watermark + len(self.running) * cache.growing_groups
        return bool((spare >= headroom).all())

    def _admit(self, request: Request, match: Match) -> None:
        request.slot = self.free_slots.pop()
        request.status = Status.PREFILL
        n = request.num_tokens
        hit = self.cache.admit(request.slot, n, match)
        request.cached_tokens = hit
        self.slot_store.admit(
            request.slot,
            request.id,
            request.sampling_params,
            request.num_prompt_tokens,
            request.output_token_ids,
            int(request.token_array(n)[n - 1]),
            hit,
        )
        if request.times.admitted == 0.0:
            request.times.admitted = time.monotonic()
        if not request.started and request.prompt_lp is not None:
            request.prompt_lp.clear()
        self.prefilling.append(request)

    def prefill_done(self, request: Request) -> None:
        """The request's last known token was computed: it decodes from now on."""
        self.prefilling.remove(request)
        request.status = Status.DECODE
        if not self.running:
            self._last_decode = time.monotonic()  # decode waits from now, not from idle time
        self.running.append(request)
        self._decode_slots = None

    # -- decode ---------------------------------------------------------------------------
    def _decode_cohort(self) -> Cohort | None:
        chosen = self.running[: self.config.max_batch_tokens]
        if self.held:  # they sit this step out (their grammar masks are still filling)
            chosen = [r for r in chosen if r not in self.held]
            self._decode_slots = None
            if not chosen:
                return None
        if self._decode_slots is None or self._decode_slots.size != len(chosen):
            self._decode_slots = np.fromiter(
                (r.slot for r in chosen), dtype=np.int32, count=len(chosen)
            )
        slots = self._decode_slots
        cached = self.slot_store.position(slots)
        cohort = Cohort(Phase.DECODE, tuple(chosen), slots, cached, cached + 1)
        if self.fits(cohort):
            return cohort
        return self._fit(Phase.DECODE, list(chosen), [1] * len(chosen))

    # -- retraction -----------------------------------------------------------------------
    def _fit(self, phase: Phase, chosen: list[Request], chunks: list[int]) -> Cohort | None:
        """Retract the youngest admitted requests until the cohort's new pages fit."""
        while chosen:
            slots = np.fromiter((r.slot for r in chosen), dtype=np.int32, count=len(chosen))
            lens = self.slot_store.position(slots)
            totals = lens + np.asarray(chunks, dtype=np.int32)
            cohort = Cohort(phase, tuple(chosen), slots, lens, totals)
            if self.fits(cohort):
                return cohort
            victim = self.youngest()
            if victim in chosen:
                i = chosen.index(victim)
                del chosen[i]
                del chunks[i]
            self.retract(victim)
        return None

    def youngest(self) -> Request:
        return max(self.prefilling + self.running, key=lambda r: r.arrival)

    def retract(self, request: Request) -> None:
        """Free the request's pages; it keeps its tokens and waits at the head of the queue."""
        self._free(request)
        request.status = Status.WAITING
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def drop(
        self,
        request: Request,
        reason: FinishReason,
        error: str | None = None,
        cacheable: bool = True,
    ) -> None:
        """The request ends with `reason` (`Lifecycle.finish` is the one caller): out of the
        live table and its queue, its slot and pages freed (`cacheable=False`: nothing enters
        the prefix cache)."""
        self._free(request, cacheable)
        self.live.pop(request.id, None)
        request.status = Status.FINISHED
        request.finish_reason = reason
        request.error = error

    def _free(self, request: Request, cacheable: bool = True) -> None:
        if request.status is Status.PREFILL:
            self.prefilling.remove(request)
        elif request.status is Status.DECODE:
            self.running.remove(request)
            self._decode_slots = None
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        if request.slot >= 0:
            n = int(self.slot_store.num_computed[request.slot])
            self.cache.release(request.slot, request.cache_keys(n) if cacheable else None)
            self.slot_store.release(request.slot)
            self.free_slots.append(request.slot)
            request.slot = -1

    def admitted(self) -> list[Request]:
        return self.prefilling + self.running

    # -- pages: every step's transaction goes through here ----------------------------------
    def fits(self, cohort: Cohort) -> bool:
        """Whether the cohort's new pages can be reserved now."""
        c = cohort
        need = self.cache.pages_to_allocate(c.slots, c.cached, c.totals, c.phase is Phase.PREFILL)
        return bool((need <= self.cache.available()).all())

    def reserve(self, cohort: Cohort) -> ReservedCohort | None:
        """Reserve the cohort's pages and lay out its plan rows; None when they did not fit
        after all (the estimate was short: a bug, not worth a crash), in which case the
        youngest request was retracted to make room for the next step."""
        c = cohort
        try:
            pages = self.cache.reserve(c.slots, c.cached, c.totals, c.phase is Phase.PREFILL)
        except OutOfPagesError:
            self.retract(self.youngest())
            return None
        indptr, positions, token_slots = _query_layout(c)
        groups = self.cache.group_plans(pages, c.cached, c.totals, token_slots, positions)
        return ReservedCohort(c, pages, indptr, positions, groups)

    def commit(
        self,
        requests: Sequence[Request],
        pages: PageReservation,
        plan: BatchPlan,
        out: ForwardOutput,
        *,
        landed: bool = False,
    ) -> Committed:
        """A validated step's results, row by row over the CSR output: a decode row is a
        verify row with k = 0 drafts, a prefill row samples one token or none. The slot store
        appends each row's tokens up to the first that ends it (the stop rule), the cache
        takes the positions kept (pages wholly past them go back first: rejected drafts; State
        rings flip, a prefill's full pages enter the prefix cache, Windows slide), each request
        takes its tokens and the drafts proposed to follow them, and a prefill whose last
        known token was computed decodes from now on. `landed`: an overlapped plan, whose rows
        were counted in flight (`SlotStore.ahead`)."""
        store, slots = self.slot_store, pages.slots
        if landed:
            store.landed(slots)
        ids = np.asarray(out.token_ids).astype(np.int32)
        toks: list[int] = ids.tolist()
        single = plan.phase is Phase.DECODE and not plan.draft_ids.size
        if single:  # k = 0 on every row: one token each, the whole batch at once
            kept, ends = store.append(slots, ids)
            totals = plan.total_lens
        else:
            counts = np.diff(np.asarray(out.token_indptr).astype(np.int64)).astype(np.int32)
            kept, ends = store.append(slots, ids, counts)
            assert kept is not None
            # In the cache now: every query token up to the input of the row's next step.
            short = np.where(plan.sample_rows, 1 + np.diff(plan.draft_indptr) - kept, 0)
            totals = (plan.total_lens - short).astype(np.int32)
            if short.any():
                self.cache.trim(pages, totals)
        keys: list[I32] = []
        if pages.prefill and self.config.prefix_cache:
            keys = [r.cache_keys(t) for r, t in zip(requests, totals.tolist(), strict=True)]
        self.cache.commit(pages, totals, keys)
        store.computed(slots, totals)
        if any(map(_RETRIES, requests)):
            for r in requests:
                r.retries = 0
        if kept is None:
            deque(map(list.append, map(_OUTPUT, requests), toks), maxlen=0)
            offsets = kept_list = None
        else:
            offsets = (np.cumsum(counts) - counts).tolist()
            kept_list = kept.tolist()
            for r, lo, n in zip(requests, offsets, kept_list, strict=True):
                if n:
                    r.output_token_ids.extend(toks[lo : lo + n])
        if out.draft_ids is not None and out.draft_indptr is not None:
            self._take_drafts(requests, out.draft_ids, out.draft_indptr)
        if plan.phase is Phase.PREFILL:
            for i in np.flatnonzero(plan.sample_rows).tolist():
                if i not in ends:
                    self.prefill_done(requests[i])
        return Committed(toks, offsets, kept_list, ends)

    def _take_drafts(self, requests: Sequence[Request], ids: object, indptr: object) -> None:
        """Each row's proposed drafts, following its sequence as committed."""
        flat: list[int] = np.asarray(ids).astype(np.int64).tolist()
        bounds: list[int] = np.asarray(indptr).astype(np.int64).tolist()
        for i, r in enumerate(requests):
            lo, hi = bounds[i], bounds[i + 1]
            r.drafts = (r.num_tokens, tuple(flat[lo:hi]))

    def retried(self, requests: Sequence[Request], max_retries: int) -> list[Request]:
        """The requests' step was refused: each counts a failed attempt; returns those past
        `max_retries` (they end; the others run again)."""
        for r in requests:
            r.retries += 1
        return [r for r in requests if r.retries > max_retries]

    def launched(self, slots: I32) -> None:
        """An overlapped plan of these slots was submitted (one more token each in flight)."""
        self.slot_store.launched(slots)

    def rollback(self, pages: PageReservation) -> None:
        """A step the runner never had: return exactly what `reserve` took."""
        self.cache.rollback(pages)

    def abandon(self, pages: PageReservation) -> None:
        """A step the runner had failed: free what only the step held (its requests are being
        quarantined, and their pages go with their slots)."""
        self.cache.abandon(pages)

    # -- read-only facts --------------------------------------------------------------------
    def max_pages_for(self, num_tokens: int) -> int:
        """Upper bound on the token pages a sequence of `num_tokens` tokens holds while
        computed (its State pages are a constant the state region always fits)."""
        return int(self.cache.max_pages_for(num_tokens, self.config.prefill_chunk_tokens)[0])

    def cached_prefix(self, keys: I32) -> int:
        """Tokens of `keys` the prefix cache holds now (a lock-free read: a routing hint)."""
        return self.cache.match(keys).tokens

    def cache_usage(self) -> CacheUsage:
        cache = self.cache
        return CacheUsage(
            cache.usage(), cache.prefix_usage(), cache.prefix_queries, cache.prefix_hits
        )

    def check_invariants(self) -> None:
        """Cache refcounts match what admitted requests (and the prefix trie) hold; every live
        request is in exactly one queue."""
        self.cache.check_invariants([r.slot for r in self.admitted()])
        for r in self.live.values():
            assert r.status is not Status.FINISHED
        queued = len(self.waiting) + self.num_admitted
        assert len(self.live) == queued, "a live request is in no queue"


def _query_layout(cohort: Cohort) -> tuple[I32, I32, I32]:
    """(query_indptr [B+1], positions [T], slot of each query token [T]) for the cohort's
    rows computing `cached[i] .. totals[i] - 1`."""
    slots, cached, totals = cohort.slots, cohort.cached, cohort.totals
    b = slots.size
    lens = totals - cached
    query_indptr = np.zeros(b + 1, dtype=np.int32)
    lens.cumsum(out=query_indptr[1:])
    t = int(query_indptr[-1])
    if t == b:  # one token per row (decode)
        return query_indptr, cached.copy(), slots
    positions = np.arange(t, dtype=np.int32) - np.repeat(query_indptr[:-1] - cached, lens)
    return query_indptr, positions.astype(np.int32), np.repeat(slots, lens)
