"""The official `openai` SDK against a live server (fake engine, byte ChatML format)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.conftest import MODEL

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "messages": user("hello there"), "temperature": 0, "max_tokens": 64}
    full = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    assert full.choices[0].message.content == "You said: hello there"
    assert full.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
    assert all(c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_usage_and_cached_tokens(client: openai.OpenAI) -> None:
    long = "a long shared prefix " * 20
    first = client.chat.completions.create(model=MODEL, messages=user(long), max_tokens=4)
    assert first.usage is not None and first.usage.completion_tokens == 4
    assert first.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=user(long),
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.prompt_tokens == first.usage.prompt_tokens
    assert last.usage.prompt_tokens_details is not None
    assert last.usage.prompt_tokens_details.cached_tokens >= 400


def test_n_choices_and_stop_string(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=user("one two three"), n=3, stop=["two"], max_tokens=50, seed=1
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    for c in r.choices:
        assert c.message.content == "You said: one " and c.finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens >= 3 * len("You said: one ")


def test_an_answer_cut_to_nothing_by_a_stop_string_is_empty_not_null(url: str) -> None:
    body = {"model": MODEL, "messages": user("one two"), "stop": ["You"], "max_tokens": 20}
    choice = httpx.post(url + "/v1/chat/completions", json=body, timeout=30).json()["choices"][0]
    assert choice["message"]["content"] == "" and choice["finish_reason"] == "stop"


def test_stop_string_split_across_tokens_is_held_back(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=user("abcdef"), stop=["cde"], stream=True, max_tokens=50
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "You said: ab"  # "c" was held back, then dropped with the match


def test_logprobs(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=user("hi"), max_tokens=3, logprobs=True, top_logprobs=2
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and [e.token for e in content] == ["Y", "o", "u"]
    assert all(len(e.top_logprobs) == 2 and e.logprob <= 0 for e in content)


def test_tool_call_stream_and_not(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL, "messages": user("weather in Paris?"), "tools": [WEATHER_TOOL]}
    r = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris"}  # type: ignore[union-attr]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))  # type: ignore[call-overload]
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert deltas and all(d.index == 0 for d in deltas)
    args = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert json.loads(args) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The tool result goes back in; the model answers in text.
    follow = client.chat.completions.create(
        model=MODEL,
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ],
    )
    assert follow.choices[0].finish_reason == "stop"


def test_reasoning_content(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, messages=user("think about it"))
    msg = r.choices[0].message
    assert msg.reasoning_content == "The user wants me to think."  # type: ignore[attr-defined]
    assert msg.content == "You said: think about it"
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=user("think about it"), stream=True)
    )
    thought = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    assert thought == "The user wants me to think."


def test_completions_echo_logprobs_and_token_ids(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="abc", max_tokens=2, echo=True, logprobs=1)
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith("abc")
    assert lp is not None and lp.tokens is not None and lp.tokens[:3] == ["a", "b", "c"]
    assert lp.token_logprobs is not None and lp.token_logprobs[0] is None
    assert len(lp.tokens) == 5 and lp.text_offset == [0, 1, 2, 3, 4]
    scored = client.completions.create(
        model=MODEL, prompt=[[97, 98, 99]], max_tokens=0, echo=True, logprobs=0
    )
    assert scored.choices[0].text == "abc"
    assert scored.choices[0].logprobs.token_logprobs == [None, -1.0, -1.0]  # type: ignore[union-attr]
    batch = client.completions.create(model=MODEL, prompt=["x", "y"], max_tokens=2)
    assert len(batch.choices) == 2
    chunks = list(client.completions.create(model=MODEL, prompt="q", max_tokens=3, stream=True))
    assert chunks[-1].choices[0].finish_reason == "length"


def test_responses_stream_and_final(client: openai.OpenAI) -> None:
    full = client.responses.create(model=MODEL, input="hello resp")
    assert full.output_text == "You said: hello resp" and full.status == "completed"
    with client.responses.stream(model=MODEL, input="think hello") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    assert final.output_text == "You said: think hello"
    assert final.usage is not None and final.usage.output_tokens > 0
    tool = {k: v for k, v in WEATHER_TOOL["function"].items()}  # type: ignore[attr-defined]
    with client.responses.stream(
        model=MODEL, input="weather?", tools=[{"type": "function", **tool}]
    ) as stream:
        for _ in stream:
            pass
        calls = [o for o in stream.get_final_response().output if o.type == "function_call"]
    assert calls and json.loads(calls[0].arguments) == {"city": "Paris"}


def test_responses_previous_response_id_get_and_delete(client: openai.OpenAI) -> None:
    """A stored response continues as `previous_response_id` (its input and output become the
    new prompt's first turns), is read back with GET and removed with DELETE; unknown and
    unstored ids are 404s."""
    first = client.responses.create(model=MODEL, input="my name is Ada")
    assert first.output_text == "You said: my name is Ada" and first.store
    again = client.responses.retrieve(first.id)
    assert again.id == first.id and again.output_text == first.output_text
    follow = client.responses.create(
        model=MODEL, input="what is my name?", previous_response_id=first.id
    )
    alone = client.responses.create(model=MODEL, input="what is my name?", store=False)
    assert follow.previous_response_id == first.id and follow.usage and alone.usage
    assert first.usage is not None
    # The follow-up's prompt holds the first turn and its answer on top of its own question.
    extra = first.usage.input_tokens + first.usage.output_tokens
    assert follow.usage.input_tokens >= alone.usage.input_tokens + extra - 16
    assert follow.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(alone.id)  # store=False
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL, input="x", previous_response_id=first.id)
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert err.value.code is None  # not the unknown model's `model_not_found`


def test_response_store_evicts_the_oldest() -> None:
    from resin.server.errors import ApiError
    from resin.server.response_store import ResponseStore

    store = ResponseStore(capacity=2)
    for i in range(3):
        store.put({"id": f"r{i}", "output": [{"type": "message", "content": []}]}, [])
    with pytest.raises(ApiError) as err:
        store.get("r0")
    assert err.value.status == 404
    assert [len(store.get(r).conversation) for r in ("r1", "r2")] == [1, 1]


def test_models_and_errors(url: str, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
    assert bad.value.status_code == 400
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="other-model", messages=user("x"))
    # OpenAI's error.code is a string or null, never the HTTP status again.
    assert missing.value.code == "model_not_found"
    assert bad.value.code is None
    route = httpx.get(url + "/v1/no-such-route").json()["error"]
    assert route["code"] is None and route["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=user("x" * 5000))  # > context
    r = httpx.post(url + "/v1/chat/completions", json={"messages": "nope"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url + "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400
    big = {"model": MODEL, "messages": user("x" * (5 * 1024 * 1024))}
    assert httpx.post(url + "/v1/chat/completions", json=big).status_code == 413
    clamp = client.chat.completions.create(model=MODEL, messages=user("x" * 4000), max_tokens=999)
    assert clamp.choices[0].finish_reason == "length"
    assert clamp.usage is not None
    assert clamp.usage.prompt_tokens + clamp.usage.completion_tokens == 4096
    extra = httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": user("y"), "max_tokens": 2, "repetition_penalty": 1.1},
    )
    assert extra.status_code == 200


def test_api_key(serve) -> None:  # type: ignore[no-untyped-def]
    with serve(api_key="s3cret") as base:
        assert httpx.get(base + "/health").status_code == 200
        assert httpx.get(base + "/v1/models").status_code == 401
        ok = httpx.get(base + "/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert httpx.get(base + "/v1/models", headers={"x-api-key": "s3cret"}).status_code == 200
        good = openai.OpenAI(base_url=base + "/v1", api_key="s3cret")
        assert good.chat.completions.create(model=MODEL, messages=user("k"), max_tokens=1)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()


def test_metrics_exposed(url: str, client: openai.OpenAI) -> None:
    client.chat.completions.create(model=MODEL, messages=user("m"), max_tokens=2)
    text = httpx.get(url + "/metrics").text
    for name in (
        "resin:num_requests_running",
        "resin:time_to_first_token_seconds_bucket",
        "resin:generation_tokens_total",
        'resin:request_success_total{finished_reason="length"}',
    ):
        assert name in text


def test_huge_top_k_is_no_top_k(serve) -> None:  # type: ignore[no-untyped-def]
    # Found by the fuzz run: a top_k beyond int32 reached the real engine's sampling arrays
    # and killed the engine. Run on the real engine (zero-cost runner) when present.
    from tests.server.test_lifecycle import real_engine

    with serve(real_engine()) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
        r = client.chat.completions.create(
            model=MODEL, messages=user("k"), max_tokens=2, extra_body={"top_k": 26134419042}
        )
        assert r.choices[0].finish_reason == "length"
        assert httpx.get(base + "/health").status_code == 200
