"""Forced tool calls, and tool calls inside free text (tool_choice auto), are
grammar-constrained in every call format that can be forced.

The worst model there is, a sampler drawing uniformly among the tokens the grammar allows
(it ignores the forcing prefix as much as it can), runs on the real Engine with llguidance and
each family's real tokenizer; every answer must parse as exactly one call of an offered tool
(the named one when named) whose arguments validate, with no text, no error and no leaked
prefix. Covers the JSON marker formats, Llama 3's bare JSON, DeepSeek's
`name<｜tool▁sep｜>{json}` and LFM2's pythonic calls (keyword arguments). With auto, free text
passes and the same sampler, once the format's trigger is written, can only finish a valid call.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import numpy as np
import pytest

from resin import Engine, FinishReason, GrammarBackend, SamplingParams
from resin.recipe import JinjaRecipe, Message, ToolChoice, ToolDef, get_native_recipe
from resin.server.structured import auto_tool_structure, tool_structure
from tests.engine.test_constraints import UniformAllowedRunner, allowed, run
from tests.recipe.assets import TEMPLATES, extended_qwen3, npm_tokenizer, smollm2_tokenizer

WEATHER = ToolDef(
    "get_weather",
    "Weather for a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 6},
            "days": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                     "maxItems": 2},
            "unit": {"enum": ["c", "f"]},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
)  # fmt: skip
LOOKUP = ToolDef(  # nothing required: any subset of the arguments, in any count
    "lookup",
    "Look a word up",
    {
        "type": "object",
        "properties": {
            "word": {"enum": ["gleam", "glow"]},
            "exact": {"type": "boolean"},
            "limit": {"type": ["integer", "null"], "minimum": 1, "maximum": 5},
        },
        "additionalProperties": False,
    },
)
PING = ToolDef("ping", "No arguments", {"type": "object", "additionalProperties": False})
TOOLS = [WEATHER, LOOKUP, PING]
ASK = [Message("user", "Weather in Paris?")]


def _recipe(name: str) -> Any:
    if name == "smollm2":  # its template has no tools: the generic Hermes prompt
        return JinjaRecipe(smollm2_tokenizer())
    if name in ("deepseek_v3", "lfm2"):
        return get_native_recipe(name, extended_qwen3(name)[0])
    if name in ("jinja:deepseek_v3", "jinja:lfm2"):
        family = name.removeprefix("jinja:")
        template = (TEMPLATES / f"{family}.jinja").read_text(encoding="utf-8")
        return JinjaRecipe(extended_qwen3(family)[0], template)
    if name == "llama3":
        return get_native_recipe("llama3", npm_tokenizer("llama3"))
    return get_native_recipe(name, npm_tokenizer("qwen3"))


NAMES = ["deepseek_v3", "lfm2", "jinja:lfm2", "qwen3", "llama3"]


@pytest.mark.parametrize("name", NAMES)
def test_a_forced_call_is_always_a_valid_call(name: str) -> None:
    recipe = _recipe(name)
    backend = GrammarBackend.from_tokenizer(recipe.tokenizer)
    schemas = {t.name: t.parameters or {"type": "object"} for t in TOOLS}
    choices = [ToolChoice(), ToolChoice("get_weather"), ToolChoice("lookup"), ToolChoice("ping")]
    jobs = []
    runner = UniformAllowedRunner(backend.vocab_size, num_pages=4096, seed=7)
    with Engine(runner, grammar=backend) as engine:
        for choice in choices:
            prompt = recipe.render(ASK, tools=TOOLS, tool_choice=choice)
            constraint = tool_structure(prompt).constraint
            assert constraint is not None, "a forced call must be constrained"
            params = SamplingParams(
                max_output_tokens=200,
                stop_token_ids=recipe.stop_token_ids,
                constraint=constraint,
            )
            for _ in range(6 if choice.name is None else 3):
                jobs.append((choice, prompt, engine.submit(prompt.token_ids, params)))
        run(engine)
    for choice, prompt, request in jobs:
        output = request.output_token_ids
        raw = recipe.tokenizer.decode(output, skip_special_tokens=False)
        assert request.finish_reason is FinishReason.STOP, (raw, request.error)
        parser = recipe.create_parser(prompt, tools=TOOLS)
        deltas = parser.feed(output)
        result = parser.finish()
        assert result.error is None and result.text == "", raw
        assert len(result.tool_calls) == 1, raw
        call = result.tool_calls[0]
        assert call.name in schemas and choice.name in (None, call.name), raw
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
        assert not any(getattr(d, "text", "") for d in [*deltas, *result.deltas])


def test_pythonic_arguments_may_be_written_in_json_syntax() -> None:
    recipe = _recipe("lfm2")
    prompt = recipe.render(ASK, tools=TOOLS, tool_choice=ToolChoice("lookup"))
    assert prompt.text.endswith("<|tool_call_start|>[lookup(")
    parser = recipe.create_parser(prompt, tools=TOOLS)
    parser.feed_text('exact=true, limit=null, word="gl\\u00e9am")]<|tool_call_end|>')
    result = parser.finish()
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("lookup", {"exact": True, "limit": None, "word": "gléam"})
    ]


AUTO = ["smollm2", "qwen3", "llama3", "deepseek_v3", "lfm2", "jinja:lfm2"]
LEAD = 'Let me look: {"a": [1]} <b>ok</b>\n'


@pytest.mark.parametrize("name", AUTO)
def test_auto_calls_are_free_text_then_a_valid_call(name: str) -> None:
    recipe = _recipe(name)
    tok = recipe.tokenizer
    backend = GrammarBackend.from_tokenizer(tok)
    prompt = recipe.render(ASK, tools=TOOLS)
    auto = prompt.auto_calls
    constraint = auto_tool_structure(prompt).constraint
    assert auto is not None and constraint is not None
    lead = "" if auto.anchored else LEAD  # Llama 3: a call only opens the answer
    (trigger,) = auto.triggers
    wanted = auto.structures[0].begin
    assert backend.state(constraint).sync(tok.encode(lead + wanted))
    assert not backend.state(constraint).sync(
        tok.encode(lead + wanted.replace("get_weather", "Paris"))
    )
    schemas = {t.name: t.parameters for t in TOOLS}
    rng = np.random.default_rng(11)
    mask = np.zeros(backend.mask_words, dtype=np.int32)
    for _ in range(6):
        state = backend.state(constraint)
        out = tok.encode(lead + trigger)
        assert state.sync(out)
        while len(out) < 300 and not state.stopped:  # the uniform sampler writes the call
            state.fill_mask(mask)
            out.append(int(rng.choice(allowed(mask, backend.vocab_size))))
            assert state.sync(out)
            tail = tok.decode(out, skip_special_tokens=False)[len(lead) :]
            if any(s.end in tail for s in auto.structures if len(s.end) > 1):
                break  # (the last token may run past the end: free text again)
        parser = recipe.create_parser(prompt, tools=TOOLS)
        parser.feed(out)
        result = parser.finish()
        raw = tok.decode(out, skip_special_tokens=False)
        assert result.error is None and result.text.startswith(lead), raw
        (call,) = result.tool_calls
        jsonschema.validate(json.loads(call.arguments), schemas[call.name])
    if auto.anchored:  # free text that does not open with the trigger, and no special token
        assert backend.state(constraint).sync(tok.encode("Sure: {x}"))
        assert not backend.state(constraint).sync(tok.encode(" {x}"))
    elif name == "qwen3":  # reasoning markers (special tokens) stay free
        assert backend.state(constraint).sync(tok.encode("<think>\nhm\n</think>\n\nHi"))
