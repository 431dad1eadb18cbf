"""A constrained request waits in the actor's intake while its grammar compiles off the
engine thread: the real Engine with the zero-cost runner, the real llguidance backend."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

from resin import Constraint, Engine, GrammarBackend, SamplingParams
from resin.engine.grammar import GrammarLimits
from resin.events import FinishedEvent, TokensEvent
from resin.frontend.actor import EngineActor
from resin.frontend.stream import RequestStream, StreamError
from resin.tokenizer import Tokenizer
from resin_app.loading import ZeroCostRunner


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    from resin_model.default_model import default_model_dir

    try:
        return Tokenizer.from_dir(default_model_dir())
    except FileNotFoundError as exc:
        pytest.skip(f"default model unavailable: {exc}")


def heavy(salt: int, n: int = 60_000) -> Constraint:
    """A choice among `n` strings: about half a second of compile here."""
    choices = " | ".join(json.dumps(f"option {salt} {i}") for i in range(n))
    return Constraint("grammar", f"start: CHOICE\nCHOICE: {choices}")


class Recorder(GrammarBackend):
    """The real backend, recording the threads that compile."""

    threads: list[str]

    def _compile(self, c: Constraint) -> Any:
        self.threads.append(threading.current_thread().name)
        return super()._compile(c)


def engine_with(tokenizer: Tokenizer, **limits: Any) -> tuple[Engine, Recorder]:
    backend = Recorder.from_tokenizer(tokenizer, GrammarLimits(**limits))
    assert isinstance(backend, Recorder)
    backend.threads = []
    runner = ZeroCostRunner(tokenizer.vocab_size, tokenizer.encode("a", False)[0])
    return Engine(runner, grammar=backend), backend


async def first(stream: RequestStream) -> Any:
    return await asyncio.wait_for(stream.get(), 60)


async def drain(stream: RequestStream) -> list[Any]:
    items: list[Any] = []
    while True:
        item = await asyncio.wait_for(stream.get(), 60)
        if isinstance(item, StreamError):
            return [*items, item]
        items.extend(item)
        if any(isinstance(e, FinishedEvent) for e in item):
            return items


def params(tokenizer: Tokenizer, constraint: Constraint | None, n: int = 8) -> SamplingParams:
    return SamplingParams(
        max_output_tokens=n, stop_token_ids=tokenizer.eos_token_ids, constraint=constraint
    )


def test_plain_requests_run_while_a_grammar_compiles(tokenizer: Tokenizer) -> None:
    engine, backend = engine_with(tokenizer)

    async def main() -> None:
        actor = EngineActor(engine)
        actor.start(asyncio.get_running_loop())
        slow = actor.submit(actor.reserve(), (1, 2, 3), params(tokenizer, heavy(1)))
        started = time.monotonic()
        plain = actor.submit(actor.reserve(), (1, 2, 4), params(tokenizer, None, 50))
        finished = [e for e in await drain(plain) if isinstance(e, FinishedEvent)]
        plain_s = time.monotonic() - started
        constrained = await drain(slow)
        assert finished and finished[0].num_output_tokens == 50
        tokens = [t for e in constrained if isinstance(e, TokensEvent) for t in e.token_ids]
        assert tokenizer.decode(tokens, True).startswith("option 1 ")
        assert plain_s < 0.5 * backend_compile_s(backend), plain_s  # it never waited
        await asyncio.to_thread(actor.stop)

    asyncio.run(main())
    assert backend.threads and all(t.startswith("resin-grammar") for t in backend.threads)


def backend_compile_s(backend: GrammarBackend) -> float:
    """How long the heavy grammar took to compile (read from the backend's cache)."""
    return max(e.seconds for e in backend._cache.values() if hasattr(e, "seconds"))


def test_compile_budget_refuses_and_the_late_result_is_cached(tokenizer: Tokenizer) -> None:
    engine, backend = engine_with(tokenizer, compile_timeout_s=0.05)
    c = heavy(2)

    async def main() -> None:
        actor = EngineActor(engine)
        actor.start(asyncio.get_running_loop())
        item = await first(actor.submit(actor.reserve(), (1, 2), params(tokenizer, c)))
        assert isinstance(item, StreamError) and item.kind == "refused"
        assert (
            item.message == "constraint grammar did not compile within 0.05 s (compile_timeout_s)"
        )
        await asyncio.to_thread(lambda: backend.prepare(c).result(60))  # it finishes anyway
        again = await drain(actor.submit(actor.reserve(), (1, 2), params(tokenizer, c)))
        assert isinstance(again[-1], FinishedEvent)  # now a cache hit, in time
        assert actor.queued == 0
        await asyncio.to_thread(actor.stop)

    asyncio.run(main())
    assert len(backend.threads) == 1


def test_abort_while_compiling_never_reaches_the_engine(tokenizer: Tokenizer) -> None:
    engine, backend = engine_with(tokenizer)
    c = heavy(3)

    async def main() -> None:
        actor = EngineActor(engine)
        actor.start(asyncio.get_running_loop())
        stream = actor.submit(actor.reserve(), (1, 2), params(tokenizer, c))
        actor.abort(stream)
        item = await first(stream)
        assert isinstance(item, StreamError) and item.kind == "aborted"
        assert actor.queued == 0
        await asyncio.to_thread(lambda: backend.prepare(c).result(60))
        await asyncio.sleep(0.1)
        assert engine.num_waiting == 0 and engine.num_running == 0
        await asyncio.to_thread(actor.stop)

    asyncio.run(main())


def test_bad_specs_are_refused_and_a_full_compile_queue_is_busy(tokenizer: Tokenizer) -> None:
    engine, _ = engine_with(tokenizer, max_queued_compiles=1)

    async def main() -> None:
        actor = EngineActor(engine)
        actor.start(asyncio.get_running_loop())
        bad = Constraint("json_schema", '{"$ref": "#"}')
        item = await first(actor.submit(actor.reserve(), (1,), params(tokenizer, bad)))
        assert isinstance(item, StreamError) and item.kind == "refused"
        assert "unsatisfiable" in item.message
        running = actor.submit(actor.reserve(), (1,), params(tokenizer, heavy(4)))
        queued = actor.submit(actor.reserve(), (1,), params(tokenizer, heavy(5)))
        busy = await first(queued)
        assert isinstance(busy, StreamError) and busy.kind == "busy"
        assert isinstance((await drain(running))[-1], FinishedEvent)
        await asyncio.to_thread(actor.stop)

    asyncio.run(main())


def test_stopping_refuses_requests_still_compiling(tokenizer: Tokenizer) -> None:
    engine, _ = engine_with(tokenizer)

    async def main() -> None:
        actor = EngineActor(engine)
        actor.start(asyncio.get_running_loop())
        stream = actor.submit(actor.reserve(), (1,), params(tokenizer, heavy(6)))
        await asyncio.to_thread(actor.stop)
        item = await first(stream)
        assert isinstance(item, StreamError) and "shutting down" in item.message
        assert actor.queued == 0

    asyncio.run(main())
