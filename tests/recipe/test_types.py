"""Conversation types and protocol conformance."""

from __future__ import annotations

import pytest

from resin.recipe import (
    JinjaRecipe,
    Message,
    Reasoning,
    Recipe,
    ResponseParser,
    Role,
    Text,
    ToolCall,
    ToolDef,
    ToolResult,
    get_native_recipe,
    native_recipe_names,
)
from tests.recipe.assets import extended_qwen3, npm_tokenizer


def test_message_content_forms() -> None:
    assert Message("user", "hi").content == (Text("hi"),)
    assert Message(Role.USER, "").content == ()
    m = Message(
        "assistant",
        [Reasoning("r"), Text("a"), Text("b"), ToolCall("c", "f", '{"x": 1}')],
    )
    assert (m.text, m.reasoning, m.tool_calls[0].parsed_arguments()) == ("ab", "r", {"x": 1})
    assert Message("tool", [ToolResult("c", "ok")]).tool_results[0].content == "ok"
    with pytest.raises(ValueError):
        Message("robot", "hi")
    with pytest.raises(TypeError):
        Message("user", ["not a block"])  # type: ignore[list-item]
    assert ToolCall("c", "f", "{bad").parsed_arguments() == "{bad"
    assert ToolDef("f", None, {"type": "object"}).to_openai() == {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object"}},
    }


def test_every_recipe_follows_the_protocols() -> None:
    deepseek, _ = extended_qwen3("deepseek_v3")
    lfm2, _ = extended_qwen3("lfm2")
    glm, _ = extended_qwen3("glm4_moe")
    tokenizers = {
        "chatml": npm_tokenizer("qwen3"),
        "qwen3": npm_tokenizer("qwen3"),
        "llama3": npm_tokenizer("llama3"),
        "deepseek_v3": deepseek,
        "deepseek_v4": deepseek,
        "lfm2": lfm2,
        "gpt_oss": npm_tokenizer("gptoss"),
        "glm4_moe": glm,
    }
    assert set(native_recipe_names()) == set(tokenizers)
    recipes = [get_native_recipe(n, t) for n, t in tokenizers.items()]
    recipes.append(JinjaRecipe(npm_tokenizer("gemma3")))
    for recipe in recipes:
        assert isinstance(recipe, Recipe)
        assert recipe.stop_token_ids, recipe.name
        prompt = recipe.render([Message("user", "hi")])
        assert prompt.token_ids and isinstance(recipe.create_parser(prompt), ResponseParser)


def test_missing_special_tokens_are_value_errors() -> None:
    with pytest.raises(ValueError, match="lacks"):
        get_native_recipe("deepseek_v3", npm_tokenizer("qwen3")).render([Message("user", "x")])
    with pytest.raises(ValueError, match="unknown recipe"):
        get_native_recipe("mistral", npm_tokenizer("qwen3"))
