"""Llama 3, DeepSeek V3, LFM2 and gpt-oss response parsing, in every split."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resin.recipe import Message, ToolChoice, UnsupportedToolChoice, get_native_recipe
from tests.recipe.assets import extended_qwen3, npm_tokenizer
from tests.recipe.corpus import TOOLS
from tests.recipe.harness import check_all_splits

SETTINGS = settings(max_examples=6, deadline=None)
USER = [Message("user", "Weather in Paris?")]


@SETTINGS
@given(data=st.data())
def test_llama3_bare_json_tool_call(data: st.DataObject) -> None:
    recipe = get_native_recipe("llama3", npm_tokenizer("llama3"))
    prompt = recipe.render(USER, tools=TOOLS)
    out = '{"name": "get_weather", "parameters": {"city": "Paris \\"Île\\" 🗼"}}'
    result = check_all_splits(recipe, prompt, out, data, tools=TOOLS)
    assert result.calls == (("get_weather", '{"city": "Paris \\"Île\\" 🗼"}'),)
    assert result.text == "" and result.finish_reason == "tool_calls"


@SETTINGS
@given(data=st.data())
def test_llama3_text_and_json_looking_text(data: st.DataObject) -> None:
    recipe = get_native_recipe("llama3", npm_tokenizer("llama3"))
    prompt = recipe.render(USER, tools=TOOLS)
    for out in ("It is sunny in Paris 😀.", '{"not": "a call"} is JSON.'):
        result = check_all_splits(recipe, prompt, out, data, tools=TOOLS)
        assert result.text == out and result.calls == ()
    no_tools = recipe.render(USER)
    result = check_all_splits(recipe, no_tools, '{"name": "x"}', data)
    assert result.text == '{"name": "x"}'


@SETTINGS
@given(data=st.data())
def test_deepseek_thinking_prompt_and_tool_calls(data: st.DataObject) -> None:
    tokenizer, _ = extended_qwen3("deepseek_v3")
    recipe = get_native_recipe("deepseek_v3", tokenizer)
    prompt = recipe.render(USER, tools=TOOLS, enable_thinking=True)
    assert prompt.text.endswith("<think>")
    out = (
        "The user wants weather.</think>Checking."
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>'
        '{"query": "天气"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
    )
    result = check_all_splits(recipe, prompt, out, data)
    assert result.reasoning == "The user wants weather."
    assert result.text == "Checking."
    assert result.calls == (("get_weather", '{"city": "Paris"}'), ("search", '{"query": "天气"}'))
    assert result.finish_reason == "tool_calls"


@SETTINGS
@given(data=st.data())
def test_deepseek_unterminated_reasoning_and_malformed_call(data: st.DataObject) -> None:
    tokenizer, _ = extended_qwen3("deepseek_v3")
    recipe = get_native_recipe("deepseek_v3", tokenizer)
    thinking = recipe.render(USER, enable_thinking=True)
    result = check_all_splits(recipe, thinking, "Hmm, let me", data, stop=False, reason="length")
    assert result.reasoning == "Hmm, let me" and result.finish_reason == "length"
    plain = recipe.render(USER)
    bad = "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{city: Paris}<｜tool▁call▁end｜>"
    result = check_all_splits(recipe, plain, "Ok " + bad, data)
    assert result.calls == () and result.has_error and result.text == "Ok " + bad


@SETTINGS
@given(data=st.data())
def test_lfm2_pythonic_and_json_calls(data: st.DataObject) -> None:
    tokenizer, _ = extended_qwen3("lfm2")
    recipe = get_native_recipe("lfm2", tokenizer)
    prompt = recipe.render(USER, tools=TOOLS)
    out = (
        '<|tool_call_start|>[get_weather(city="Paris", unit="celsius"), search(query="a, b", '
        "limit=3)]<|tool_call_end|>Let me check."
    )
    result = check_all_splits(recipe, prompt, out, data)
    assert result.calls == (
        ("get_weather", '{"city": "Paris", "unit": "celsius"}'),
        ("search", '{"query": "a, b", "limit": 3}'),
    )
    assert result.text == "Let me check." and result.finish_reason == "tool_calls"
    json_out = '<|tool_call_start|>{"name": "search", "arguments": {"query": "x"}}<|tool_call_end|>'
    result = check_all_splits(recipe, prompt, json_out, data)
    assert result.calls == (("search", '{"query": "x"}'),)
    bad = "<|tool_call_start|>[get_weather(city=]<|tool_call_end|>"
    result = check_all_splits(recipe, prompt, bad, data)
    assert result.calls == () and result.has_error and result.text == bad


@SETTINGS
@given(data=st.data())
def test_gpt_oss_channels_and_tool_call(data: st.DataObject) -> None:
    recipe = get_native_recipe("gpt_oss", npm_tokenizer("gptoss"))
    prompt = recipe.render(USER, tools=TOOLS)
    assert prompt.text.endswith("<|start|>assistant")
    answer = (
        "<|channel|>analysis<|message|>Need weather 😀.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Sunny, 21 °C.<|return|>"
    )
    result = check_all_splits(recipe, prompt, answer, data, stop=False)
    assert result.reasoning == "Need weather 😀." and result.text == "Sunny, 21 °C."
    args = json.dumps({"city": 'Paris "Île"'}, ensure_ascii=False)
    call = (
        "<|channel|>analysis<|message|>Call the tool.<|end|><|start|>assistant<|channel|>"
        f"commentary to=functions.get_weather <|constrain|>json<|message|>{args}<|call|>"
    )
    result = check_all_splits(recipe, prompt, call, data, stop=False)
    assert result.calls == (("get_weather", args),) and result.finish_reason == "tool_calls"
    bad = '<|channel|>commentary to=functions.get_weather json<|message|>{"city": <|call|>'
    result = check_all_splits(recipe, prompt, bad, data, stop=False)
    assert result.calls == () and result.has_error and result.text == '{"city": '


@SETTINGS
@given(data=st.data())
def test_gpt_oss_unterminated_analysis_at_length(data: st.DataObject) -> None:
    recipe = get_native_recipe("gpt_oss", npm_tokenizer("gptoss"))
    prompt = recipe.render(USER)
    out = "<|channel|>analysis<|message|>Thinking about <|end"
    result = check_all_splits(recipe, prompt, out, data, stop=False, reason="length")
    assert result.reasoning == "Thinking about <|end" and result.finish_reason == "length"


def test_gpt_oss_stop_tokens() -> None:
    tok = npm_tokenizer("gptoss")
    recipe = get_native_recipe("gpt_oss", tok)
    assert {tok.token_to_id("<|return|>"), tok.token_to_id("<|call|>")} <= set(
        recipe.stop_token_ids
    )
    assert tok.token_to_id("<|end|>") not in recipe.stop_token_ids


@SETTINGS
@given(data=st.data())
def test_glm45_reasoning_and_xml_tool_calls(data: st.DataObject) -> None:
    tokenizer, _ = extended_qwen3("glm4_moe")
    recipe = get_native_recipe("glm4_moe", tokenizer)
    prompt = recipe.render(USER, tools=TOOLS)
    assert prompt.text.endswith("<|assistant|>")
    out = (
        "\n<think>The user wants weather.</think>\nChecking."
        "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris 🗼</arg_value>\n"
        "</tool_call>\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>42</arg_value>\n"
        "<arg_key>limit</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    )
    result = check_all_splits(recipe, prompt, out, data, tools=TOOLS)
    assert result.reasoning == "The user wants weather."
    assert result.text.strip() == "Checking."
    # `query` is a string in its schema: "42" stays text; `limit` is JSON.
    assert result.calls == (
        ("get_weather", '{"city": "Paris 🗼"}'),
        ("search", '{"query": "42", "limit": 3}'),
    )
    assert result.finish_reason == "tool_calls"


@SETTINGS
@given(data=st.data())
def test_glm45_no_thinking_answer_and_malformed_call(data: st.DataObject) -> None:
    tokenizer, _ = extended_qwen3("glm4_moe")
    recipe = get_native_recipe("glm4_moe", tokenizer)
    prompt = recipe.render(USER, enable_thinking=False)
    assert prompt.text.endswith("/nothink<|assistant|>\n<think></think>")
    result = check_all_splits(recipe, prompt, "\nIt is sunny.", data)
    assert result.text == "It is sunny." and result.reasoning == ""
    bad = "<tool_call>get_weather\n<arg_key>city</arg_key>Paris</tool_call>"
    result = check_all_splits(recipe, recipe.render(USER, tools=TOOLS), bad, data, tools=TOOLS)
    assert result.calls == () and result.has_error and result.text == bad
    with pytest.raises(UnsupportedToolChoice):
        recipe.render(USER, tools=TOOLS, tool_choice=ToolChoice())
