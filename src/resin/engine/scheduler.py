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
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from resin.cache.manager import CacheManager
from resin.cache.matching import NO_MATCH, Match
from resin.engine.media import chunk_end
from resin.engine.request import Request, Status
from resin.engine.slots import SlotStore
from resin.plan import Phase

I32 = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_batch_tokens: int
    max_sequences: int
    prefill_chunk_tokens: int
    max_prefill_streak: int = 4
    """Consecutive prefill steps allowed while decodes wait."""
    max_decode_wait_s: float = 0.5
    """...or seconds since the last decode step, whichever comes first."""


@dataclass(frozen=True, slots=True)
class Cohort:
    """The requests of one step: row i computes positions `cached[i] .. totals[i] - 1` of
    `requests[i]`, whose slot is `slots[i]` (decode: one token per row)."""

    phase: Phase
    requests: tuple[Request, ...]
    slots: I32
    cached: I32
    totals: I32


class Scheduler:
    """Owns the queues and slots; asks the `CacheManager` for capacity."""

    def __init__(self, config: SchedulerConfig, cache: CacheManager, arrays: SlotStore) -> None:
        self.config = config
        self.cache = cache
        self.arrays = arrays
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
        watermark = max(1, cache.pool.num_pages // 100)
        self._watermark = watermark
        self.held: Collection[Request] = ()
        """Running requests the next decode cohort leaves out (the engine's constraints set
        it: their grammar masks are still filling off the engine thread)."""

    @property
    def num_admitted(self) -> int:
        return len(self.prefilling) + len(self.running)

    def add(self, request: Request) -> None:
        """Queue a new request; its arrival order is what retraction ranks by."""
        request.arrival = self._arrivals
        self._arrivals += 1
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

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
        outstanding = sum(self._outstanding(r) for r in self.prefilling)
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
        return chunk_end(request.media, int(self.arrays.num_computed[request.slot]), n)

    def _remaining(self, request: Request) -> int:
        return request.num_tokens - int(self.arrays.num_computed[request.slot])

    def _outstanding(self, request: Request) -> int:
        """Pages an admitted prefill may still take before its known tokens are computed."""
        cache, chunk = self.cache, self.config.prefill_chunk_tokens
        return max(
            0,
            cache.pages_per_sequence(request.num_tokens, chunk)
            - cache.pages_per_sequence(int(self.arrays.num_computed[request.slot]), chunk),
        )

    def _admissible(self, request: Request, outstanding: int) -> Match | None:
        """The prefix match to admit the request with, if the cache can take it now with
        headroom (a hit whose locked pages cost more than they save is dropped), else None.
        `outstanding`: pages admitted prefills may still take."""
        match = (
            NO_MATCH  # its prompt logits are needed: compute every prompt token
            if request.sampling_params.prompt_logprobs is not None
            else self.cache.match(request.cache_keys(request.num_tokens))
        )
        if self._fits(request, match, outstanding):
            return match
        if match.nodes and self._fits(request, NO_MATCH, outstanding):
            return NO_MATCH
        return None

    def _fits(self, request: Request, match: Match, outstanding: int) -> bool:
        cache = self.cache
        need = cache.pages_per_sequence(request.num_tokens, self.config.prefill_chunk_tokens)
        spare = (
            cache.available()
            - cache.lock_cost(match)
            - outstanding
            - (need - cache.hit_pages(match))
        )
        if self.num_admitted == 0:
            return spare >= 0  # alone it must be able to run, or nothing ever would
        return spare >= self._watermark + len(self.running) * len(cache.groups)

    def _admit(self, request: Request, match: Match) -> None:
        request.slot = self.free_slots.pop()
        request.status = Status.PREFILL
        n = request.num_tokens
        hit = self.cache.admit(request.slot, n, match)
        request.cached_tokens = hit
        self.arrays.admit(
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
        cached = self.arrays.position(slots)
        totals = cached + 1
        if self.cache.pages_to_allocate(slots, cached, totals, False) <= self.cache.available():
            return Cohort(Phase.DECODE, tuple(chosen), slots, cached, totals)
        return self._fit(Phase.DECODE, list(chosen), [1] * len(chosen))

    # -- retraction -----------------------------------------------------------------------
    def _fit(self, phase: Phase, chosen: list[Request], chunks: list[int]) -> Cohort | None:
        """Retract the youngest admitted requests until the cohort's new pages fit."""
        while chosen:
            slots = np.fromiter((r.slot for r in chosen), dtype=np.int32, count=len(chosen))
            lens = self.arrays.position(slots)
            totals = lens + np.asarray(chunks, dtype=np.int32)
            need = self.cache.pages_to_allocate(slots, lens, totals, phase is Phase.PREFILL)
            if need <= self.cache.available():
                return Cohort(phase, tuple(chosen), slots, lens, totals)
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
        self._drop(request)
        request.status = Status.WAITING
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _drop(self, request: Request, cacheable: bool = True) -> None:
        if request.status is Status.PREFILL:
            self.prefilling.remove(request)
        elif request.status is Status.DECODE:
            self.running.remove(request)
            self._decode_slots = None
        elif request.status is Status.WAITING:
            self.waiting.remove(request)
        if request.slot >= 0:
            n = int(self.arrays.num_computed[request.slot])
            self.cache.release(request.slot, request.cache_keys(n) if cacheable else None)
            self.arrays.release(request.slot)
            self.free_slots.append(request.slot)
            request.slot = -1

    def finish(self, request: Request, cacheable: bool = True) -> None:
        """Remove a request from whatever queue holds it and free its pages."""
        self._drop(request, cacheable)
        request.status = Status.FINISHED

    def admitted(self) -> list[Request]:
        return self.prefilling + self.running
