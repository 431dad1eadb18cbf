"""Qwen3 / ChatML response parsing: whole, token by token and random splits agree."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from resin.recipe import Message, get_native_recipe
from tests.recipe.assets import npm_tokenizer
from tests.recipe.corpus import TOOLS
from tests.recipe.harness import check_all_splits

SETTINGS = settings(max_examples=8, deadline=None)


def _recipe(name: str = "qwen3"):  # type: ignore[no-untyped-def]
    return get_native_recipe(name, npm_tokenizer("qwen3"))


def _prompt(recipe, thinking: bool | None = None):  # type: ignore[no-untyped-def]
    return recipe.render([Message("user", "Hi")], tools=TOOLS, enable_thinking=thinking)


@SETTINGS
@given(data=st.data())
def test_reasoning_then_text(data: st.DataObject) -> None:
    recipe = _recipe()
    out = "<think>\nLet me think 😀 about 中文.\n\n</think>\n\nThe answer is 42 — café."
    result = check_all_splits(recipe, _prompt(recipe), out, data)
    assert result.reasoning == "Let me think 😀 about 中文."
    assert result.text == "The answer is 42 — café."
    assert result.finish_reason == "stop" and not result.has_error


@SETTINGS
@given(data=st.data())
def test_tool_calls_split_mid_string(data: st.DataObject) -> None:
    recipe = _recipe()
    args = {"city": 'Paris "Île-de-France" 🗼', "unit": "celsius"}
    out = (
        "<think>\nI need the weather.\n</think>\n\nLet me check.\n<tool_call>\n"
        + json.dumps({"name": "get_weather", "arguments": args}, ensure_ascii=False)
        + "\n</tool_call>\n<tool_call>\n"
        + json.dumps({"name": "search", "arguments": {"query": "umbrella"}})
        + "\n</tool_call>"
    )
    result = check_all_splits(recipe, _prompt(recipe), out, data)
    assert result.reasoning == "I need the weather."
    assert result.text == "Let me check.\n"
    assert result.calls == (
        ("get_weather", json.dumps(args, ensure_ascii=False)),
        ("search", '{"query": "umbrella"}'),
    )
    assert result.finish_reason == "tool_calls" and not result.has_error


@SETTINGS
@given(data=st.data())
def test_unterminated_reasoning_at_length(data: st.DataObject) -> None:
    recipe = _recipe()
    out = "<think>\nStill thinking about <tool_call> and 😀"
    result = check_all_splits(recipe, _prompt(recipe), out, data, stop=False, reason="length")
    assert result.reasoning == "Still thinking about <tool_call> and 😀"
    assert result.text == "" and result.calls == ()
    assert result.finish_reason == "length"


@SETTINGS
@given(data=st.data())
def test_malformed_tool_json_is_text_with_error(data: st.DataObject) -> None:
    recipe = _recipe()
    bad = '<tool_call>\n{"name": "get_weather" "arguments": {"city": "Paris"}}\n</tool_call>'
    out = "Sure.\n" + bad + "\nDone."
    result = check_all_splits(recipe, _prompt(recipe), out, data)
    assert result.calls == ()
    assert result.text == "Sure.\n" + bad + "Done."
    assert result.has_error and result.finish_reason == "stop"


@SETTINGS
@given(data=st.data())
def test_streamed_call_with_malformed_arguments_keeps_raw_arguments(data: st.DataObject) -> None:
    # Once `"name": ..., "arguments": ` is seen the arguments stream, so a call whose JSON then
    # breaks stays a call: its raw arguments and the error flag (docs/recipes.md).
    recipe = _recipe()
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>'
    result = check_all_splits(recipe, _prompt(recipe), "Sure.\n" + bad + "\nDone.", data)
    assert result.calls == (("get_weather", '{"city":'),)
    assert result.text == "Sure.\nDone."
    assert result.has_error and result.finish_reason == "tool_calls"


@SETTINGS
@given(data=st.data())
def test_unterminated_tool_call_at_length(data: st.DataObject) -> None:
    recipe = _recipe()
    out = 'Checking.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    result = check_all_splits(recipe, _prompt(recipe), out, data, stop=False, reason="length")
    # The arguments were streaming: the cut call keeps its raw arguments, flagged as an error.
    assert result.calls == (("get_weather", '{"city": "Par'),) and result.has_error
    assert result.text == "Checking." and result.finish_reason == "length"


@SETTINGS
@given(data=st.data())
def test_a_call_cut_before_its_arguments_is_no_text(data: st.DataObject) -> None:
    """max_tokens cut the call before its name was complete (a forced call with a small
    budget): no markup comes back as content, no call; after the name: a call, no
    arguments. The finish stays `length` (what OpenAI clients read as cut off)."""
    recipe = _recipe()
    for cut, calls in [
        ('<tool_call>\n{"name": "get_wea', ()),
        ('<tool_call>\n{"name"', ()),
        ('<tool_call>\n{"name": "get_weather", "argu', (("get_weather", ""),)),
    ]:
        result = check_all_splits(recipe, _prompt(recipe), cut, data, stop=False, reason="length")
        assert result.text == "" and result.calls == calls and result.has_error, cut
        assert result.finish_reason == "length"


@SETTINGS
@given(data=st.data())
def test_call_cut_inside_its_end_marker_is_whole(data: st.DataObject) -> None:
    """max_tokens fell inside `</tool_call>` (several tokens where it is not a special token):
    the call's JSON is complete, so it is a valid call, not raw arguments with `}` and
    `</tool` glued on (seen with tool_choice auto on the default model)."""
    recipe = _recipe()
    for call, args in [
        ('{"name": "get_weather", "arguments": {"city": "Paris"}}', '{"city": "Paris"}'),
        ('{"name": "get_weather", "arguments": {"city": "Paris"}', '{"city": "Paris"}'),
        ('{"name": "get_weather", "parameters": {"city": "Oslo"}}', '{"city": "Oslo"}'),
    ]:
        out = f"Checking.<tool_call>\n{call}\n</tool"
        result = check_all_splits(recipe, _prompt(recipe), out, data, stop=False, reason="length")
        assert result.calls == (("get_weather", args),) and not result.has_error, call
        assert result.text == "Checking."


@SETTINGS
@given(data=st.data())
def test_no_thinking_prompt_and_chatml(data: st.DataObject) -> None:
    for name in ("qwen3", "chatml"):
        recipe = _recipe(name)
        out = "Plain answer with <b>markup</b> and a < sign."
        result = check_all_splits(recipe, _prompt(recipe, thinking=False), out, data)
        assert result.text == out and result.reasoning == ""


def test_stop_token_consumed_and_rest_ignored() -> None:
    recipe = _recipe()
    tok = recipe.tokenizer
    parser = recipe.create_parser(_prompt(recipe))
    ids = [*tok.encode("Hello"), tok.token_to_id("<|im_end|>"), *tok.encode(" ignored")]
    parser.feed(ids)
    result = parser.finish()
    assert result.text == "Hello"
    assert set(recipe.stop_token_ids) >= {tok.token_to_id("<|im_end|>")}


def test_think_in_the_middle_is_text() -> None:
    recipe = _recipe()
    parser = recipe.create_parser(_prompt(recipe))
    parser.feed_text("Use the <think> tag like this: <think>x</think>")
    result = parser.finish()
    assert result.text == "Use the <think> tag like this: <think>x</think>"
    assert result.reasoning == ""
