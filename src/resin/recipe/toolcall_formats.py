"""Tool-call body formats: the text between a family's tool-call markers -> (name, arguments).

Each parser takes the complete body and returns a list of `(name, arguments_json)` pairs, or
raises `ValueError` when the body is malformed (the caller reports it as text plus an error).
Arguments given as a JSON object are re-serialized with `json.dumps(ensure_ascii=False)`, the
same form HF chat templates print with `tojson`, so a rendered history round-trips.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

ParsedCall: TypeAlias = tuple[str, str]
BodyParser: TypeAlias = Callable[[str], list[ParsedCall]]


def _arguments_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _call_from_object(obj: Any) -> ParsedCall:
    if not isinstance(obj, dict):
        raise ValueError("a tool call must be a JSON object")
    if "function" in obj and isinstance(obj["function"], dict):  # OpenAI-shaped
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a tool call needs a string 'name'")
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        json.loads(arguments)  # a string must itself be JSON
    return name, _arguments_text(arguments)


def parse_json_calls(body: str) -> list[ParsedCall]:
    """`{"name": ..., "arguments": {...}}` (or "parameters"), or a JSON list of those."""
    value = json.loads(body.strip())
    objects = value if isinstance(value, list) else [value]
    if not objects:
        raise ValueError("empty tool-call list")
    return [_call_from_object(obj) for obj in objects]


def parse_llama3_calls(body: str) -> list[ParsedCall]:
    """Llama 3.x: one JSON call, or several separated by ';', after an optional <|python_tag|>."""
    text = body.strip()
    if text.startswith("<|python_tag|>"):
        text = text[len("<|python_tag|>") :].strip()
    try:
        return parse_json_calls(text)
    except ValueError:
        parts = [p for p in text.split(";") if p.strip()]
        if len(parts) < 2:
            raise
        return [call for part in parts for call in parse_json_calls(part)]


def parse_pythonic_calls(body: str) -> list[ParsedCall]:
    """`[get_weather(city="Paris"), f(x=1)]` (LFM2's default); JSON bodies are accepted too,
    and so are argument values in JSON syntax (`ok=true`, `x=null`)."""
    text = body.strip()
    try:
        return parse_json_calls(text)
    except ValueError:
        pass
    try:
        with warnings.catch_warnings():  # "\\/" and friends: invalid Python escapes
            warnings.simplefilter("ignore")
            tree = ast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a pythonic call list: {exc.msg}") from None
    calls = tree.elts if isinstance(tree, ast.List) else [tree]
    parsed: list[ParsedCall] = []
    for call in calls:
        if not isinstance(call, ast.Call) or call.args:
            raise ValueError("pythonic tool calls take keyword arguments only")
        name = _dotted_name(call.func)
        arguments: dict[str, Any] = {}
        for keyword in call.keywords:
            if keyword.arg is None:
                raise ValueError("**kwargs are not allowed in a tool call")
            arguments[keyword.arg] = _literal(keyword.value, text, keyword.arg)
        parsed.append((name, json.dumps(arguments, ensure_ascii=False)))
    return parsed


def _literal(node: ast.expr, source: str, name: str) -> Any:
    """A keyword's value: JSON text first (`true`, `null`, `"\\/"` mean what JSON says; a
    constrained call writes its values in JSON syntax), else a Python literal."""
    segment = ast.get_source_segment(source, node)
    try:
        return json.loads(segment or "")
    except ValueError:
        pass
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ValueError(f"argument {name!r} is not a literal") from None


def _dotted_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    raise ValueError("a tool call must name a function")


DEEPSEEK_SEP = "<｜tool▁sep｜>"


def parse_deepseek_call(body: str) -> list[ParsedCall]:
    """DeepSeek V3.1: `name<｜tool▁sep｜>{json}`.

    DeepSeek V3/R1: `function<｜tool▁sep｜>name` + newline + a ```json fenced block."""
    head, sep, rest = body.partition(DEEPSEEK_SEP)
    if not sep:
        raise ValueError("DeepSeek tool call without <｜tool▁sep｜>")
    if head == "function" and "\n" in rest:
        name, _, fenced = rest.partition("\n")
        arguments = fenced.strip().removeprefix("```json").removesuffix("```").strip()
    else:
        name, arguments = head, rest
    name = name.strip()
    if not name:
        raise ValueError("DeepSeek tool call without a name")
    value = json.loads(arguments)
    return [(name, _arguments_text(value))]


_GLM_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)


def parse_glm_call(
    body: str, string_keys: Mapping[str, frozenset[str]] | None = None
) -> list[ParsedCall]:
    """GLM-4.5: `name` then `<arg_key>k</arg_key><arg_value>v</arg_value>` pairs (newlines
    between them optional). The template prints string values raw and other values as JSON,
    so a value is JSON when it parses as JSON, else text; `string_keys` (per tool, the
    parameters its schema types as strings) keeps those as text whatever they look like."""
    name, marker, rest = body.partition("<arg_key>")
    name = name.strip()
    if not name or any(c in name for c in "<>\n"):
        raise ValueError("GLM tool call without a function name")
    text_keys = (string_keys or {}).get(name, frozenset())
    arguments: dict[str, Any] = {}
    position, rest = 0, marker + rest
    for match in _GLM_ARGUMENT.finditer(rest):
        if rest[position : match.start()].strip():
            raise ValueError("text between GLM tool-call arguments")
        key, value = match.group(1).strip(), match.group(2)
        arguments[key] = value if key in text_keys else _json_or_text(value)
        position = match.end()
    if rest[position:].strip():
        raise ValueError("malformed GLM tool-call arguments")
    return [(name, json.dumps(arguments, ensure_ascii=False))]


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value
