"""Next-step grammar masks filled off the engine thread, for runners that cannot wait for a
mask (no `RunnerConfig.waits_for_masks`; a runner that can overlaps the fill with its own
forward instead, `constraints.py`).

After each commit the engine hands `MasksAhead.start` the step's requests: the next mask of
every one decoding under a live grammar fills on one worker thread (llguidance releases the
GIL) while the engine goes on. Before the next step `hold` waits for them at most
`MASK_WAIT_S` (not at all once a fill took longer) and names the requests whose masks are
still filling: they sit that step out (`Scheduler.held`) and rejoin with their masks ready,
so a costly grammar slows its own requests, never the unconstrained rows. When they are all
that could run, `hold` waits for their masks instead. Invariant: a grammar state is never
read by the worker and touched by the engine thread at once (`join` before any other use).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from resin.engine.grammar import GrammarBackend, GrammarState
from resin.engine.request import Request, Status

MASK_WAIT_S = 0.002
"""How long a step waits for masks still filling before their requests sit it out (the
per-step mask budget of runners that cannot wait for masks)."""


@dataclass(frozen=True, slots=True)
class _Fill:
    """Row i of `masks` is `requests[i]`'s mask after `consumed[i]` tokens."""

    requests: tuple[Request, ...]
    consumed: tuple[int, ...]
    masks: np.ndarray
    done: Future[None]


class MasksAhead:
    def __init__(self, backend: GrammarBackend, mask_words: int, pool: ThreadPoolExecutor) -> None:
        self.backend = backend
        self.mask_words = mask_words
        self.pool = pool
        self._fills: deque[_Fill] = deque()
        self._ready: dict[Request, tuple[int, np.ndarray]] = {}
        """Masks a finished fill left: request -> (tokens consumed then, mask row)."""
        self._slow = False  # the last fill took longer than MASK_WAIT_S

    def start(self, requests: Sequence[Request]) -> None:
        """Fill the next mask of each of `requests` that decodes under a live grammar."""
        live = tuple(
            r
            for r in requests
            if r.status is Status.DECODE
            and (g := r.grammar) is not None
            and g.error is None
            and not g.stopped
        )
        if not live:
            return
        states = [r.grammar for r in live if r.grammar is not None]
        masks = np.zeros((len(live), self.mask_words), dtype=np.int32)
        done = self.pool.submit(self._fill, states, masks)
        self._fills.append(_Fill(live, tuple(g.consumed for g in states), masks, done))

    def _fill(self, states: list[GrammarState], masks: np.ndarray) -> None:
        start = time.perf_counter()
        self.backend.fill_masks(states, masks)
        # Slow fills: the next steps do not wait at all (they would only pay the wait); fast
        # ones: they wait up to MASK_WAIT_S, so cheap grammars never sit a step out.
        self._slow = time.perf_counter() - start > MASK_WAIT_S

    def hold(self, running: Sequence[Request], others: bool) -> frozenset[Request]:
        """The decode requests that sit out the next step (their masks are still filling);
        when they are all that could run (`others`: waiting or prefilling requests), none:
        the masks are waited for."""
        if not self._fills:
            return frozenset()
        pending = self._pending()
        everyone = all(r in pending for r in running)  # no decode row could run without them
        if everyone and not others:
            self.collect(None)
        else:  # with nothing else to decode, wait a little anyway: never a busy loop
            self.collect(MASK_WAIT_S if everyone or not self._slow else 0.0)
        return frozenset(self._pending())

    def _pending(self) -> set[Request]:
        return {r for f in self._fills for r in f.requests}

    def collect(self, timeout: float | None) -> None:
        """Keep the masks of finished fills, oldest first, waiting up to `timeout` seconds in
        all (None: every fill). A failed fill is dropped: its rows fill inline, where the
        error surfaces."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._fills:
            fill = self._fills[0]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not wait([fill.done], left).done:
                return
            self._fills.popleft()
            if fill.done.exception() is None:
                for i, r in enumerate(fill.requests):
                    self._ready[r] = (fill.consumed[i], fill.masks[i])

    def join(self, requests: Sequence[Request]) -> None:
        """Wait for the fills that read any of `requests`' grammars."""
        if self._fills and not self._pending().isdisjoint(requests):
            self.collect(None)

    def take(self, requests: Sequence[Request], rows: list[int], base: np.ndarray) -> list[int]:
        """Copy the masks filled ahead for `rows` into `base`; the rows still to fill."""
        self.join([requests[i] for i in rows])
        if not self._ready:
            return rows
        left = []
        for i in rows:
            r = requests[i]
            ready = self._ready.pop(r, None)
            if ready is not None and r.grammar is not None and ready[0] == r.grammar.consumed:
                base[i] = ready[1]
            else:
                left.append(i)
        return left

    def forget(self, request: Request) -> None:
        self._ready.pop(request, None)
