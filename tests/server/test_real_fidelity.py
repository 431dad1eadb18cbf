"""Protocol defects real clients hit, each through an official SDK against `resin serve` itself: a
subprocess serving the real default model (SmolLM2-135M-Instruct, reference runner, real
Engine and prefix cache, llguidance), started with `--generation-config FILE`. No test double
anywhere: what a client of a real deployment sees.

The FILE makes greedy decoding the default (temperature 0) and caps answers at 12 tokens,
so requests that send neither are deterministic and short on the shared CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from resin.server.launch import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {"temperature": 0.0, "max_new_tokens": 12}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    default_model = pytest.importorskip("resin_model.default_model")
    try:
        default_model.default_model_dir()
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"default model unavailable: {exc}")
    folder = tmp_path_factory.mktemp("serve")
    config = folder / "generation_config.json"
    config.write_text(json.dumps(DEFAULTS), encoding="utf-8")
    port = free_port()
    cmd = [sys.executable, "-m", "resin_app.cli", "serve", "--port", str(port),
           "--context-length", "2048", "--generation-config", str(config)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    log = folder / "serve.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while "serving" not in log.read_text() and proc.poll() is None:  # the ready banner
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert proc.poll() is None and base in log.read_text(), log.read_text()
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=120)


def test_generation_config_file_fills_what_a_request_leaves_out(oai: openai.OpenAI) -> None:
    """A bare request takes the FILE's temperature and max_tokens (it sampled at T=1 and
    answered noise before); a field the request sends wins; `/v1/models` shows them."""
    (card,) = oai.models.list().data
    assert card.model_extra is not None
    assert card.model_extra["generation_defaults"] == {"temperature": 0.0, "max_tokens": 12}
    bare = [oai.chat.completions.create(model="default", messages=QUESTION) for _ in range(2)]  # type: ignore[arg-type]
    sent = oai.chat.completions.create(
        model="default",
        messages=QUESTION,
        temperature=0,
        max_tokens=12,  # type: ignore[arg-type]
    )
    texts = {r.choices[0].message.content for r in (*bare, sent)}
    assert len(texts) == 1 and "Paris" in (texts.pop() or "")
    assert all(r.usage and r.usage.completion_tokens <= 12 for r in bare)
    short = oai.chat.completions.create(model="default", messages=QUESTION, max_tokens=2)  # type: ignore[arg-type]
    assert short.usage and short.usage.completion_tokens == 2


def test_unknown_model_is_404_on_every_route_and_codes_are_strings(
    url: str, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    """OpenAI routes and Anthropic's `/v1/messages` + `count_tokens` answer an unknown model
    alike; OpenAI's `error.code` is a string or null, never the integer status."""
    calls = [
        lambda: oai.chat.completions.create(model="gpt-x", messages=QUESTION),  # type: ignore[arg-type]
        lambda: oai.completions.create(model="gpt-x", prompt="Hi"),
        lambda: oai.responses.create(model="gpt-x", input="Hi"),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.code == "model_not_found"
    for call in (
        lambda: claude.messages.create(model="claude-x", max_tokens=4, messages=QUESTION),  # type: ignore[arg-type]
        lambda: claude.messages.count_tokens(model="claude-x", messages=QUESTION),  # type: ignore[arg-type]
    ):
        with pytest.raises(anthropic.NotFoundError) as aerr:
            call()
        assert aerr.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        oai.chat.completions.create(model="default", messages=[])
    assert bad.value.code is None
    for path, body in [("/v1/chat/completions", {"messages": "nope"}),
                       ("/v1/completions", {"model": "gpt-x", "prompt": "x"}),
                       ("/v1/responses/resp_gone", None)]:  # fmt: skip
        r = httpx.post(url + path, json=body) if body else httpx.get(url + path)
        code = r.json()["error"]["code"]
        assert r.status_code in (400, 404) and (code is None or isinstance(code, str)), r.text


def test_anthropic_usage_adds_up_as_litellm_counts_it(
    oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    """Anthropic's input_tokens excludes cache reads: the prompt is input_tokens +
    cache_read_input_tokens + cache_creation_input_tokens, which is how litellm sums it (it
    reported 69 prompt tokens for a 37-token prompt when input_tokens held the cached part too).
    The sum equals count_tokens and the OpenAI route's prompt_tokens for the same messages."""
    doc = [{"role": "user", "content": "A long shared document about rivers. " * 12 + "Summary?"}]
    counted = claude.messages.count_tokens(model="default", messages=doc).input_tokens  # type: ignore[arg-type]
    chat = oai.chat.completions.create(model="default", messages=doc, max_tokens=1)  # type: ignore[arg-type]
    assert chat.usage and chat.usage.prompt_tokens == counted > 64
    for _ in range(2):
        with claude.messages.stream(model="default", max_tokens=2, messages=doc) as stream:  # type: ignore[arg-type]
            start = next(e for e in stream if e.type == "message_start").message.usage
            usage = stream.get_final_message().usage
        cached = usage.cache_read_input_tokens or 0
        litellm_prompt = usage.input_tokens + cached + (usage.cache_creation_input_tokens or 0)
        assert litellm_prompt == counted and start.input_tokens == usage.input_tokens
    assert cached >= 64 and usage.input_tokens < counted - 64  # the repeat read its pages


def test_previous_response_id_continues_the_stored_conversation(oai: openai.OpenAI) -> None:
    """The follow-up's prompt is the stored turn (input and output) then the new input: the
    same tokens as the chat route's prompt for that conversation. GET reads the stored
    response back, DELETE removes it, and a removed id is a 404 with a null code."""
    first = oai.responses.create(model="default", input="My name is Ada. Say hello.")
    assert first.store and first.output_text
    assert oai.responses.retrieve(first.id).output_text == first.output_text
    follow = oai.responses.create(
        model="default", input="What is my name?", previous_response_id=first.id
    )
    turns = [{"role": "user", "content": "My name is Ada. Say hello."},
             {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": "What is my name?"}]  # fmt: skip
    chat = oai.chat.completions.create(model="default", messages=turns, max_tokens=1)  # type: ignore[arg-type]
    assert follow.usage and chat.usage and follow.usage.input_tokens == chat.usage.prompt_tokens
    assert follow.previous_response_id == first.id
    oai.responses.delete(first.id)
    for call in (
        lambda: oai.responses.retrieve(first.id),
        lambda: oai.responses.create(model="default", input="x", previous_response_id=first.id),
    ):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert err.value.code is None


def test_a_call_without_the_wrappers_brace_keeps_its_own(oai: openai.OpenAI) -> None:
    """The model closes its arguments object but not the wrapper (`{"name": ..., "arguments":
    {...}` then `</tool_call>`): the arguments keep their closing brace, stream and not. A
    regex makes the real model write exactly that; the tool parser reads it as it would any
    model's text."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>'
    regex = "".join("\\" + ch if ch in '{}"' else ch for ch in text)
    kwargs: dict[str, Any] = {"model": "default", "messages": QUESTION, "tools": [TOOL],
                              "max_tokens": 40, "extra_body": {"guided_regex": regex}}  # fmt: skip
    r = oai.chat.completions.create(**kwargs)
    (call,) = r.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    assert r.choices[0].finish_reason == "tool_calls" and not r.choices[0].message.content
    chunks = list(oai.chat.completions.create(stream=True, **kwargs))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    streamed = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert json.loads(streamed) == {"city": "Paris"}
