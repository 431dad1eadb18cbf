"""The Jinja recipe matches apply_chat_template (SmolLM2, Gemma 3, Qwen3) and keeps to its
sandbox; load_recipe picks a native recipe only when it renders the template's way."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from resin.recipe import JinjaRecipe, Message, get_native_recipe, load_recipe
from resin.recipe.generic_tools import tool_prompt
from resin.recipe.sandbox import TemplateRefusedError
from resin.tokenizer import Tokenizer, TokenizerInfo
from tests.recipe.assets import hf_tokenizer, npm_tokenizer, smollm2_hf, smollm2_tokenizer
from tests.recipe.corpus import CASES, Case, hf_tools, to_resin


def _expect(hf: Any, case: Case, **kwargs: Any) -> list[int] | type[Exception]:
    try:
        text = hf.apply_chat_template(
            case.messages,
            tools=hf_tools(case.tools),
            add_generation_prompt=case.add_generation_prompt,
            tokenize=False,
            **kwargs,
        )
    except Exception as exc:  # the template itself refuses this conversation
        return type(exc)
    return list(hf.encode(text, add_special_tokens=False))


def _hf_case(recipe: JinjaRecipe, case: Case) -> Case:
    """What transformers must render to match the recipe: a template without a tool section
    gets the tools as the generic system block (`resin.recipe.generic_tools`), earlier calls as
    `<tool_call>` text and results as user turns of `<tool_response>` blocks."""
    if not recipe.generic_tools:
        return case
    messages: list[dict[str, Any]] = []
    for m in case.messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if messages and messages[-1]["content"].endswith("</tool_response>"):
                messages[-1]["content"] += "\n" + block
            else:
                messages.append({"role": "user", "content": block})
        elif m.get("tool_calls"):
            calls = [c["function"] for c in m["tool_calls"]]
            bodies = [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
            text = "\n".join(
                f"<tool_call>\n{json.dumps(b, ensure_ascii=False)}\n</tool_call>" for b in bodies
            )
            messages.append(
                {
                    "role": "assistant",
                    "content": (m["content"] + "\n" if m["content"] else "") + text,
                }
            )
        else:
            messages.append(dict(m))
    if not case.tools:
        return dataclasses.replace(case, messages=messages)
    block = tool_prompt(case.tools)
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = messages[0]["content"] + "\n\n" + block
    else:
        messages.insert(0, {"role": "system", "content": block})
    return dataclasses.replace(case, messages=messages, tools=None)


def _compare(recipe: JinjaRecipe, hf: Any, case: Case, **kwargs: Any) -> None:
    messages = to_resin(case.messages)
    if case.tools and not recipe.supports_tools:
        with pytest.raises(ValueError, match="cannot render tools"):
            recipe.render(messages, tools=case.tools)
        return
    expected = _expect(hf, _hf_case(recipe, case), **kwargs)
    render_kwargs = dict(tools=case.tools, add_generation_prompt=case.add_generation_prompt)
    if isinstance(expected, type):
        with pytest.raises(ValueError):
            recipe.render(messages, **render_kwargs, **kwargs)
        return
    prompt = recipe.render(messages, **render_kwargs, **kwargs)
    assert prompt.text == hf.decode(expected)
    assert prompt.token_ids == expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_smollm2_template(case: Case) -> None:
    recipe = JinjaRecipe(smollm2_tokenizer())
    assert recipe.family.name == "chatml"
    _compare(recipe, smollm2_hf(), case)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gemma3_template(case: Case) -> None:
    recipe = JinjaRecipe(npm_tokenizer("gemma3"))
    assert recipe.family.name == "gemma"
    _compare(recipe, hf_tokenizer("gemma3"), case)


@pytest.mark.parametrize("thinking", [None, False])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_qwen3_template(case: Case, thinking: bool | None) -> None:
    recipe = JinjaRecipe(npm_tokenizer("qwen3"))
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    _compare(recipe, hf_tokenizer("qwen3"), case, **kwargs)


def test_gemma3_refuses_non_alternating_roles_with_value_error() -> None:
    recipe = JinjaRecipe(npm_tokenizer("gemma3"))
    with pytest.raises(ValueError, match="alternate"):
        recipe.render([Message("user", "a"), Message("user", "b")])


ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ messages.__class__.__base__ }}",
    "{% set ns = namespace() %}{% set ns.__dict__ = 1 %}",
    "{{ raise_exception.__globals__ }}",
    "{{ (messages|first).items.__self__.__class__ }}",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_sandbox_refuses_escapes(template: str) -> None:
    recipe = JinjaRecipe(npm_tokenizer("qwen3"), template=template)
    with pytest.raises(ValueError, match=r"sandbox|not allowed|unsafe"):
        recipe.render([Message("user", "hi")])
    with pytest.raises(TemplateRefusedError):
        recipe.render([Message("user", "hi")])


def test_sandbox_is_immutable_and_helpers_match_transformers() -> None:
    recipe = JinjaRecipe(npm_tokenizer("qwen3"), template="{% set x = messages.append(1) %}")
    with pytest.raises(ValueError):
        recipe.render([Message("user", "hi")])
    template = (
        "{{ messages[0] | tojson }}|{{ {'é': [1, 2]} | tojson(indent=2) }}|"
        "{{ strftime_now('%Y') | length }}{% if add_generation_prompt %}!{% endif %}"
    )
    tok = npm_tokenizer("qwen3")
    ours = JinjaRecipe(tok, template=template).render([Message("user", "héllo")]).text
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    theirs = hf.apply_chat_template(
        [{"role": "user", "content": "héllo"}],
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert ours == theirs


def test_bad_templates_are_value_errors() -> None:
    with pytest.raises(ValueError, match="compile"):
        JinjaRecipe(npm_tokenizer("qwen3"), template="{% if %}")
    info = TokenizerInfo()
    with pytest.raises(ValueError, match="no chat template"):
        JinjaRecipe(Tokenizer(npm_tokenizer("qwen3").backend, info))


def test_load_recipe_picks_native_when_the_template_matches() -> None:
    qwen = load_recipe(npm_tokenizer("qwen3"))
    assert qwen.name == "qwen3"
    # The npm Llama 3 template is Llama 3.0's (no tools, no date): not the native 3.1 format.
    llama = load_recipe(npm_tokenizer("llama3"))
    assert isinstance(llama, JinjaRecipe) and llama.family.name == "llama3"
    gemma = load_recipe(npm_tokenizer("gemma3"))
    assert isinstance(gemma, JinjaRecipe)
    assert load_recipe(npm_tokenizer("qwen3"), "jinja").name == "jinja:qwen3"
    assert load_recipe(npm_tokenizer("qwen3"), "chatml").name == "chatml"
    with pytest.raises(ValueError, match="unknown recipe"):
        load_recipe(npm_tokenizer("qwen3"), "nope")
    bare = Tokenizer(npm_tokenizer("qwen3").backend, TokenizerInfo())
    assert load_recipe(bare).name == "chatml"


def test_jinja_parser_uses_family_conventions() -> None:
    recipe = JinjaRecipe(npm_tokenizer("qwen3"))
    prompt = recipe.render([Message("user", "hi")])
    parser = recipe.create_parser(prompt)
    tok = recipe.tokenizer
    ids = tok.encode('<think>\nhm\n</think>\n\nYes.<tool_call>\n{"name": "f", "arguments": {}}\n')
    parser.feed([*ids, *tok.encode("</tool_call>"), recipe.stop_token_ids[0]])
    result = parser.finish()
    assert (result.reasoning, result.text) == ("hm", "Yes.")
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("f", "{}")]
    gemma = JinjaRecipe(npm_tokenizer("gemma3"))
    end_of_turn = gemma.tokenizer.token_to_id("<end_of_turn>")
    assert end_of_turn in gemma.stop_token_ids
    parser = gemma.create_parser(gemma.render([Message("user", "hi")]))
    parser.feed([*gemma.tokenizer.encode("Hello 😀"), end_of_turn])
    assert parser.finish().text == "Hello 😀"


def test_native_and_jinja_gpt_oss_agree() -> None:
    tok = npm_tokenizer("gptoss")
    template = (
        __import__("pathlib").Path(__file__).parent / "templates" / "gpt_oss.jinja"
    ).read_text(encoding="utf-8")
    jinja = JinjaRecipe(tok, template=template)
    native = get_native_recipe("gpt_oss", tok)
    messages = [Message("system", "Be brief."), Message("user", "Hi")]
    assert jinja.render(messages).token_ids == native.render(messages).token_ids


def test_gguf_metadata_template_through_resin_conversion(tmp_path: Any) -> None:
    """The template stored in the SmolLM2 GGUF, via resin's own GGUF tokenizer conversion."""
    import json

    from resin_model.gguf import read_gguf
    from resin_model.gguf_tokenizer import build_tokenizer_files
    from tests.recipe.assets import smollm2_gguf

    tokenizer_json, config = build_tokenizer_files(read_gguf(smollm2_gguf()).metadata)
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer_json), encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tokenizer = Tokenizer.from_dir(tmp_path)
    recipe = load_recipe(tokenizer)
    # SmolLM2's template adds a default system prompt the native ChatML recipe would not.
    assert isinstance(recipe, JinjaRecipe)
    for case in CASES[:4]:
        _compare(recipe, smollm2_hf(), case)


def test_glm45_template_loads_its_native_recipe_and_family_parser() -> None:
    from tests.recipe.assets import TEMPLATES, extended_qwen3

    tokenizer, _ = extended_qwen3("glm4_moe")
    template = (TEMPLATES / "glm4_moe.jinja").read_text(encoding="utf-8")
    glm = Tokenizer(
        tokenizer.backend, TokenizerInfo(chat_template=template, eos_token="<|endoftext|>")
    )
    assert load_recipe(glm).name == "glm4_moe"
    jinja = load_recipe(glm, "jinja")
    assert jinja.name == "jinja:glm4_moe"
    prompt = jinja.render([Message("user", "hi")])
    call = (
        "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>[1, 2]</arg_value>\n</tool_call>"
    )
    parser = jinja.create_parser(prompt)
    parser.feed(glm.encode("\n<think>ok</think>\n" + call))
    result = parser.finish("stop")
    assert result.reasoning == "ok"
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("search", '{"query": [1, 2]}')]
