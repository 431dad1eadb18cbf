"""Constrained decoding in the engine: per-request grammar state, plan masks, commit hooks.

The engine calls four things, each a line or a few at its call site:
- `admit(request)` at submit: compile (cached), or take the state prepared off the engine
  thread, and attach the request's `GrammarState`;
- `hold(scheduler)` before scheduling: the requests whose masks still fill sit out (below);
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

Runners that cannot wait for masks: the next masks fill ahead, off the engine thread, right
after each commit (`masks_ahead.py`); a request whose mask is still filling sits a step out
(`held` -> `Scheduler.hold`), and `attach` copies the masks filled ahead.

Zero overhead without constraints: the engine calls `attach` / `advance` only while `active`
(a live request has a grammar or a bias), and `hold` returns at once without them.
Retraction keeps a request's generated tokens (the recompute path re-prefills them), so its
grammar state stays valid; a state follows the token list both ways (`GrammarState.sync`),
which is also how rejected speculative drafts will roll it back.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from resin.engine.grammar import GrammarBackend, GrammarState
from resin.engine.masks_ahead import MasksAhead
from resin.engine.request import Request
from resin.events import Event, FinishedEvent, FinishReason
from resin.params import SamplingParams
from resin.plan import BatchPlan, SamplingArrays
from resin.protocols import RunnerConfig

Finish = Callable[[Request, FinishReason, str | None], FinishedEvent]

OVERLAP_MIN_ROWS = 4
"""Fewer constrained rows fill their masks inline (a thread hop costs more than the masks)."""


@dataclass(frozen=True, slots=True)
class _Gated:
    """A plan's mask whose fill waits for the step before it to be advanced."""

    states: list[GrammarState]
    base: np.ndarray
    rows: list[int]
    done: Future[None]


class Queues(Protocol):
    """The scheduler's queues, as `hold` reads them."""

    @property
    def waiting(self) -> Collection[Request]: ...

    @property
    def prefilling(self) -> Sequence[Request]: ...

    @property
    def running(self) -> Sequence[Request]: ...

    @property
    def held(self) -> Collection[Request]: ...


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
        self.ahead: MasksAhead | None = None
        """Next-step masks filling off the engine thread (a runner that cannot wait for
        masks: `masks_ahead.py`); None otherwise."""
        if backend is not None and vocab_size is not None and backend.vocab_size > vocab_size:
            raise ValueError(
                f"the grammar tokenizer has {backend.vocab_size} tokens, "
                f"more than the runner's vocabulary ({vocab_size})"
            )
        width = vocab_size if vocab_size is not None else (backend and backend.vocab_size)
        self.mask_words = -(-(width or 0) // 32)
        if backend is not None and not self.overlap:
            self.ahead = MasksAhead(backend, self.mask_words, self._pool())
        self.active = 0
        """Live requests with a grammar or a logit bias."""
        self._bias: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        """Each biased request's (ids, values), built at admission."""

    @classmethod
    def for_runner(cls, backend: GrammarBackend | None, config: RunnerConfig) -> ConstraintSet:
        """The set for a runner's vocabulary and whether it waits for masks."""
        return cls(backend, config.vocab_size, config.waits_for_masks)

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
            if self.ahead is not None:
                self.ahead.forget(request)
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
            if self.ahead is not None:
                rows = self.ahead.take(requests, rows, base)
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
        if self.ahead is not None:
            self.ahead.collect(None)
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    def advance(self, requests: tuple[Request, ...], events: list[Event], finish: Finish) -> None:
        """Feed each constrained request's state the tokens committed since the last call."""
        self.settle()
        if self.ahead is not None:
            self.ahead.join(requests)
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
        if self.ahead is not None:  # the next masks fill while the engine goes on
            self.ahead.start(requests)

    def held(self, queues: Queues) -> Collection[Request]:
        """Before scheduling: the decode requests that sit out the next step
        (`MasksAhead.hold`; the scheduler takes them, `Scheduler.hold`); nothing sits out
        without constraints."""
        if self.ahead is None or not (self.active or queues.held):
            return queues.held
        others = bool(queues.waiting or queues.prefilling)
        return self.ahead.hold(queues.running, others)

    def _pool(self) -> ThreadPoolExecutor:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="resin-masks")
        return self._worker
