"""Structural tags (tool calls) -> Lark text for llguidance.

A structural tag is JSON (`Constraint("structural_tag", spec)`, `docs/constraints.md`):
`{"structures": [{"begin", "schema", "end", "syntax"}], "triggers": [...], "at_start": bool,
"anchored": bool}`. Each structure is literal `begin`, a body (`schema` as compact JSON, or
with `syntax` "pythonic" the schema's properties as Python keyword arguments), literal `end`.
- `at_start`: the output is exactly one structure (a forced call after the forcing prefix);
- otherwise free text in which a structure starts wherever one of `triggers` appears (each
  `begin` starts with one), any number of times (`tool_choice` auto). A text trigger is a
  lazy lexeme: the free text ends at its first occurrence. A trigger that is a special token
  ends the free text by itself (the text lexeme cannot produce it). The free text may hold
  the tokenizer's other special tokens (reasoning markers such as Qwen3's `<think>`);
- `anchored` (with `at_start` false): a structure only at the start of the output, after
  whitespace (Llama 3's bare JSON answer): the output is one structure, or free text that does
  not start with a trigger (and holds no special token).
Text of a special token in `begin` / `end` is that token (`<[id]>`): a string literal could
only be spelled out in ordinary tokens, which llguidance refuses. `lenient` ignores JSON-schema
keywords the engine cannot enforce instead of refusing the schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

JSON_DEFAULTS: Any = {"whitespace_flexible": False}
"""JSON is generated compact (`{"a":1,"b":[2]}`) unless the schema's `x-guidance` says
otherwise: free whitespace lets a small model pad until `max_tokens`."""

_TEXT = "TEXT: /(.|\\n)*/"


def structural_tag_grammar(
    spec: dict[str, Any],
    special_tokens: Mapping[str, int] | None = None,
    eos_token_ids: Collection[int] = (),
    lenient: bool = False,
) -> str:
    """Lark text for the structural tag `spec` (see module docstring); `special_tokens` maps
    the tokenizer's special tokens' text to their ids, `eos_token_ids` are left out of free
    text (they end the output)."""
    specials = special_tokens or {}
    options = {**JSON_DEFAULTS, "lenient": True} if lenient else JSON_DEFAULTS
    bodies = _bodies(spec, options)
    if spec.get("at_start"):
        one_of, rules = _structures(bodies, specials)
        return _grammar("start: " + one_of, rules)
    triggers = [t for t in spec.get("triggers", []) if isinstance(t, str) and t]
    starts = []
    for i, (begin, _, _) in enumerate(bodies):
        trigger = next((t for t in triggers if begin.startswith(t)), None)
        if trigger is None:
            raise ValueError(f"structural_tag structures[{i}].begin starts with no trigger")
        starts.append(trigger)
    if spec.get("anchored"):
        return _anchored(bodies, starts, specials)
    rules = [_TEXT]
    for i, ((begin, body, end), trigger) in enumerate(zip(bodies, starts, strict=True)):
        rest = f"{_lit(begin[len(trigger) :], specials)} {body} {_lit(end, specials)}"
        if trigger in specials:
            rules.append(f"t{i}: TEXT <[{specials[trigger]}]> {rest}")
        elif any(s in trigger for s in specials):
            raise ValueError(
                f"structural_tag trigger {trigger!r} must be text or one special token"
            )
        else:
            rules.append(f"t{i}_trig[lazy]: TEXT {_lit(trigger)}")
            rules.append(f"t{i}: t{i}_trig {rest}")
    alternatives = [f"t{i}" for i in range(len(bodies))]
    others = set(specials.values()) - {specials[t] for t in starts if t in specials}
    others -= set(eos_token_ids)
    if others:
        rules.append(f"sp: TEXT <[{_ranges(others)}]>")
        alternatives.append("sp")
    return _grammar(f"start: ({' | '.join(alternatives)})* TEXT", rules)


def _bodies(spec: dict[str, Any], options: Any) -> list[tuple[str, str, str]]:
    """(begin, Lark of the body, end) of each structure."""
    structures = spec.get("structures")
    if not isinstance(structures, list) or not structures:
        raise ValueError("structural_tag needs a non-empty list of structures")
    out = []
    for i, item in enumerate(structures):
        if not isinstance(item, dict) or not isinstance(item.get("begin"), str):
            raise ValueError(f"structural_tag structures[{i}] needs a string 'begin'")
        schema = item.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise ValueError(f"structural_tag structures[{i}].schema must be an object")
        if item.get("syntax", "json") == "pythonic":
            body = _kwargs(schema, options)
        else:
            body = "%json " + json.dumps({"x-guidance": options, **schema})  # compact
        out.append((item["begin"], body, str(item.get("end", ""))))
    return out


def _anchored(
    bodies: list[tuple[str, str, str]], starts: list[str], specials: Mapping[str, int]
) -> str:
    """One structure after optional whitespace, or free text that does not start with a
    trigger (llguidance's `&` / `~` on terminals)."""
    triggers = " | ".join(_lit(t) for t in dict.fromkeys(starts))
    one_of, rules = _structures(bodies, specials)
    rules = ["WS: /\\s+/", f"FREE: /(?s:.*)/ & ~(/\\s*/ ({triggers}) /(?s:.*)/)", *rules]
    return _grammar(f"start: WS? ({one_of}) | FREE", rules)


def _structures(
    bodies: list[tuple[str, str, str]], specials: Mapping[str, int]
) -> tuple[str, list[str]]:
    """("s0 | s1 | ...", the rule of each structure): one structure, begin to end."""
    rules = [
        f"s{i}: {_lit(b, specials)} {s} {_lit(e, specials)}" for i, (b, s, e) in enumerate(bodies)
    ]
    return " | ".join(f"s{i}" for i in range(len(bodies))), rules


def _grammar(start: str, rules: list[str]) -> str:
    return "\n".join(["%llguidance {}", start, *rules]) + "\n"


def _kwargs(schema: dict[str, Any], options: Any) -> str:
    """Lark for Python keyword arguments whose values (in JSON syntax) follow the properties
    of an object `schema`: the required ones first, then any of the optional ones, in the
    schema's order, each at most once, separated by ", ". No properties: no arguments."""
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return ""
    bad = [name for name in props if not str(name).isidentifier()]
    if bad:
        raise ValueError(f"property {bad[0]!r} cannot be a Python keyword argument")
    needed = set(schema.get("required") or ())

    def kv(name: str) -> str:
        value = {"x-guidance": options, **props[name]}
        return f"{_lit(name + '=')} %json {json.dumps(value)}"

    required = [kv(n) for n in props if n in needed]
    optional = [kv(n) for n in props if n not in needed]

    def then(items: list[str]) -> str:
        return "".join(f' ("," " " {item})?' for item in items)

    if required:
        return ' "," " " '.join(required) + then(optional)
    starts = [item + then(optional[j + 1 :]) for j, item in enumerate(optional)]
    return "(" + " | ".join(starts) + ")?"


def _lit(text: str, special_tokens: Mapping[str, int] | None = None) -> str:
    """Lark for the literal `text`; the special tokens in it by id."""
    found = [s for s in special_tokens or () if s in text]
    if not found:
        return json.dumps(text) if text else ""
    assert special_tokens is not None
    parts: list[str] = []
    pos = 0
    for m in re.finditer(
        "|".join(re.escape(s) for s in sorted(found, key=len, reverse=True)), text
    ):
        if m.start() > pos:
            parts.append(json.dumps(text[pos : m.start()]))
        parts.append(f"<[{special_tokens[m.group()]}]>")
        pos = m.end()
    if pos < len(text):
        parts.append(json.dumps(text[pos:]))
    return " ".join(parts)


def _ranges(ids: Collection[int]) -> str:
    """`<[...]>` body for a set of token ids: runs of consecutive ids as `a-b`."""
    runs: list[list[int]] = []
    for token in sorted(ids):
        if runs and runs[-1][1] == token - 1:
            runs[-1][1] = token
        else:
            runs.append([token, token])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
