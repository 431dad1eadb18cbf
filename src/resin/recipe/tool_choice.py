"""Forcing a tool call (`tool_choice` "required" / a named tool) without a grammar engine.

As vLLM and SGLang do for marker-based formats, the recipe appends the start of the assistant
turn to the prompt (the *forced prefix*): the tool-call opening marker for "required", the
marker plus `{"name": "X", "arguments": ` (or the format's equivalent) for a named tool. The
model can then only continue inside a tool call, and the parser is primed with the same prefix
so it starts in the state it would be in had the model written the prefix itself.

Invariant: `RenderedPrompt.text` ends with `RenderedPrompt.forced_prefix`; a parser built from
that prompt has consumed the prefix (it yields no delta for it). A format that cannot force a
choice raises `UnsupportedToolChoice` (a `ValueError`), never a silent `auto`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from resin.recipe.tagged import TagSpec
from resin.recipe.toolcall_formats import (
    DEEPSEEK_SEP,
    parse_deepseek_call,
    parse_json_calls,
    parse_pythonic_calls,
)
from resin.recipe.types import ToolDef


@dataclass(frozen=True)
class ToolChoice:
    """A forced tool choice: `name` None means "some tool" (OpenAI "required", Anthropic
    "any"); a name means exactly that tool (it must be one of the request's tools)."""

    name: str | None = None

    @property
    def label(self) -> str:
        return "required" if self.name is None else f"function {self.name!r}"


class UnsupportedToolChoice(ValueError):
    """The recipe's chat format cannot force this tool choice."""


def check_tool_choice(choice: ToolChoice, tools: Sequence[ToolDef] | None) -> None:
    """Raise `ValueError` when a forced choice has no tools or names an unknown tool."""
    names = [t.name for t in tools or ()]
    if not names:
        raise ValueError(f"tool_choice {choice.label} needs at least one tool")
    if choice.name is not None and choice.name not in names:
        raise ValueError(f"tool_choice names {choice.name!r}, which is not in tools")


def unsupported(choice: ToolChoice) -> UnsupportedToolChoice:
    what = "'required'" if choice.name is None else "naming a function"
    return UnsupportedToolChoice(f"tool_choice {what} is not supported by this model's chat format")


def forced_prefix(spec: TagSpec, choice: ToolChoice, *, list_markers: bool = True) -> str:
    """The text that opens a tool call in the format `spec` describes (see module docstring).

    JSON marker formats (`<tool_call>` ...): the marker (plus "\\n", as Hermes templates
    write it) and for a named tool `{"name": "X", "arguments": `. Llama 3's bare JSON:
    `{"name": "` / `{"name": "X", "parameters": `. LFM2's pythonic calls: the marker and
    `[X(`. DeepSeek: the call-list and call markers and `X<｜tool▁sep｜>` (without the
    call-list marker when `list_markers` is false)."""
    name = choice.name
    if spec.bare_json_tools:
        if name is None:
            return '{"name": "'
        return f'{{"name": {json.dumps(name, ensure_ascii=False)}, "parameters": '
    if not spec.tool_start or not spec.tool_end:
        raise unsupported(choice)
    start = "".join(spec.ignored[:1] if list_markers else ()) + spec.tool_start
    if spec.tool_body is parse_json_calls:
        head = start + "\n"
        if name is None:
            return head
        return f'{head}{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": '
    if spec.tool_body is parse_pythonic_calls:
        if name is None:
            return start
        if not name.replace(".", "_").isidentifier():
            raise unsupported(choice)
        return f"{start}[{name}("
    if spec.tool_body is parse_deepseek_call:
        return start if name is None else f"{start}{name}{DEEPSEEK_SEP}"
    raise unsupported(choice)


@dataclass(frozen=True)
class ForcedStructure:
    """One allowed continuation of a forced prefix: literal `begin`, then the arguments, then
    literal `end`. The arguments follow `schema` (the tool's parameters) as a JSON value, or
    with `syntax` "pythonic" as Python keyword arguments (`city="Paris", days=[1]`; each
    value in JSON syntax). A grammar engine turns the alternatives into a constraint, so the
    call names an offered tool and its arguments validate (`docs/constraints.md`)."""

    begin: str
    schema: dict[str, Any]
    end: str
    syntax: Literal["json", "pythonic"] = "json"


def forced_structures(
    spec: TagSpec, choice: ToolChoice, tools: Sequence[ToolDef], *, list_markers: bool = True
) -> tuple[ForcedStructure, ...]:
    """What may follow `forced_prefix(spec, choice, list_markers=...)`, one alternative per
    eligible tool: the name (for "required") and the arguments, then the format's closing
    markers (DeepSeek's call-list end only with `list_markers`). JSON marker formats, Llama 3's
    bare JSON and DeepSeek's `name<｜tool▁sep｜>{json}` take JSON arguments; LFM2's pythonic
    calls take keyword arguments (tools whose name is not a Python name cannot be called that
    way and are left out)."""
    eligible = [t for t in tools if choice.name is None or t.name == choice.name]
    named = choice.name is not None
    if spec.tool_body is parse_pythonic_calls and spec.tool_end:
        return tuple(
            ForcedStructure(
                "" if named else f"[{t.name}(", _params(t), ")]" + spec.tool_end, "pythonic"
            )
            for t in eligible
            if t.name.replace(".", "_").isidentifier()
        )
    if spec.tool_body is parse_deepseek_call and spec.tool_end:
        end = spec.tool_end + "".join(spec.ignored[1:2] if list_markers else ())
        return tuple(
            ForcedStructure("" if named else f"{t.name}{DEEPSEEK_SEP}", _params(t), end)
            for t in eligible
        )
    if spec.bare_json_tools:
        key, end = "parameters", "}"
    elif spec.tool_body is parse_json_calls and spec.tool_end:
        key, end = "arguments", "}\n" + spec.tool_end
    else:
        return ()
    out = []
    for t in eligible:
        begin = ""
        if not named:
            name = json.dumps(t.name, ensure_ascii=False)
            begin = (
                f'{name[1:]}, "{key}": ' if spec.bare_json_tools else f'{{"name": {name}, "{key}": '
            )
        out.append(ForcedStructure(begin, _params(t), end))
    return tuple(out)


@dataclass(frozen=True)
class AutoCalls:
    """Tool calls inside free text (`tool_choice` auto), described for a grammar: a call
    starts where one of `triggers` appears in the answer (with `anchored`, only at its start,
    after whitespace: Llama 3's bare JSON answer) and is then one of `structures`, whose
    `begin` starts with that trigger. The server turns this into a lazily triggered
    constraint (`docs/constraints.md`): free text stays free, a call names an offered tool
    and its arguments follow that tool's schema."""

    triggers: tuple[str, ...]
    structures: tuple[ForcedStructure, ...]
    anchored: bool = False


def auto_calls(spec: TagSpec, tools: Sequence[ToolDef]) -> AutoCalls | None:
    """The calls `spec`'s parser reads, as forcing "required" describes them: each structure
    is the forced prefix (the trigger: the call's opening marker, or Llama 3's `{`) followed
    by one of the forced structures. DeepSeek's call-list markers stay outside (free special
    tokens), so a list may hold several calls. None when the format cannot be described."""
    choice = ToolChoice()
    try:
        prefix = forced_prefix(spec, choice, list_markers=False)
    except UnsupportedToolChoice:
        return None
    forced = forced_structures(spec, choice, tools, list_markers=False)
    trigger = "{" if spec.bare_json_tools else spec.tool_start
    if not forced or not trigger:
        return None
    structures = tuple(replace(s, begin=prefix + s.begin) for s in forced)
    return AutoCalls((trigger,), structures, anchored=spec.bare_json_tools)


def _params(tool: ToolDef) -> dict[str, Any]:
    return dict(tool.parameters) or {"type": "object"}
