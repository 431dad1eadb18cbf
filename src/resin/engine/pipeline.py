"""Overlap scheduling: submit decode step n+1 before step n's tokens reach the host.

With a runner that declares `RunnerConfig.overlap` (an `AsyncRunner` that holds two plans),
a pure decode step goes: schedule -> reserve -> plan n+1 -> `submit` -> `collect` n ->
validate -> commit n -> events. Rows of plan n+1 whose request is in plan n take their input
token on the device (`BatchPlan.prev_token_rows`, `input_ids` -1 there); their positions,
output indices (`SlotStore.ahead`) and State ring pages are those after step n.

Everything step n+1 assumed about step n is token-independent except whether its requests go
on. A request that leaves while its row is in flight (a stop, `length`, an abort, a
retraction, a quarantine of step n) is detected by its slot's `SlotStore.epoch`: the row's
token is dropped at collection and never committed. The request's pages were freed when it
left, with only its committed tokens published (`num_computed` counts committed steps only),
so the events, the tokens and the prefix cache are those of a synchronous run.

Failures: a plan the runner refuses (`submit` raises) rolls back its reservation; the flight
before it is collected first, then the refused plan's still-live requests are retried (or
quarantined, for a non-retryable error), as in a synchronous step. A failed or invalid
collected step quarantines exactly its live requests; their rows in the step behind it are
then dropped by the epoch rule (same requests), never committed. A dead runner ends everything.
The validation, the commit and the failure policy are the `Transaction`'s public ones, the
same the synchronous step uses (`docs/engine.md`, "Overlap").

Constrained steps pipeline too when the runner `waits_for_masks`: plan n+1's mask is gated
(`ConstraintSet.attach(gated=True)`) and filled only after step n landed, was committed and
its grammars advanced (`open_gate`, on every landing, failed ones included); a refused plan
or a dead runner discards the gate. A row whose request ended at step n (a grammar that
stopped, a stop token, a quarantine) is dropped by the epoch rule, so its late token never
reaches a grammar.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from resin.cache.manager import PageReservation
from resin.engine.constraints import ConstraintSet
from resin.engine.request import Request
from resin.engine.scheduler import Scheduler
from resin.engine.transaction import StepFailure, Transaction, Verdict
from resin.events import Event
from resin.plan import BatchPlan, ForwardOutput
from resin.protocols import AsyncRunner, RunnerConfig

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Flight:
    """A submitted, uncollected plan: row i is `requests[i]` in slot `slots[i]`, whose epoch
    was `epochs[i]` at submission."""

    plan: BatchPlan
    requests: tuple[Request, ...]
    reservation: PageReservation
    epochs: I64


class Pipeline:
    """At most two decode plans in flight on one overlapping `AsyncRunner`."""

    def __init__(
        self,
        runner: AsyncRunner,
        transaction: Transaction,
        scheduler: Scheduler,
        config: RunnerConfig,
        constraints: ConstraintSet | None = None,
    ) -> None:
        self._runner = runner
        self._transaction = transaction
        self._scheduler = scheduler
        """Told what goes in flight (`launched`); its slot epochs are read, never written."""
        self._constraints = constraints
        self._flights: deque[Flight] = deque()
        self._row_of = np.full(scheduler.slot_store.num_slots, -1, dtype=np.int32)
        """Row of each slot in the newest flight (-1: not in it)."""
        self._rings = tuple(i for i, g in enumerate(config.cache_groups) if g.state_region)
        """Groups whose rows read `state_in` and write `state_out` (State rings)."""

    @property
    def busy(self) -> bool:
        return bool(self._flights)

    # -- submit -----------------------------------------------------------------------------
    def chained(self, slots: I32) -> I32 | None:
        """`prev_token_rows` for a decode plan of `slots`: the row of each slot in the newest
        flight, whose sampled token is the row's input (None when no row chains)."""
        if not self._flights:
            return None
        prev = self._row_of[slots]
        return prev if bool((prev >= 0).any()) else None

    def chain_states(self, plan: BatchPlan) -> BatchPlan:
        """State groups: a chained row reads the ring page the step before it writes and
        writes the other one (at decode a slot's current checkpoint is always a ring page)."""
        if not self._rings or not plan.prev_token_rows.size:
            return plan
        ahead = plan.prev_token_rows >= 0
        groups = tuple(
            replace(
                g,
                state_in=np.where(ahead, g.state_out, g.state_in).astype(np.int32),
                state_out=np.where(ahead, g.state_in, g.state_out).astype(np.int32),
            )
            if gi in self._rings
            else g
            for gi, g in enumerate(plan.cache_groups)
        )
        return replace(plan, cache_groups=groups)

    def launch(
        self,
        plan: BatchPlan,
        requests: tuple[Request, ...],
        reservation: PageReservation,
        events: list[Event],
    ) -> None:
        """Submit a decode plan; on success it is in flight, else the failure is handled
        (after collecting the flight before it, so that step's tokens count first)."""
        c = self._constraints
        if c is not None and c.active:
            plan = c.attach(plan, requests, gated=bool(self._flights))
        try:
            self._runner.submit(plan)
        except Exception as exc:
            failure = StepFailure.of(plan.step_id, exc, accepted=False)
            self._transaction.undo(reservation, failure)
            if failure.verdict is Verdict.DEAD:
                self._forget()
            else:
                self._discard()
                self.drain(events)
            self._transaction.fail(failure, _alive(requests), events)
            return
        slots = reservation.slots
        self._scheduler.launched(slots)
        if self._flights:
            self._row_of[self._flights[-1].reservation.slots] = -1
        self._row_of[slots] = np.arange(slots.size, dtype=np.int32)
        epochs = self._scheduler.slot_store.epoch[slots]
        self._flights.append(Flight(plan, requests, reservation, epochs))

    # -- collect ----------------------------------------------------------------------------
    def settle(self, events: list[Event]) -> None:
        """Collect every flight but the newest (the one the device runs now)."""
        while len(self._flights) > 1:
            self.land(events)

    def drain(self, events: list[Event]) -> None:
        """Collect every flight (before a step that needs host tokens, and at close)."""
        while self._flights:
            self.land(events)

    def land(self, events: list[Event]) -> None:
        """Collect the oldest flight and land it (`Transaction.settle`: validated, its rows
        still live committed, its grammars advanced); then the next plan's mask may fill."""
        f = self._flights.popleft()
        slots = f.reservation.slots
        if not self._flights:
            self._row_of[slots] = -1
        result: ForwardOutput | StepFailure
        try:
            result = self._runner.collect()
        except Exception as exc:  # after acceptance: only this plan's requests are affected
            result = StepFailure.of(f.plan.step_id, exc, accepted=True)
        keep = self._scheduler.slot_store.epoch[slots] == f.epochs
        failure = self._transaction.settle(f.plan, result, f.requests, f.reservation, events, keep)
        if failure is not None and failure.verdict is Verdict.DEAD:
            self._forget()
        if self._constraints is not None:
            self._constraints.open_gate()

    def _discard(self) -> None:
        if self._constraints is not None:
            self._constraints.discard_gate()

    def _forget(self) -> None:
        """The runner died: uncollected plans are gone."""
        self._discard()
        self._flights.clear()
        self._row_of.fill(-1)


def make_pipeline(
    overlap: bool | None,
    runner: object,
    config: RunnerConfig,
    transaction: Transaction,
    scheduler: Scheduler,
    constraints: ConstraintSet | None = None,
) -> Pipeline | None:
    """The engine's pipeline: None when `overlap` is False, or None (auto) and the runner does
    not declare `RunnerConfig.overlap`; `overlap=True` with a runner that cannot raises."""
    able = config.overlap and isinstance(runner, AsyncRunner)
    if overlap is None:
        overlap = able
    if not overlap:
        return None
    if not able:
        raise ValueError("overlap=True needs an AsyncRunner whose RunnerConfig.overlap is True")
    assert isinstance(runner, AsyncRunner)
    return Pipeline(runner, transaction, scheduler, config, constraints)


def _alive(requests: tuple[Request, ...]) -> tuple[Request, ...]:
    return tuple(r for r in requests if r.finish_reason is None)
