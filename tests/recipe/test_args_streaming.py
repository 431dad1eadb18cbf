"""Tool-call arguments stream in fragments (JSON tool-call formats): fed token by token, a call
starts as soon as its name is known, its arguments arrive in several pieces, none of them holds
the wrapper's `}` or the end marker, and they add up to the final arguments in every split."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from resin.recipe import Message, ToolCallArgsDelta, ToolCallEnd, ToolCallStart, get_native_recipe
from tests.recipe.assets import npm_tokenizer
from tests.recipe.corpus import TOOLS
from tests.recipe.harness import check_all_splits

USER = [Message("user", "Weather in Paris?")]
# Characters the tokenizer round-trips (it NFC-normalizes, so e.g. U+F900 would change).
TEXT = st.text(alphabet='ab Z09{}[]":,<>/\\\néü😀', max_size=8)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def _recipe() -> Any:
    return get_native_recipe("qwen3", npm_tokenizer("qwen3"))


def test_fragments_arrive_before_the_call_ends() -> None:
    recipe = _recipe()
    prompt = recipe.render(USER, tools=TOOLS, enable_thinking=False)
    args = '{"city": "Paris", "unit": "celsius", "note": "a } and </tool"}'
    out = f'<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>'
    parser = recipe.create_parser(prompt, tools=TOOLS)
    steps = [parser.feed([i]) for i in recipe.tokenizer.encode(out)]
    result = parser.finish()
    flat = [(n, d) for n, ds in enumerate(steps) for d in ds]
    start = next(n for n, d in flat if isinstance(d, ToolCallStart))
    fragments = [(n, d.fragment) for n, d in flat if isinstance(d, ToolCallArgsDelta)]
    assert len(fragments) > 5 and fragments[0][0] == start  # the first piece comes at once
    ends = [n for n, d in flat if isinstance(d, ToolCallEnd)]
    assert ends == [len(steps) - 1]  # the call ends with the end marker's last token
    tail = "".join(d.fragment for d in result.deltas if isinstance(d, ToolCallArgsDelta))
    assert "".join(f for _, f in fragments) + tail == args == result.tool_calls[0].arguments
    assert result.error is None


@settings(max_examples=15, deadline=None)
@given(value=st.dictionaries(TEXT, VALUES, max_size=4), data=st.data())
def test_streamed_arguments_equal_the_json_in_every_split(value: Any, data: st.DataObject) -> None:
    recipe = _recipe()
    prompt = recipe.render(USER, tools=TOOLS, enable_thinking=False)
    args = json.dumps(value, ensure_ascii=False)
    out = f'Ok.<tool_call>\n{{"name": "search", "arguments": {args}}}\n</tool_call>'
    result = check_all_splits(recipe, prompt, out, data, tools=TOOLS)
    assert result.calls == (("search", args),) and not result.has_error
    assert json.loads(result.calls[0][1]) == value


def test_string_arguments_are_buffered_and_parsed_whole() -> None:
    recipe = _recipe()
    prompt = recipe.render(USER, tools=TOOLS, enable_thinking=False)
    out = '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}\n</tool_call>'
    parser = recipe.create_parser(prompt, tools=TOOLS)
    parser.feed(recipe.tokenizer.encode(out))
    result = parser.finish()
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("search", '{"query": "x"}')]
    assert result.error is None


@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_a_call_without_the_wrappers_brace_keeps_its_own(data: st.DataObject) -> None:
    """`{"name": ..., "arguments": {...}` + end marker (the wrapper's `}` left out): the
    arguments keep their closing brace, valid JSON, in every split."""
    recipe = _recipe()
    prompt = recipe.render(USER, tools=TOOLS, enable_thinking=False)
    args = '{"city": "Paris", "when": {"day": 1}}'
    for tail in ("\n</tool_call>", ""):  # closed by the end marker, or cut by a stop token
        out = f'<tool_call>\n{{"name": "get_weather", "arguments": {args}{tail}'
        result = check_all_splits(recipe, prompt, out, data, tools=TOOLS)
        assert result.calls == (("get_weather", args),) and not result.has_error, result
