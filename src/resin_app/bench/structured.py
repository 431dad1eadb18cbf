"""Acceptance of constrained decoding through the server: N sampled responses with
a `json_schema` response format, N forced tool calls and N answers with tools and
`tool_choice` auto (left out for every other one), temperature 1, the default model
(SmolLM2-135M-Instruct) on the reference runner, all sent at once with the official `openai`
SDK. Every JSON answer must parse and validate against its schema (`jsonschema`); every tool
call must name an offered tool (the named one when named) and its arguments must validate
against that tool's parameters (with auto, an answer without a call is valid too; the rate of
calls is printed, and so is the count of last calls cut by max_tokens, which with auto's free
text first cannot be complete). Prints the rates and writes one JSONL row per sample.

    resin bench structured --n 200 --output bench/structured.jsonl

`--url` targets a running `resin serve` instead of starting one in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "temp_c": {"type": "integer", "minimum": -50, "maximum": 60},
        "sky": {"enum": ["sunny", "cloudy", "rain", "snow"]},
        "windy": {"type": "boolean"},
    },
    "required": ["city", "temp_c", "sky", "windy"],
    "additionalProperties": False,
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 12},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time in a time zone",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"enum": ["UTC", "CET", "PST", "JST"]}},
                "required": ["zone"],
                "additionalProperties": False,
            },
        },
    },
]
ONE_SHOT = [
    {"role": "user", "content": "What time is it in London?"},
    {"role": "assistant",
     "content": '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'},
]  # fmt: skip
QUESTIONS = ["Weather in Paris?", "What time is it in Tokyo?", "Is it raining in Oslo?",
             "Tell me about Lima."]  # fmt: skip


def _validate(instance: Any, schema: dict[str, Any]) -> str | None:
    import jsonschema

    try:
        jsonschema.validate(instance, schema)
    except jsonschema.ValidationError as exc:
        return str(exc.message)
    return None


async def json_sample(client: Any, model: str, i: int, max_tokens: int) -> dict[str, Any]:
    r = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": f"{QUESTIONS[i % 4]} Answer in JSON."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}},
        temperature=1.0,
        max_tokens=max_tokens,
    )  # fmt: skip
    choice = r.choices[0]
    text = choice.message.content or ""
    try:
        error = _validate(json.loads(text), SCHEMA)
    except ValueError as exc:
        error = f"not JSON: {exc}"
    return {"kind": "json_schema", "i": i, "finish": choice.finish_reason, "text": text,
            "valid": error is None, "error": error}  # fmt: skip


async def tool_sample(client: Any, model: str, i: int, max_tokens: int) -> dict[str, Any]:
    named = TOOLS[i % 2]["function"]["name"] if i % 3 == 0 else None
    choice_arg: Any = {"type": "function", "function": {"name": named}} if named else "required"
    extra = {"tool_choice": choice_arg}
    return await _tool_row(client, model, i, max_tokens, "tool_call", named, extra)


async def auto_sample(client: Any, model: str, i: int, max_tokens: int) -> dict[str, Any]:
    """Tools with auto (or no tool_choice): the default model rarely calls a tool unprompted,
    so the conversation shows it one call first (its own earlier turn, as plain text)."""
    extra = {"tool_choice": "auto"} if i % 2 else {}
    messages = [*ONE_SHOT, {"role": "user", "content": QUESTIONS[i % 4]}]
    return await _tool_row(client, model, i, max_tokens, "tool_auto", None, extra, messages)


async def _tool_row(
    client: Any, model: str, i: int, max_tokens: int, kind: str, named: str | None,
    extra: dict[str, Any], messages: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:  # fmt: skip
    r = await client.chat.completions.create(
        model=model,
        messages=messages or [{"role": "user", "content": QUESTIONS[i % 4]}],
        tools=TOOLS,
        temperature=1.0,
        max_tokens=max_tokens,
        **extra,
    )
    msg = r.choices[0].message
    calls = msg.tool_calls or []
    error = None
    offered = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    if not calls and kind == "tool_call":
        error = f"no tool call (content {msg.content!r})"
    finish = r.choices[0].finish_reason
    cut = False
    for n, call in enumerate(calls, 1):
        name = call.function.name
        if name not in offered or (named and name != named):
            error = f"called {name!r}"
            break
        try:
            error = _validate(json.loads(call.function.arguments), offered[name])
        except ValueError as exc:
            # With auto, free text may use up max_tokens before the last call is written: a
            # call cut there cannot validate and says nothing of the grammar (counted apart).
            cut = kind == "tool_auto" and finish == "length" and n == len(calls)
            error = None if cut else f"arguments not JSON: {exc}"
        if error:
            break
    return {"kind": kind, "i": i, "tool_choice": named or extra.get("tool_choice", "(left out)"),
            "finish": finish, "content": msg.content,
            "calls": [[c.function.name, c.function.arguments] for c in calls],
            "valid": error is None, "cut": cut, "error": error}  # fmt: skip


SAMPLERS = {"json_schema": json_sample, "tool_call": tool_sample, "tool_auto": auto_sample}


async def sample_all(
    url: str, model: str, n: int, max_tokens: int, kinds: tuple[str, ...] = tuple(SAMPLERS)
) -> list[dict[str, Any]]:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=900)
    jobs = [SAMPLERS[kind](client, model, i, max_tokens) for kind in kinds for i in range(n)]
    try:
        return list(await asyncio.gather(*jobs))
    finally:
        await client.close()


@contextmanager
def default_server(context_length: int = 2048) -> Iterator[tuple[str, str]]:
    """The default model behind an in-process server: (base url, model name)."""
    from resin.server import HttpServer
    from resin.server.launch import free_port, running
    from resin_app.loading import LoadOptions, load

    loaded = load(LoadOptions(context_length=context_length), progress=False)
    server = HttpServer(loaded.engine, loaded.recipe, tokenizer=loaded.tokenizer, model=loaded.name,
                        port=free_port(), context_length=loaded.context_length)  # fmt: skip
    try:
        with running(server) as url:
            yield url, loaded.name
    finally:
        loaded.engine.close()


def summary(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        out[kind] = (sum(r["valid"] for r in mine), len(mine))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resin bench structured", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--n", type=int, default=200, help="samples of each kind")
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--url", default=None, help="a running server (else start one)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--kinds", default=",".join(SAMPLERS), help="which samples to take")
    parser.add_argument("--output", type=Path, default=None, help="JSONL file to write")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    start = time.perf_counter()
    if args.url:
        rows = asyncio.run(sample_all(args.url, args.model, args.n, args.max_tokens, kinds))
    else:
        with default_server() as (url, model):
            rows = asyncio.run(sample_all(url, model, args.n, args.max_tokens, kinds))
    elapsed = time.perf_counter() - start
    for kind, (ok, total) in summary(rows).items():
        called = sum(bool(r.get("calls")) for r in rows if r["kind"] == kind)
        cut = sum(bool(r.get("cut")) for r in rows if r["kind"] == kind)
        print(f"{kind:<12} valid {ok}/{total} ({100.0 * ok / max(total, 1):.1f}%), "
              f"{called} with tool calls, {cut} cut by max_tokens")  # fmt: skip
    print(f"elapsed {elapsed:.1f} s")
    for row in rows:
        if not row["valid"]:
            print("INVALID", json.dumps(row)[:300])
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({**row, "elapsed_s": elapsed}) + "\n")
    return 0 if all(r["valid"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
