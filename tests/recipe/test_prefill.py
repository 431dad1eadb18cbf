"""Continuing the final assistant message (`continue_final_message`, Anthropic's prefill).

Every recipe renders the prefilled conversation as transformers' `apply_chat_template(...,
continue_final_message=True)` does with the family's official template, and its parser,
primed with the prefill, reports only what the model adds (in any split)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resin.recipe import JinjaRecipe, Message, Reasoning, Text, ToolCall, ToolChoice
from resin.recipe import get_native_recipe as native
from tests.recipe.assets import (
    TEMPLATES,
    extended_qwen3,
    hf_tokenizer,
    npm_tokenizer,
    smollm2_hf,
    smollm2_tokenizer,
)
from tests.recipe.corpus import TOOLS
from tests.recipe.harness import check_all_splits

SETTINGS = settings(max_examples=5, deadline=None)
PREFILL = "The capital of France is"
CHAT = [
    Message("system", "Answer briefly."),
    Message("user", "What is the capital of France?"),
    Message("assistant", PREFILL),
]
HF_CHAT = [{"role": m.role.value, "content": m.text} for m in CHAT]


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


def _cases() -> dict[str, tuple[Any, Any, str | None]]:
    """recipe name -> (recipe, transformers tokenizer, template or None for its own)."""
    ds_tok, ds_hf = extended_qwen3("deepseek_v3")
    lfm_tok, lfm_hf = extended_qwen3("lfm2")
    return {
        "qwen3": (native("qwen3", npm_tokenizer("qwen3")), hf_tokenizer("qwen3"), None),
        "chatml": (native("chatml", npm_tokenizer("qwen3")), hf_tokenizer("qwen3"), None),
        "jinja:qwen3": (JinjaRecipe(npm_tokenizer("qwen3")), hf_tokenizer("qwen3"), None),
        "llama3": (
            native("llama3", npm_tokenizer("llama3")),
            hf_tokenizer("llama3"),
            _template("llama3"),
        ),
        "deepseek_v3": (native("deepseek_v3", ds_tok), ds_hf, _template("deepseek_v3")),
        "lfm2": (native("lfm2", lfm_tok), lfm_hf, _template("lfm2")),
        "gpt_oss": (
            native("gpt_oss", npm_tokenizer("gptoss")),
            hf_tokenizer("gptoss"),
            _template("gpt_oss"),
        ),
        "smollm2": (JinjaRecipe(smollm2_tokenizer()), smollm2_hf(), None),
    }


NAMES = ["qwen3", "chatml", "jinja:qwen3", "llama3", "deepseek_v3", "lfm2", "gpt_oss", "smollm2"]


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(data=st.data())
def test_prefill_continues_like_transformers(name: str, data: st.DataObject) -> None:
    recipe, hf, template = _cases()[name]
    expected = hf.apply_chat_template(
        HF_CHAT,
        chat_template=template,
        add_generation_prompt=False,
        continue_final_message=True,
        tokenize=False,
    )
    prompt = recipe.render(CHAT, continue_final_message=True)
    if name == "chatml":  # Qwen3's template adds a think block that ChatML does not have
        expected = expected.replace("<think>\n\n</think>\n\n", "")
    assert prompt.text == expected
    assert prompt.token_ids == recipe.tokenizer.encode(expected)
    assert prompt.text.endswith(PREFILL) and prompt.prefill.endswith(PREFILL)
    assert prompt.head + prompt.prefill == prompt.text
    # The prefill is what the generation prompt would be followed by.
    assert prompt.head.startswith(recipe.render(CHAT[:-1]).text) or name == "deepseek_v3"
    result = check_all_splits(recipe, prompt, " Paris.", data)
    assert result.text == " Paris." and result.reasoning == "" and not result.calls


@SETTINGS
@given(data=st.data())
def test_reasoning_prefill_goes_on_reasoning(data: st.DataObject) -> None:
    recipe = native("qwen3", npm_tokenizer("qwen3"))
    chat = [*CHAT[:-1], Message("assistant", [Reasoning("France, so")])]
    prompt = recipe.render(chat, continue_final_message=True)
    assert prompt.text.endswith("<|im_start|>assistant\n<think>\nFrance, so")
    result = check_all_splits(recipe, prompt, " Paris.\n</think>\n\nParis.", data)
    assert (result.reasoning, result.text) == (" Paris.", "Paris.")


@SETTINGS
@given(data=st.data())
def test_prefill_that_opens_a_tool_call_parses_the_call(data: st.DataObject) -> None:
    recipe = native("qwen3", npm_tokenizer("qwen3"))
    opened = '<tool_call>\n{"name": "get_weather", "arguments": {"city": '
    chat = [*CHAT[:-1], Message("assistant", opened)]
    prompt = recipe.render(chat, tools=TOOLS, continue_final_message=True)
    assert prompt.text.endswith(opened)
    result = check_all_splits(recipe, prompt, '"Paris"}}\n</tool_call>', data, tools=TOOLS)
    # The call is the model's: the arguments it continued after the prefill.
    assert [name for name, _ in result.calls] == ["get_weather"]
    assert result.text == ""


def test_prefill_errors_and_empty_prefill() -> None:
    recipe = native("qwen3", npm_tokenizer("qwen3"))
    with pytest.raises(ValueError, match="the assistant's"):
        recipe.render(CHAT[:-1], continue_final_message=True)
    call = Message("assistant", [Text("Let me look."), ToolCall("c1", "get_weather", "{}")])
    with pytest.raises(ValueError, match="not tool calls"):
        recipe.render([*CHAT[:-1], call], tools=TOOLS, continue_final_message=True)
    with pytest.raises(ValueError, match="forced tool_choice"):
        recipe.render(CHAT, tools=TOOLS, tool_choice=ToolChoice(), continue_final_message=True)
    # An empty prefill is no prefill: a fresh assistant turn.
    empty = recipe.render([*CHAT[:-1], Message("assistant", "")], continue_final_message=True)
    assert empty.text == recipe.render(CHAT[:-1]).text and empty.prefill == ""
