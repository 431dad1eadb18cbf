"""Acceptance on the real default model (SmolLM2-135M-Instruct on CPU, real Engine): the
official SDKs pass chat (stream / non-stream), completions with echo + logprobs, responses
(`responses.stream` + `get_final_response`), messages (`messages.stream`), usage counts and
prefix-cache hits. Small max_tokens: 2 CPU cores."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from resin.server.launch import running
from resin_app import check
from tests.server.conftest import serve_loaded

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    pytest.importorskip("torch")
    from resin_app.loading import LoadOptions, load

    try:
        loaded = load(LoadOptions(context_length=2048), progress=False)
    except (FileNotFoundError, ImportError) as exc:
        pytest.skip(f"default model unavailable: {exc}")
    with running(serve_loaded(loaded)) as base:
        yield base
    loaded.engine.close()


@pytest.fixture(scope="module")
def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_chat_stream_equals_non_stream_and_usage(oai: openai.OpenAI) -> None:
    model = oai.models.list().data[0].id
    question = "You are a geography tutor. Answer in one sentence. What is the capital of France?"
    kwargs = {"model": model, "messages": ask(question), "temperature": 0, "max_tokens": 12}
    full = oai.chat.completions.create(**kwargs)  # type: ignore[call-overload]
    text = full.choices[0].message.content
    assert text and full.usage.completion_tokens <= 12 and full.usage.prompt_tokens > 10
    chunks = list(
        oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)  # type: ignore[call-overload]
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens
    # The same prompt again: its full pages come from the prefix cache.
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_completions_echo_logprobs(oai: openai.OpenAI) -> None:
    r = oai.completions.create(
        model="default", prompt="The sky is", max_tokens=2, echo=True, logprobs=2, temperature=0
    )
    lp = r.choices[0].logprobs
    assert r.choices[0].text.startswith("The sky is")
    assert lp is not None and lp.token_logprobs is not None and lp.token_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.top_logprobs is not None and len(lp.top_logprobs[-1] or {}) >= 1
    assert r.usage is not None and r.usage.completion_tokens == 2


def test_responses_stream_final(oai: openai.OpenAI) -> None:
    # The SDK's get_final_response needs `response.completed`, which a length-truncated
    # answer does not get (it ends with `response.incomplete`): give the model room to stop.
    with oai.responses.stream(
        model="default",
        input="Reply with just the word: hello",
        max_output_tokens=96,
        temperature=0,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output_text and final.usage is not None and final.usage.output_tokens < 96


def test_anthropic_messages_stream(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=120)
    with client.messages.stream(
        model="default", max_tokens=8, messages=[{"role": "user", "content": "Hi!"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.content and final.content[0].type == "text"
    assert final.usage.input_tokens > 0 and 0 < final.usage.output_tokens <= 8


def test_check_holds_the_real_model_to_its_recipe(url: str, tmp_path: Path) -> None:
    """`resin check` on the default model: its template has no tool section, so tools come
    through the generic tool prompt and a forced call must name the tool with valid arguments
    (the grammar makes it so); it claims no reasoning, so that case is skipped with the reason,
    and told to expect reasoning, the case fails."""
    argv = ["--burst", "8", "--ttft-sizes", "8", "--timeout", "120"]
    assert check.main([url, "--output", str(tmp_path / "a.md"), *argv]) == 0
    text = (tmp_path / "a.md").read_text()
    assert "0 failed, 1 skipped" in text
    assert "| tool-call case (forced) | PASS |" in text
    assert "| reasoning case | SKIP | the model's reasoning capability: no |" in text
    assert check.main([url, "--output", str(tmp_path / "b.md"), "--expect-reasoning", *argv]) == 1
    assert "| reasoning case | FAIL |" in (tmp_path / "b.md").read_text()


def test_tools_reach_a_template_without_a_tool_section(oai: openai.OpenAI) -> None:
    """SmolLM2's template ignores `tools`; the recipe states them in the system message instead
    of dropping them (the prompt grows by the tool block)."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    plain = oai.chat.completions.create(model="default", messages=ask("Weather?"), max_tokens=1)
    with_tools = oai.chat.completions.create(
        model="default",
        messages=ask("Weather?"),
        max_tokens=1,
        tools=[tool],  # type: ignore[list-item]
    )
    assert plain.usage and with_tools.usage
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 40


def test_anthropic_prefill_continues_like_a_raw_completion(url: str, oai: openai.OpenAI) -> None:
    """An assistant prefill on the real model: greedy, the answer is exactly what the model
    writes after transformers' `continue_final_message` rendering of the conversation (sent
    as token ids to /v1/completions), and it does not repeat the prefill."""
    from tests.recipe.assets import smollm2_hf

    chat = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"},
    ]
    hf = smollm2_hf()
    text = hf.apply_chat_template(chat, continue_final_message=True, tokenize=False)
    ids = hf.encode(text, add_special_tokens=False)
    raw = oai.completions.create(model="default", prompt=ids, max_tokens=6, temperature=0)
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=120)
    r = client.messages.create(
        model="default",
        max_tokens=6,
        messages=chat,
        extra_body={"temperature": 0},  # type: ignore[arg-type]
    )
    assert r.content and r.content[0].type == "text"
    assert r.content[0].text == raw.choices[0].text and r.content[0].text.strip()
    assert r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0) == len(ids)
