"""Constrained decoding in the engine: per-request grammar state, plan masks, commit hooks.

The engine calls three things, each a few lines at its call site:
- `admit(request)` at submit: compile (cached) and attach the request's `GrammarState`;
- `attach(plan, requests)` after planning: the plan's `SamplingArrays` gain the allowed-token
  bitmask of every constrained sampling row and the logit biases (CSR);
- `advance(requests, events)` after the commit: every constrained request's state consumes
  the tokens committed this step; a grammar that is complete finishes its request (`stop`),
  a token the grammar forbids (a runner that ignored the mask) finishes it with `error`.

Overlap: with a runner that declares `RunnerConfig.waits_for_masks`, a plan with at least
`OVERLAP_MIN_ROWS` constrained rows leaves `attach` with its mask still being filled on one
worker thread (llguidance releases the GIL while it computes); the runner runs the model and
waits (`SamplingArrays.bitmask()`) only when it samples. `advance` waits for that fill before it
moves any grammar state, so a matcher is never read and written at once.

Pipelined steps (`engine/pipeline.py`): a decode plan submitted while the step before it is
still in flight reads grammar states that step has not advanced yet, so `attach(gated=True)`
only reserves its mask; `open_gate` (after that step's commit and `advance`) fills it inline,
`discard_gate` drops it when the plan never runs. The runner defers that plan's masked
sampling until then (`waits_for_masks`). A state that stopped or failed meanwhile gets an
all-allowed row: its request ended, so the row's token is dropped and never consumed.

Zero overhead without constraints: the engine calls `attach` / `advance` only while `active`
(a live request has a grammar or a bias), so plain traffic never enters this module.
Retraction keeps a request's generated tokens (the recompute path re-prefills them), so its
grammar state stays valid; a state follows the token list both ways (`GrammarState.sync`),
which is also how rejected speculative drafts will roll it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np

from resin.engine.grammar import GrammarBackend, GrammarState
from resin.engine.request import Request, Status
from resin.events import Event, FinishedEvent, FinishReason
from resin.params import SamplingParams
from resin.plan import BatchPlan, SamplingArrays

Finish = Callable[[Request, FinishReason, str | None], FinishedEvent]

OVERLAP_MIN_ROWS = 4
"""Fewer constrained rows fill their masks inline (a thread hop costs more than the masks)."""

MASK_WAIT_S = 0.002
"""How long a step waits for next-step masks filling off the engine thread before their
requests sit that step out (the per-step mask budget of runners that cannot wait for masks)."""


@dataclass(frozen=True, slots=True)
class _Gated:
    """A plan's mask whose fill waits for the step before it to be advanced."""

    states: list[GrammarState]
    base: np.ndarray
    rows: list[int]
    done: Future[None]


@dataclass(frozen=True, slots=True)
class _Ahead:
    """Next-step masks filling off the engine thread: row i of `masks` is `requests[i]`'s
    mask after `consumed[i]` tokens."""

    requests: tuple[Request, ...]
    consumed: tuple[int, ...]
    masks: np.ndarray
    done: Future[None]


class ConstraintSet:
    """The engine's constrained requests and how their masks and biases enter plans."""

    def __init__(
        self, backend: GrammarBackend | None, vocab_size: int | None, overlap: bool = False
    ) -> None:
        self.backend = backend
        self.vocab_size = vocab_size
        self.overlap = overlap and backend is not None
        self._worker: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        self._gated: _Gated | None = None
        self._aheads: deque[_Ahead] = deque()
        self._ready: dict[Request, tuple[int, np.ndarray]] = {}
        """Masks an `_Ahead` filled: request -> (tokens consumed then, mask row)."""
        self.held: frozenset[Request] = frozenset()
        """Decode requests that sit out the next step: their mask is still filling."""
        self._slow = False  # the last fill ahead took longer than MASK_WAIT_S
        if backend is not None and vocab_size is not None and backend.vocab_size > vocab_size:
            raise ValueError(
                f"the grammar tokenizer has {backend.vocab_size} tokens, "
                f"more than the runner's vocabulary ({vocab_size})"
            )
        width = vocab_size if vocab_size is not None else (backend and backend.vocab_size)
        self.mask_words = -(-(width or 0) // 32)
        self.active = 0
        """Live requests with a grammar or a logit bias."""
        self._bias: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        """Each biased request's (ids, values), built at admission."""

    def check(
        self, params: SamplingParams, prepared: GrammarState | None = None
    ) -> GrammarState | None:
        """Validate a request's bias and constraint (ValueError naming the problem); return its
        fresh grammar state (None without a constraint). `prepared`: a state made off this
        thread (`CompiledGrammar.state()` of a `GrammarBackend.prepare`) for the same
        constraint, used as is: nothing compiles here then. Nothing is registered yet."""
        if params.logit_bias and self.vocab_size is not None:
            top = params.logit_bias[-1][0]
            if top >= self.vocab_size:
                raise ValueError(f"logit_bias token id {top} is outside the vocabulary")
        if params.constraint is None:
            return None
        if prepared is not None and prepared.constraint == params.constraint:
            return prepared
        if self.backend is None:
            raise ValueError(
                f"constraint {params.constraint.kind} needs an engine with a grammar backend "
                "(Engine(..., grammar=GrammarBackend.from_tokenizer(tokenizer)))"
            )
        return self.backend.state(params.constraint)

    def admit(self, request: Request, state: GrammarState | None) -> None:
        request.grammar = state
        bias = request.sampling_params.logit_bias
        if state is not None or bias:
            request.constrained = True
            self.active += 1
        if bias:  # built once: a step only concatenates its rows' arrays
            ids = np.fromiter((p[0] for p in bias), dtype=np.int32, count=len(bias))
            values = np.fromiter((p[1] for p in bias), dtype=np.float32, count=len(bias))
            self._bias[request.id] = (ids, values)

    def release(self, request: Request) -> None:
        if request.constrained:
            request.constrained = False
            request.grammar = None
            self._bias.pop(request.id, None)
            self._ready.pop(request, None)
            self.active -= 1

    # -- per step ----------------------------------------------------------------------------
    @property
    def drains(self) -> bool:
        """Whether the overlap pipeline must drain before a step (constrained rows and a
        runner that cannot wait for masks filled after submission)."""
        return self.active > 0 and not self.overlap

    @property
    def hooked(self) -> bool:
        """Whether a landed step needs `advance` + `open_gate`."""
        return self.active > 0 or self._gated is not None

    def attach(
        self, plan: BatchPlan, requests: tuple[Request, ...], gated: bool = False
    ) -> BatchPlan:
        """`plan` with the bitmask / bias arrays of its constrained rows filled in (`gated`:
        the mask is filled at `open_gate`)."""
        b = plan.num_sequences
        rows = [
            i
            for i, r in enumerate(requests)
            if r.grammar is not None and plan.sample_rows[i] and r.grammar.error is None
        ]
        mask = None
        pending: Callable[[], object] | None = None
        if rows and self.backend is not None:
            base = np.full((b, self.mask_words), -1, dtype=np.int32)
            mask = base.view()  # the plan freezes this view; the filler writes `base`
            rows = self._take_ready(requests, rows, base)
            if rows:
                states = [g for i in rows if (g := requests[i].grammar) is not None]
                pending = self._start_fill(states, base, rows, gated)
        sampling = self._with_bias(plan, requests)
        if mask is None and sampling is plan.sampling:
            return plan
        sampling = dataclasses.replace(sampling, token_bitmask=mask, mask_pending=pending)
        return dataclasses.replace(plan, sampling=sampling)

    def _start_fill(
        self, states: list[GrammarState], base: np.ndarray, rows: list[int], gated: bool
    ) -> Callable[[], object] | None:
        """Fill `rows` of `base` now, in the background (overlap) or at `open_gate` (gated);
        what the runner waits on before it samples (None: filled already)."""
        if gated:
            self.discard_gate()
            self._gated = _Gated(states, base, rows, Future())
            return self._gated.done.result
        if self.overlap and len(rows) >= OVERLAP_MIN_ROWS:
            self._pending = self._pool().submit(self._fill, states, base, rows)
            return self._pending.result
        self._fill(states, base, rows)
        return None

    def _with_bias(self, plan: BatchPlan, requests: tuple[Request, ...]) -> SamplingArrays:
        """The plan's sampling arrays with its rows' biases in CSR form (unchanged without)."""
        rows = [self._bias.get(r.id) for r in requests] if self._bias else []
        if not any(rows):
            return plan.sampling
        lens = [0 if x is None else x[0].size for x in rows]
        indptr = np.zeros(len(requests) + 1, dtype=np.int32)
        np.cumsum(lens, out=indptr[1:])
        given = [x for x in rows if x is not None]
        return dataclasses.replace(
            plan.sampling,
            bias_indptr=indptr,
            bias_ids=np.concatenate([x[0] for x in given]),
            bias_values=np.concatenate([x[1] for x in given]),
        )

    def _fill(self, states: Sequence[GrammarState], base: np.ndarray, rows: list[int]) -> None:
        assert self.backend is not None
        if not rows:
            return
        sub = np.zeros((len(rows), self.mask_words), dtype=np.int32)
        self.backend.fill_masks(states, sub)
        base[rows] = sub

    def open_gate(self) -> None:
        """Start the gated fill (the step before its plan is committed and advanced)."""
        g, self._gated = self._gated, None
        if g is None:
            return
        # Inline: the device runs the gated plan's forward meanwhile, and a worker thread
        # waited up to a GIL switch interval (5 ms) to return its fill to a busy main thread
        # (3.4 ms per fill on the H200 host against 2.7 ms inline; docs/benchmarks.md).
        self._fill_gated(g)

    def _fill_gated(self, g: _Gated) -> None:
        """Fill a gated mask and report it through `g.done` (what the runner waits on)."""
        try:
            keep = [i for i, s in enumerate(g.states) if s.error is None and not s.stopped]
            self._fill([g.states[i] for i in keep], g.base, [g.rows[i] for i in keep])
        except Exception as exc:  # the runner that waits for this mask reports it
            g.done.set_exception(exc)
            return
        g.done.set_result(None)

    def discard_gate(self) -> None:
        """The gated plan will not run (refused, or the runner died): nobody waits for it."""
        g, self._gated = self._gated, None
        if g is not None:
            g.done.set_exception(RuntimeError("the plan's mask was discarded"))

    def settle(self) -> None:
        """Wait for a background mask fill (its errors already reached the runner)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            with contextlib.suppress(Exception):  # the runner that waited on it failed already
                pending.result()

    def close(self) -> None:
        self.discard_gate()
        self.settle()
        self._collect(None)
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    def advance(self, requests: tuple[Request, ...], events: list[Event], finish: Finish) -> None:
        """Feed each constrained request's state the tokens committed since the last call."""
        self.settle()
        self._join(requests)
        live = [r for r in requests if r.grammar is not None and not r.finished]
        # One matcher after another: a token costs a matcher microseconds, and llguidance's
        # pool (`consume_token_par`) was slower at every batch measured on the H200 host
        # (docs/benchmarks.md, constrained decoding).
        for r in live:
            state = r.grammar
            assert state is not None
            if not state.sync(r.output_token_ids):
                events.append(finish(r, FinishReason.ERROR, state.error))
            elif state.stopped:
                events.append(finish(r, FinishReason.STOP, None))

    # -- masks ahead: runners that cannot wait for a mask -----------------------------------
    @property
    def prefetches(self) -> bool:
        """Whether next-step masks fill off the engine thread after each commit (a runner
        that cannot wait for a mask; one that can overlaps the fill with its forward)."""
        return self.backend is not None and not self.overlap

    def prefetch(self, requests: tuple[Request, ...]) -> None:
        """After `advance`: start filling the next mask of each of `requests` that decodes
        under a live grammar, on the mask worker (llguidance releases the GIL)."""
        live = tuple(
            r
            for r in requests
            if r.status is Status.DECODE
            and (g := r.grammar) is not None
            and g.error is None
            and not g.stopped
        )
        if not live or self.backend is None:
            return
        states = [r.grammar for r in live if r.grammar is not None]
        masks = np.zeros((len(live), self.mask_words), dtype=np.int32)
        done = self._pool().submit(self._fill_ahead, states, masks)
        self._aheads.append(_Ahead(live, tuple(g.consumed for g in states), masks, done))

    def _fill_ahead(self, states: list[GrammarState], masks: np.ndarray) -> None:
        assert self.backend is not None
        start = time.perf_counter()
        self.backend.fill_masks(states, masks)
        # A slow fill: the next steps do not wait for masks at all (they would only pay
        # the wait); a fast one: they wait up to `MASK_WAIT_S`, so fast grammars never sit out.
        self._slow = time.perf_counter() - start > MASK_WAIT_S

    def hold(self, running: Sequence[Request], others: bool) -> frozenset[Request]:
        """The decode requests that sit out the next step: those whose mask is still filling
        after `MASK_WAIT_S`. When they are all that could run (`others`: waiting or
        prefilling requests), the step waits for their masks instead."""
        if not self._aheads:
            self.held = frozenset()
            return self.held
        self._collect(0.0 if self._slow else MASK_WAIT_S)
        pending = {r for a in self._aheads for r in a.requests}
        if pending and not others and all(r in pending for r in running):
            self._collect(None)
            pending = set()
        self.held = frozenset(pending)
        return self.held

    def _pool(self) -> ThreadPoolExecutor:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="resin-masks")
        return self._worker

    def _collect(self, timeout: float | None) -> None:
        """Take the masks of finished fills, oldest first, waiting up to `timeout` seconds
        in all (None: until every fill is done). A failed fill is dropped: its rows are
        filled inline, where the error surfaces."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._aheads:
            ahead = self._aheads[0]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not wait([ahead.done], left).done:
                return
            self._aheads.popleft()
            if ahead.done.exception() is None:
                for i, r in enumerate(ahead.requests):
                    self._ready[r] = (ahead.consumed[i], ahead.masks[i])

    def _join(self, requests: Sequence[Request]) -> None:
        """Wait for the fills that read any of `requests`' grammars (a matcher is never read
        and written at once)."""
        if self._aheads and not set(requests).isdisjoint(
            r for a in self._aheads for r in a.requests
        ):
            self._collect(None)

    def _take_ready(
        self, requests: tuple[Request, ...], rows: list[int], base: np.ndarray
    ) -> list[int]:
        """Copy the masks filled ahead for `rows` into `base`; the rows still to fill."""
        self._join([requests[i] for i in rows])
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
