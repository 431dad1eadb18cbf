"""Parsers never raise on model output, and any split of random output gives the same result."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resin.recipe import JinjaRecipe, Message, get_native_recipe
from tests.recipe.assets import extended_qwen3, npm_tokenizer
from tests.recipe.corpus import TOOLS
from tests.recipe.harness import run_ids, run_text

# Pieces that exercise every marker of every family, mixed with ordinary text.
PIECES = [
    "<think>",
    "</think>",
    "\n",
    "\n\n",
    "<tool_call>",
    "</tool_call>",
    '{"name": "f", ',
    '"arguments": {"a": "x y"}}',
    "}",
    "{",
    '"',
    "hello",
    " 😀",
    "中文",
    "<|python_tag|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "f",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<|tool_call_start|>",
    "[f(a=1)]",
    "<|tool_call_end|>",
    "<|channel|>",
    "analysis",
    "final",
    "commentary to=functions.f",
    "<|message|>",
    "<|end|>",
    "<|start|>assistant",
    "<|constrain|>json",
    "<",
    "|",
    ">",
]


def _recipes() -> list[tuple[str, Any]]:
    deepseek, _ = extended_qwen3("deepseek_v3")
    lfm2, _ = extended_qwen3("lfm2")
    return [
        ("qwen3", get_native_recipe("qwen3", npm_tokenizer("qwen3"))),
        ("chatml", get_native_recipe("chatml", npm_tokenizer("qwen3"))),
        ("llama3", get_native_recipe("llama3", npm_tokenizer("llama3"))),
        ("deepseek_v3", get_native_recipe("deepseek_v3", deepseek)),
        ("lfm2", get_native_recipe("lfm2", lfm2)),
        ("gpt_oss", get_native_recipe("gpt_oss", npm_tokenizer("gptoss"))),
        ("jinja_gemma", JinjaRecipe(npm_tokenizer("gemma3"))),
    ]


@pytest.mark.parametrize("index", range(7))
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_random_marker_soup(index: int, data: st.DataObject) -> None:
    name, recipe = _recipes()[index]
    tools = TOOLS if data.draw(st.booleans(), label="tools") else None
    thinking = data.draw(st.sampled_from([None, True, False]), label="thinking")
    prompt = recipe.render([Message("user", "hi")], tools=tools, enable_thinking=thinking)
    output = "".join(data.draw(st.lists(st.sampled_from(PIECES), max_size=25), label="output"))
    reason = data.draw(st.sampled_from(["stop", "length"]), label="reason")
    ids = recipe.tokenizer.encode(output)
    whole = run_ids(recipe, prompt, ids, [], reason, tools)
    splits = data.draw(st.lists(st.integers(0, len(ids)), max_size=12), label="splits")
    assert run_ids(recipe, prompt, ids, splits, reason, tools) == whole, name
    assert run_ids(recipe, prompt, ids, list(range(len(ids))), reason, tools) == whole, name
    # The text path gets what the ids decode to (a tokenizer may normalize, e.g. "▁" -> " ").
    text = recipe.tokenizer.decode(ids)
    text_splits = data.draw(st.lists(st.integers(0, len(text)), max_size=12), label="tsplits")
    assert run_text(recipe, prompt, text, text_splits, reason, tools) == whole, name


@pytest.mark.parametrize("index", range(7))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_random_token_ids_never_raise(index: int, data: st.DataObject) -> None:
    _, recipe = _recipes()[index]
    vocab = recipe.tokenizer.vocab_size
    ids = data.draw(st.lists(st.integers(0, vocab - 1), max_size=40), label="ids")
    parser = recipe.create_parser(recipe.render([Message("user", "hi")]))
    for start in range(0, len(ids), 3):
        parser.feed(ids[start : start + 3])
    result = parser.finish(data.draw(st.sampled_from(["stop", "length"])))
    assert result.finish_reason in ("stop", "length", "tool_calls")
