"""The engine actor on its own: admission bounds, reservations, abort before admission."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from resin.events import FinishedEvent, FinishReason
from resin.frontend.actor import EngineActor
from resin.frontend.errors import EngineUnavailable, QueueFull
from resin.frontend.stream import RequestStream, StreamError
from resin.params import SamplingParams
from tests.server.doubles import FakeEngine


class CountingEngine(FakeEngine):
    """Records how many submits happened between steps and the most requests inside."""

    def __init__(self) -> None:
        super().__init__(lambda prompt: [97], step_delay=0.001)
        self.submits_since_step = 0
        self.max_submits_per_step = 0
        self.max_inside = 0

    def submit(self, prompt: Sequence[int], params: SamplingParams | None = None):  # type: ignore[no-untyped-def]
        self.submits_since_step += 1
        self.max_submits_per_step = max(self.max_submits_per_step, self.submits_since_step)
        handle = super().submit(prompt, params)
        self.max_inside = max(self.max_inside, self.num_running + self.num_waiting)
        return handle

    def step(self):  # type: ignore[no-untyped-def]
        self.submits_since_step = 0
        return super().step()


async def drain(stream: RequestStream) -> list[object]:
    items: list[object] = []
    while True:
        item = await stream.get()
        if isinstance(item, StreamError):
            return [*items, item]
        items.extend(item)
        if any(isinstance(e, FinishedEvent) for e in item):
            return items


def test_admission_bounds_and_reservations() -> None:
    engine = CountingEngine()

    async def main() -> None:
        actor = EngineActor(engine, queue_capacity=300, max_active=128, admissions_per_step=4)
        actor.start(asyncio.get_running_loop())
        params = SamplingParams(max_output_tokens=60)
        # Reserve every slot before submitting any: the actor thread admits (and so releases)
        # submitted requests concurrently, which would make the full queue a race.
        reservations = [actor.reserve() for _ in range(300)]
        with pytest.raises(QueueFull):
            actor.reserve()
        streams = [actor.submit(r, (1, 2, 3), params) for r in reservations]
        results = await asyncio.gather(*(drain(s) for s in streams))
        assert actor.queued == 0  # every reservation released once admitted
        for items in results:
            last = items[-1]
            assert isinstance(last, FinishedEvent) and last.reason is FinishReason.LENGTH
            assert last.num_output_tokens == 60
        await asyncio.to_thread(actor.stop)
        with pytest.raises(EngineUnavailable):
            actor.reserve()

    asyncio.run(main())
    assert engine.max_submits_per_step == 4
    assert engine.max_inside == 128


def test_abort_before_admission_and_engine_refusal() -> None:
    engine = FakeEngine(lambda prompt: [97], context_length=64, step_delay=0.01)

    async def main() -> None:
        actor = EngineActor(engine, max_active=1, admissions_per_step=1)
        actor.start(asyncio.get_running_loop())
        params = SamplingParams(max_output_tokens=1000)
        first = actor.submit(actor.reserve(), (1,), params)
        second = actor.submit(actor.reserve(), (1,), params)
        actor.abort(second)  # still waiting for a slot inside the engine
        item = await second.get()
        assert isinstance(item, StreamError) and item.kind == "aborted"
        assert await first.get()  # admitted and generating
        actor.abort(first)
        assert isinstance((await drain(first))[-1], FinishedEvent)
        too_long = actor.submit(actor.reserve(), tuple(range(100)), params)
        refused = await too_long.get()
        assert isinstance(refused, StreamError) and refused.kind == "refused"
        assert actor.queued == 0
        await asyncio.to_thread(actor.stop)

    asyncio.run(main())
    assert engine.num_running == 0 and engine.num_waiting == 0
