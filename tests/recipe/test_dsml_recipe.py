"""DeepSeek-V4's recipe renders known conversations as the model repository's encoder
(`encoding/encoding_dsv4.py` of deepseek-ai/DeepSeek-V4-Flash) lays them out, the expected
prompts written out here by hand from its rules; and parses DSML tool calls and reasoning in
every split of the output. Qwen3's tokenizer carries the DeepSeek special tokens."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resin.recipe import Message, Reasoning, Text, ToolCall, ToolDef, ToolResult, get_native_recipe
from tests.recipe.assets import extended_qwen3
from tests.recipe.harness import check_all_splits

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
U, A = "<｜User｜>", "<｜Assistant｜>"
WEATHER = ToolDef(
    "get_weather", "Weather of a city",
    {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
)  # fmt: skip
SCHEMA = (
    '{"name": "get_weather", "description": "Weather of a city", "parameters": {"type": '
    '"object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}'
)
TOOLS_SECTION = f"""## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{SCHEMA}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""  # noqa: E501
CALLS = (
    "\n\n<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Lyon</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>"
)


def _recipe():  # type: ignore[no-untyped-def]
    tokenizer, _ = extended_qwen3("deepseek_v3")
    return get_native_recipe("deepseek_v4", tokenizer)


HISTORY = [
    Message("system", "Be brief."),
    Message("user", "Hi"),
    Message("assistant", [Reasoning("greet back"), Text("Hello!")]),
    Message("user", "Weather?"),
]


@pytest.mark.parametrize(
    ("thinking", "expected"),
    [
        (None, f"{BOS}Be brief.{U}Hi{A}</think>Hello!{EOS}{U}Weather?{A}</think>"),
        # earlier reasoning is dropped; the last user turn opens the reasoning
        (True, f"{BOS}Be brief.{U}Hi{A}</think>Hello!{EOS}{U}Weather?{A}<think>"),
    ],
    ids=["chat", "thinking"],
)
def test_multi_turn_chat_and_thinking(thinking: bool | None, expected: str) -> None:
    recipe = _recipe()
    prompt = recipe.render(HISTORY, enable_thinking=thinking)
    assert prompt.text == expected
    assert prompt.token_ids == recipe.tokenizer.encode(expected)


def test_reasoning_after_the_last_user_turn_is_kept() -> None:
    messages = [Message("user", "Hi"), Message("assistant", [Reasoning("r"), Text("a")])]
    rendered = _recipe().render(messages, add_generation_prompt=False, enable_thinking=True)
    assert rendered.text == f"{BOS}{U}Hi{A}<think>r</think>a{EOS}"
    chat = _recipe().render(messages, add_generation_prompt=False)
    assert chat.text == f"{BOS}{U}Hi{A}</think>a{EOS}"


def test_tools_calls_and_results() -> None:
    """Tools go after the (here empty) system text; calls as a DSML block, string arguments
    as they are and others as JSON; results merge into one user turn in the order of the
    calls, with the user's next words after them; with tools every reasoning is kept."""
    calls = [ToolCall("c1", "get_weather", '{"city": "Paris", "days": 2}'),
             ToolCall("c2", "get_weather", '{"city": "Lyon"}')]  # fmt: skip
    messages = [
        Message("user", "Weather in Paris and Lyon?"),
        Message("assistant", [Reasoning("two calls"), *calls]),
        Message("tool", [ToolResult("c2", "rain")]),
        Message("tool", [ToolResult("c1", "sun")]),
        Message("user", "Thanks, and tomorrow?"),
    ]
    recipe = _recipe()
    thinking = recipe.render(messages, tools=[WEATHER], enable_thinking=True)
    results = "<tool_result>sun</tool_result>\n\n<tool_result>rain</tool_result>"
    assert thinking.text == (
        f"{BOS}\n\n{TOOLS_SECTION}{U}Weather in Paris and Lyon?{A}<think>two calls</think>"
        f"{CALLS}{EOS}{U}{results}\n\nThanks, and tomorrow?{A}<think>"
    )
    chat = recipe.render([Message("system", "S"), *messages], tools=[WEATHER])
    assert chat.text == (
        f"{BOS}S\n\n{TOOLS_SECTION}{U}Weather in Paris and Lyon?{A}</think>{CALLS}{EOS}"
        f"{U}{results}\n\nThanks, and tomorrow?{A}</think>"
    )


def test_developer_turns_before_the_last_user_go_when_reasoning_is_dropped() -> None:
    messages = [Message("developer", "Rules."), Message("user", "Hi")]
    recipe = _recipe()
    assert recipe.render(messages).text == f"{BOS}{U}Rules.{U}Hi{A}</think>"
    assert recipe.render(messages, enable_thinking=True).text == f"{BOS}{U}Hi{A}<think>"


SETTINGS = settings(max_examples=6, deadline=None)


@SETTINGS
@given(data=st.data())
def test_parses_reasoning_and_dsml_tool_calls(data: st.DataObject) -> None:
    recipe = _recipe()
    prompt = recipe.render([Message("user", "Weather?")], tools=[WEATHER], enable_thinking=True)
    assert prompt.text.endswith("<think>")
    out = "Two cities.</think>Checking." + CALLS
    result = check_all_splits(recipe, prompt, out, data, tools=[WEATHER])
    assert result.reasoning == "Two cities."
    assert result.text.strip() == "Checking."
    assert [(name, json.loads(args)) for name, args in result.calls] == [
        ("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Lyon"})
    ]  # fmt: skip
    assert result.finish_reason == "tool_calls"


def test_malformed_dsml_is_refused() -> None:
    from resin.recipe.deepseek_v4 import parse_dsml_invoke

    good = ' name="f">\n<｜DSML｜parameter name="x" string="false">[1, 2]</｜DSML｜parameter>\n'
    assert parse_dsml_invoke(good) == [("f", '{"x": [1, 2]}')]
    for bad in (
        ' name="">\n',
        good + "junk",
        good + good.split(">\n", 1)[1],
        ' name="f">\n<｜DSML｜parameter name="x" string="false">[1,</｜DSML｜parameter>',
    ):
        with pytest.raises(ValueError):
            parse_dsml_invoke(bad)


def test_forced_tool_choice_is_refused_clearly() -> None:
    """Forcing a call (`tool_choice` required / named) has no DSML prefix yet: refused."""
    from resin.recipe import ToolChoice, UnsupportedToolChoice

    for choice in (ToolChoice(), ToolChoice("get_weather")):
        with pytest.raises(UnsupportedToolChoice):
            _recipe().render([Message("user", "x")], tools=[WEATHER], tool_choice=choice)
