"""`tool_choice` forcing: the rendered prompt ends with the forced prefix, and a parser fed the
rest of the call (in any split) yields exactly one tool call with the forced name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resin.recipe import (
    JinjaRecipe,
    Message,
    ToolChoice,
    UnsupportedToolChoice,
    get_native_recipe,
)
from tests.recipe.assets import extended_qwen3, npm_tokenizer
from tests.recipe.corpus import TOOLS
from tests.recipe.harness import check_all_splits

SETTINGS = settings(max_examples=5, deadline=None)
USER = [Message("user", "Weather in Paris?")]
ARGS = {"city": 'Paris "Île" 🗼', "days": [1, 2]}
ARGS_JSON = json.dumps(ARGS, ensure_ascii=False)


def _recipe(kind: str) -> Any:
    if kind in ("deepseek_v3", "lfm2"):
        return get_native_recipe(kind, extended_qwen3(kind)[0])
    if kind == "jinja:qwen3":
        return JinjaRecipe(npm_tokenizer("qwen3"))
    return get_native_recipe(kind, npm_tokenizer("qwen3" if kind == "chatml" else kind))


HERMES_END = f"{ARGS_JSON}}}\n</tool_call>"
HERMES_CALL = f'{{"name": "get_weather", "arguments": {HERMES_END}'
DS_END = f"{ARGS_JSON}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
# recipe -> (the rest of a call after the named prefix, after the "required" prefix)
CASES = {
    "qwen3": (HERMES_END, HERMES_CALL),
    "chatml": (HERMES_END, HERMES_CALL),
    "jinja:qwen3": (HERMES_END, HERMES_CALL),
    "llama3": (f"{ARGS_JSON}}}", f'get_weather", "parameters": {ARGS_JSON}}}'),
    "deepseek_v3": (DS_END, f"get_weather<｜tool▁sep｜>{DS_END}"),
}


@pytest.mark.parametrize("kind", sorted(CASES))
@SETTINGS
@given(data=st.data())
def test_forced_named_and_required(kind: str, data: st.DataObject) -> None:
    recipe = _recipe(kind)
    named_rest, required_rest = CASES[kind]
    for choice, rest in ((ToolChoice("get_weather"), named_rest), (ToolChoice(), required_rest)):
        prompt = recipe.render(USER, tools=TOOLS, tool_choice=choice)
        plain = recipe.render(USER, tools=TOOLS)
        assert prompt.forced_prefix and prompt.text == plain.text + prompt.forced_prefix
        assert prompt.token_ids == recipe.tokenizer.encode(prompt.text)
        if choice.name:
            assert "get_weather" in prompt.forced_prefix
        result = check_all_splits(recipe, prompt, rest, data, tools=TOOLS)
        assert result.calls == (("get_weather", ARGS_JSON),), result
        assert result.text == "" and not result.has_error
        assert result.finish_reason == "tool_calls"


@SETTINGS
@given(data=st.data())
def test_lfm2_pythonic_named(data: st.DataObject) -> None:
    recipe = _recipe("lfm2")
    prompt = recipe.render(USER, tools=TOOLS, tool_choice=ToolChoice("get_weather"))
    assert prompt.text.endswith("<|tool_call_start|>[get_weather(")
    result = check_all_splits(recipe, prompt, 'city="Paris")]<|tool_call_end|>', data, tools=TOOLS)
    assert result.calls == (("get_weather", '{"city": "Paris"}'),)


def test_prefix_text_never_reaches_the_client() -> None:
    recipe = _recipe("qwen3")
    prompt = recipe.render(USER, tools=TOOLS, tool_choice=ToolChoice("get_weather"))
    parser = recipe.create_parser(prompt, tools=TOOLS)
    ids = recipe.tokenizer.encode('{"city": "Rome"}}\n</tool_call>')
    deltas = parser.feed(ids) + list(parser.finish().deltas)
    assert all("tool_call" not in str(getattr(d, "text", "")) for d in deltas)
    assert [c.name for c in parser.finish().tool_calls] == ["get_weather"]


def test_malformed_forced_call_is_text_and_error() -> None:
    recipe = _recipe("qwen3")
    prompt = recipe.render(USER, tools=TOOLS, tool_choice=ToolChoice("get_weather"))
    parser = recipe.create_parser(prompt, tools=TOOLS)
    parser.feed(recipe.tokenizer.encode("oops</tool_call>"))
    result = parser.finish()
    assert result.tool_calls == () and result.error is not None
    assert "get_weather" in result.text  # the forced prefix is part of the raw call text


def test_bad_choices_are_clear_errors() -> None:
    recipe = _recipe("qwen3")
    with pytest.raises(ValueError, match="not in tools"):
        recipe.render(USER, tools=TOOLS, tool_choice=ToolChoice("nope"))
    with pytest.raises(ValueError, match="at least one tool"):
        recipe.render(USER, tool_choice=ToolChoice())
    gpt_oss = get_native_recipe("gpt_oss", npm_tokenizer("gptoss"))
    with pytest.raises(UnsupportedToolChoice, match="'required' is not supported"):
        gpt_oss.render(USER, tools=TOOLS, tool_choice=ToolChoice())
    generic = JinjaRecipe(npm_tokenizer("gemma3"))  # Gemma 3: no known tool-call format
    with pytest.raises(UnsupportedToolChoice, match="not supported by this model's chat format"):
        generic.render(USER, tools=TOOLS, tool_choice=ToolChoice("get_weather"))
