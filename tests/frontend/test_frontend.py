"""The frontend without HTTP: the real Engine driven from asyncio through the actor, read as
typed updates (what `resin.server` does for each route, and what a notebook could do)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resin import Engine
from resin.frontend import (
    EngineActor,
    Generation,
    Generations,
    RequestRefused,
    Ticket,
    Update,
)
from resin.params import SamplingParams
from resin.recipe.deltas import TextDelta
from resin.recipe.plain import PlainTextParser
from resin_app.loading import ZeroCostRunner
from tests.server.doubles import ByteTokenizer

TOKEN = ord("a")


def generate(
    prompt: tuple[int, ...], n: int, stops: tuple[str, ...] = (), context_length: int = 64
) -> list[Update]:
    """`n` choices of `prompt` (5 tokens at most), merged per choice."""
    tokenizer = ByteTokenizer()
    engine = Engine(ZeroCostRunner(tokenizer.vocab_size, TOKEN), context_length=context_length)

    async def main() -> list[Update]:
        actor = EngineActor(engine)
        actor.start(asyncio.get_running_loop())
        params = SamplingParams(max_output_tokens=5)
        try:
            with Ticket(actor.reserve_many(n)) as ticket:
                gens = [
                    Generation(
                        actor, actor.submit(slot, prompt, params), len(prompt),
                        PlainTextParser(tokenizer), stops,
                    )
                    for slot in ticket.take(n)
                ]  # fmt: skip
            batch = Generations(gens)
            await batch.start()
            return await batch.collect()
        finally:
            await asyncio.to_thread(actor.stop)

    try:
        return asyncio.run(main())
    finally:
        engine.close()


def text(update: Update) -> str:
    return "".join(d.text for d in update.deltas if isinstance(d, TextDelta))


def test_choices_from_the_real_engine_without_http() -> None:
    answers = generate((1, 2, 3), n=2)
    assert [text(a) for a in answers] == ["aaaaa", "aaaaa"]
    for a in answers:
        assert a.finish is not None and a.finish.reason == "length"
        assert (a.finish.prompt_tokens, a.finish.completion_tokens) == (3, 5)
        assert a.token_ids == [TOKEN] * 5


def test_a_stop_string_ends_the_answer_before_it() -> None:
    (answer,) = generate((1, 2, 3), n=1, stops=("aaa",))
    assert text(answer) == ""
    assert answer.finish is not None and answer.finish.reason == "stop"


def test_an_engine_refusal_is_a_typed_error() -> None:
    with pytest.raises(RequestRefused):
        generate(tuple(range(1, 100)), n=1)


def test_the_frontend_imports_no_http() -> None:
    code = (
        "import sys, resin.frontend\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', "
        "'uvicorn') or m.startswith('resin.server')))\n"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")  # this checkout, not an installed copy
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"
