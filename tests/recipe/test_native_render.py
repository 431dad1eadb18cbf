"""Native recipes render token for token what transformers renders with the official template."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from resin.recipe import get_native_recipe
from tests.recipe.assets import TEMPLATES, extended_qwen3, hf_tokenizer, npm_tokenizer
from tests.recipe.corpus import CASES, Case, hf_tools, to_resin, with_string_arguments

THINKING = [None, True, False]


def _hf_ids(hf: Any, case: Case, template: str | None, **kwargs: Any) -> list[int]:
    rendered = hf.apply_chat_template(
        case.messages,
        tools=hf_tools(case.tools),
        chat_template=template,
        add_generation_prompt=case.add_generation_prompt,
        tokenize=False,
        **kwargs,
    )
    return list(hf.encode(rendered, add_special_tokens=False))


def _check(recipe: Any, hf: Any, case: Case, template: str | None, **kwargs: Any) -> None:
    expected = _hf_ids(hf, case, template, **kwargs)
    thinking = kwargs.get("enable_thinking")
    prompt = recipe.render(
        to_resin(case.messages),
        tools=case.tools,
        add_generation_prompt=case.add_generation_prompt,
        enable_thinking=thinking,
    )
    assert prompt.text == hf.decode(expected), case.name
    assert prompt.token_ids == expected, case.name


@pytest.mark.parametrize("thinking", THINKING)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_qwen3_matches_official_template(case: Case, thinking: bool | None) -> None:
    hf = hf_tokenizer("qwen3")
    recipe = get_native_recipe("qwen3", npm_tokenizer("qwen3"))
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    _check(recipe, hf, case, None, **kwargs)


def _no_think_block(case: Case) -> bool:
    """Qwen3's template adds a think block to an assistant turn after the last user query."""
    last_user = max(i for i, m in enumerate(case.messages) if m["role"] == "user")
    return not any(m["role"] == "assistant" for m in case.messages[last_user:])


@pytest.mark.parametrize("case", [c for c in CASES if _no_think_block(c)], ids=lambda c: c.name)
def test_chatml_matches_qwen3_template_without_reasoning(case: Case) -> None:
    # ChatML is Qwen3's format minus reasoning; the two agree wherever Qwen3 adds no think block.
    messages = to_resin(case.messages)
    hf = hf_tokenizer("qwen3")
    recipe = get_native_recipe("chatml", npm_tokenizer("qwen3"))
    assert messages
    _check(recipe, hf, case, None)


def _template(name: str) -> str:
    return (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_llama3_matches_official_template(case: Case) -> None:
    hf = hf_tokenizer("llama3")
    recipe = get_native_recipe("llama3", npm_tokenizer("llama3"))
    if case.parallel_calls:
        with pytest.raises(ValueError, match="one tool call"):
            recipe.render(to_resin(case.messages), tools=case.tools)
        return
    _check(recipe, hf, case, _template("llama3"))


@pytest.mark.parametrize("thinking", THINKING)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_deepseek_v3_matches_official_template(case: Case, thinking: bool | None) -> None:
    tokenizer, hf = extended_qwen3("deepseek_v3")
    recipe = get_native_recipe("deepseek_v3", tokenizer)
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    # DeepSeek's template concatenates the arguments: they must be JSON text.
    case = Case(
        case.name, with_string_arguments(case.messages), case.tools, case.add_generation_prompt
    )
    _check(recipe, hf, case, _template("deepseek_v3"), **kwargs)


@pytest.mark.parametrize("thinking", THINKING)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_glm45_matches_official_template(case: Case, thinking: bool | None) -> None:
    tokenizer, hf = extended_qwen3("glm4_moe")
    recipe = get_native_recipe("glm4_moe", tokenizer)
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    _check(recipe, hf, case, _template("glm4_moe"), **kwargs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lfm2_matches_official_template(case: Case) -> None:
    tokenizer, hf = extended_qwen3("lfm2")
    recipe = get_native_recipe("lfm2", tokenizer)
    # LFM2's template expects the calls inside the content, written the way the model writes them.
    messages = copy.deepcopy(case.messages)
    for m in messages:
        calls = m.pop("tool_calls", [])
        if calls:
            text = ", ".join(
                f"{c['function']['name']}("
                + ", ".join(f'{k}="{v}"' for k, v in c["function"]["arguments"].items())
                + ")"
                for c in calls
            )
            m["content"] = f"<|tool_call_start|>[{text}]<|tool_call_end|>{m['content']}"
    hf_case = Case(case.name, messages, case.tools, case.add_generation_prompt)
    expected = _hf_ids(hf, hf_case, _template("lfm2"))
    prompt = recipe.render(
        to_resin(case.messages), tools=case.tools, add_generation_prompt=case.add_generation_prompt
    )
    assert prompt.text == hf.decode(expected)
    assert prompt.token_ids == expected


def _harmony_messages(case: Case) -> list[dict[str, Any]]:
    """The corpus in the form gpt-oss's template takes: reasoning under "thinking", and one
    tool call per assistant message (the template renders only the first of a turn)."""
    out: list[dict[str, Any]] = []
    for m in copy.deepcopy(case.messages):
        if "reasoning_content" in m:
            m["thinking"] = m.pop("reasoning_content")
        calls = m.get("tool_calls", [])
        if len(calls) > 1:
            out.append({**m, "tool_calls": calls[:1]})
            out.extend({"role": "assistant", "content": "", "tool_calls": [c]} for c in calls[1:])
            continue
        out.append(m)
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gpt_oss_matches_official_template(case: Case) -> None:
    hf = hf_tokenizer("gptoss")
    recipe = get_native_recipe("gpt_oss", npm_tokenizer("gptoss"))
    hf_case = Case(case.name, _harmony_messages(case), case.tools, case.add_generation_prompt)
    expected = _hf_ids(hf, hf_case, _template("gpt_oss"))
    prompt = recipe.render(
        to_resin(case.messages), tools=case.tools, add_generation_prompt=case.add_generation_prompt
    )
    assert prompt.text == hf.decode(expected)
    assert prompt.token_ids == expected
