"""`EngineService` and `EngineClient` over real sockets, around the real `Engine` with the
application's zero-cost runner: what crosses, admission on the engine side, refusals, aborts
(a frontend's and a hang-up's), a frontend that goes away, and the wire format."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resin.engine import Engine
from resin.events import FinishedEvent, FinishReason, TokensEvent, TopLogprob
from resin.frontend.ports import Refusal
from resin.ipc import EngineClient, EngineService, ServicePolicy, wire
from resin.params import SamplingParams
from resin_app.loading import ZeroCostRunner

VOCAB = 64
TOKEN = 7


class Served:
    def __init__(self, engine: Engine, service: EngineService, addresses: list[str]) -> None:
        self.engine = engine
        self.service = service
        self.addresses = addresses


class StepTimeRunner(ZeroCostRunner):
    """The zero-cost runner with a device-like step time, so steps can be counted."""

    def forward(self, plan: Any) -> Any:
        time.sleep(0.02)
        return super().forward(plan)


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    runner = StepTimeRunner if getattr(request, "param", None) == "timed" else ZeroCostRunner
    engine = Engine(runner(VOCAB, TOKEN), context_length=256, max_sequences=64)
    addresses = [f"ipc://{tmp_path}/e0-f{j}" for j in range(2)]
    service = EngineService(engine, addresses, ServicePolicy(max_active=3, admissions_per_step=2))
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    yield Served(engine, service, addresses)
    service.request_stop()
    thread.join(10)
    service.close()
    engine.close()


def collect(client: EngineClient, rids: set[int], timeout: float = 10.0) -> dict[int, list]:
    """Events per request until each of `rids` ended (a finish or a refusal)."""
    out: dict[int, list] = {rid: [] for rid in rids}
    open_ = set(rids)
    deadline = time.monotonic() + timeout
    while open_ and time.monotonic() < deadline:
        for event in client.step():
            out[event.request_id].append(event)
            if isinstance(event, FinishedEvent | Refusal):
                open_.discard(event.request_id)
    assert not open_, f"no end for {open_}"
    return out


def test_requests_cross_and_finish_once_with_the_engines_own_events(served: Served) -> None:
    client = EngineClient(served.addresses[0], 0)
    assert client.context_length == 256 and client.info.vocab_size == VOCAB
    params = SamplingParams(max_output_tokens=5)
    rids = {client.submit([1, 2, 3], params).id for _ in range(6)}
    events = collect(client, rids)
    for rid, got in events.items():
        tokens = [t for e in got if isinstance(e, TokensEvent) for t in e.token_ids]
        assert tokens == [TOKEN] * 5, rid
        finish = got[-1]
        assert isinstance(finish, FinishedEvent) and finish.reason is FinishReason.LENGTH
        assert finish.num_prompt_tokens == 3 and finish.num_output_tokens == 5
        assert sum(isinstance(e, FinishedEvent) for e in got) == 1
    client.close()


def test_admission_policy_is_the_engine_sides(served: Served) -> None:
    """max_active 3 holds however many a frontend sends: the engine never runs more."""
    client = EngineClient(served.addresses[0], 0)
    rids = {client.submit([1, 2], SamplingParams(max_output_tokens=40)).id for _ in range(8)}
    peak = 0
    deadline = time.monotonic() + 10
    done: set[int] = set()
    while len(done) < len(rids) and time.monotonic() < deadline:
        for event in client.step():
            if isinstance(event, FinishedEvent):
                done.add(event.request_id)
        peak = max(peak, served.engine.num_running + served.engine.num_waiting)
    assert done == rids and 0 < peak <= 3
    client.close()


def test_bad_input_is_refused_with_the_engines_message(served: Served) -> None:
    client = EngineClient(served.addresses[0], 0)
    bad = client.submit([VOCAB + 5], SamplingParams()).id
    long = client.submit(list(range(1, 40)) * 10, SamplingParams()).id
    events = collect(client, {bad, long})
    for rid in (bad, long):
        (refusal,) = events[rid]
        assert isinstance(refusal, Refusal) and refusal.kind == "refused"
    assert "vocab" in events[bad][0].message.lower() or str(VOCAB) in events[bad][0].message
    assert not client.has_work()
    client.close()


@pytest.mark.parametrize("served", ["timed"], indirect=True)
def test_an_abort_crosses_within_a_step(served: Served) -> None:
    """After `abort`, at most the step already running (and one overlapped) adds tokens."""
    client = EngineClient(served.addresses[0], 0)
    rid = client.submit([1, 2, 3], SamplingParams(max_output_tokens=100_000)).id
    seen = 0
    while seen < 20:
        seen += sum(len(e.token_ids) for e in client.step() if isinstance(e, TokensEvent))
    client.abort(rid)
    after = collect(client, {rid})[rid]
    late = sum(len(e.token_ids) for e in after if isinstance(e, TokensEvent))
    assert isinstance(after[-1], FinishedEvent) and after[-1].reason is FinishReason.ABORT
    assert late <= 2, late
    client.close()


def test_a_frontend_that_goes_away_has_its_requests_aborted(served: Served) -> None:
    """Frontend 1 closes its socket mid-generation: its requests leave the engine, frontend
    0's go on to their end."""
    keep, gone = EngineClient(served.addresses[0], 0), EngineClient(served.addresses[1], 1)
    mine = keep.submit([1, 2], SamplingParams(max_output_tokens=300)).id
    for _ in range(2):
        gone.submit([3, 4], SamplingParams(max_output_tokens=100_000))
    while served.engine.num_running < 3:
        keep.step()
        gone.step()
    gone.close()
    events = collect(keep, {mine})
    assert events[mine][-1].reason is FinishReason.LENGTH
    deadline = time.monotonic() + 5
    while served.engine.num_running + served.engine.num_waiting and time.monotonic() < deadline:
        time.sleep(0.01)
    assert served.engine.num_running + served.engine.num_waiting == 0
    keep.close()


def test_a_stopped_engine_is_seen_by_its_client(served: Served) -> None:
    client = EngineClient(served.addresses[0], 0)
    rid = client.submit([1, 2], SamplingParams(max_output_tokens=100_000)).id
    while not any(isinstance(e, TokensEvent) for e in client.step()):
        pass
    served.service.request_stop()
    assert collect(client, {rid})[rid][-1].reason is FinishReason.ABORT
    served.service.close()  # the engine process's sockets close as it exits
    deadline = time.monotonic() + 5
    while not client.has_work() and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match="engine process"):
        client.step()
    assert client.dead
    client.close()


def test_the_client_remembers_prefixes_it_sent_for_routing(served: Served) -> None:
    client = EngineClient(served.addresses[0], 0)
    page = client.info.page_size
    prompt = list(range(1, 3 * page + 5))
    assert client.cached_prefix(prompt) == 0
    collect(client, {client.submit(prompt, SamplingParams(max_output_tokens=1)).id})
    assert client.cached_prefix(prompt) == 3 * page
    assert client.cached_prefix(prompt[:page] + [9] * 2 * page) == page
    client.close()


def test_outputs_round_trip_as_buffers_with_rich_events_in_order() -> None:
    top = ((TopLogprob(3, -0.5),),)
    events = [
        TokensEvent(1, (5, 6), cached_tokens=16),
        TokensEvent(2, (7,), logprobs=(-0.25,), top_logprobs=top),
        TokensEvent(2, (8,), logprobs=(-1.0,), top_logprobs=top),
        TokensEvent(3, ()),
        FinishedEvent(1, FinishReason.STOP, 4, 2, 16),
        FinishedEvent(3, FinishReason.ERROR, 4, 0, 0, "quarantined"),
    ]
    message = wire.decode(wire.encode(wire.pack_outputs(events)))
    assert isinstance(message, wire.Outputs)
    assert len(message.tokens) == 2 * 4  # int32 buffer: request 1's two plain tokens
    back = wire.unpack_outputs(message)
    assert sorted(back, key=lambda e: (e.request_id, isinstance(e, FinishedEvent))) == sorted(
        events, key=lambda e: (e.request_id, isinstance(e, FinishedEvent))
    )
    assert [e for e in back if e.request_id == 2] == events[1:3]


def test_a_decode_steps_outputs_round_trip_one_token_each() -> None:
    events = [TokensEvent(rid, (rid + 100,), cached_tokens=rid % 3) for rid in range(5)]
    events.append(FinishedEvent(2, FinishReason.LENGTH, 7, 1, 2))
    back = wire.unpack_outputs(wire.decode(wire.encode(wire.pack_outputs(events))))
    assert back == events
    assert all(type(e) is TokensEvent for e in back[:5])


def test_several_steps_read_at_once_give_one_event_per_request() -> None:
    steps = [
        [TokensEvent(7, (1,), cached_tokens=32), TokensEvent(4, (2,), cached_tokens=0)],
        [TokensEvent(4, (3, 4)), TokensEvent(9, (5,))],
        [TokensEvent(7, (6,)), FinishedEvent(7, FinishReason.LENGTH, 40, 2, 32)],
        [FinishedEvent(4, FinishReason.STOP, 8, 3)],
    ]
    messages = [wire.pack_outputs(events) for events in steps]
    back = wire.unpack_many(messages)
    assert sorted((e for e in back if isinstance(e, TokensEvent)), key=lambda e: e.request_id) == [
        TokensEvent(4, (2, 3, 4)),
        TokensEvent(7, (1, 6), cached_tokens=32),
        TokensEvent(9, (5,)),
    ]
    assert back[3:] == [steps[2][1], steps[3][0]]  # the finishes, after every token


def test_steps_with_rich_events_are_read_one_by_one() -> None:
    rich = TokensEvent(4, (3,), logprobs=(-1.0,))
    steps = [[TokensEvent(4, (2,), prompt_logprobs=(-0.5,))], [rich], [TokensEvent(5, (1,))]]
    back = wire.unpack_many([wire.pack_outputs(events) for events in steps])
    assert back == [e for events in steps for e in events]
