"""gpt-oss tool definitions: JSON Schema -> the TypeScript-like namespace harmony expects.

Follows the official gpt-oss chat template's `render_typescript_type`/`render_tool_namespace`
macros, quirks included (a nested object's property type follows a newline and 16 spaces),
because the model was trained on exactly that text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from resin.recipe.types import ToolDef


def _nullable(spec: Mapping[str, Any]) -> str:
    return " | null" if spec.get("nullable") else ""


def typescript_type(spec: Mapping[str, Any]) -> str:
    """The TypeScript type of one JSON Schema node."""
    kind = spec.get("type")
    if kind == "array":
        items = spec.get("items")
        if not items:
            return "any[]" + _nullable(spec)
        simple = {"string": "string[]", "number": "number[]", "integer": "number[]"}
        simple["boolean"] = "boolean[]"
        if items.get("type") in simple:
            return simple[items["type"]] + _nullable(spec)
        inner = typescript_type(items)
        base = "any[]" if inner == "object | object" or len(inner) > 50 else inner + "[]"
        return base + _nullable(spec)
    if isinstance(kind, list) and kind:
        return " | ".join(str(k) for k in kind) if len(kind) > 1 else str(kind[0])
    if spec.get("oneOf"):
        variants = spec["oneOf"]
        if len(variants) > 1 and any(v.get("type") == "object" for v in variants):
            return "any"
        return " | ".join(typescript_type(v) for v in variants)
    if kind == "string":
        if spec.get("enum"):
            return '"' + '" | "'.join(str(e) for e in spec["enum"]) + '"'
        return "string" + _nullable(spec)
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "object":
        properties = spec.get("properties")
        if not properties:
            return "object"
        required = spec.get("required") or []
        fields = []
        for name, prop in properties.items():
            optional = "" if name in required else "?"
            fields.append(f"{name}{optional}: \n{' ' * 16}{typescript_type(prop)}")
        return "{\n" + ", ".join(fields) + "}"
    return "any"


def _default_suffix(spec: Mapping[str, Any]) -> str:
    if "default" not in spec:
        return ""
    if spec.get("enum"):
        return ", // default: " + str(spec["default"])
    if spec.get("oneOf"):
        return "// default: " + str(spec["default"])
    return ", // default: " + json.dumps(spec["default"], ensure_ascii=False)


def tool_namespace(tools: Sequence[ToolDef], namespace: str = "functions") -> str:
    """`## functions\\n\\nnamespace functions { ... } // namespace functions`."""
    out = [f"## {namespace}\n\nnamespace {namespace} {{\n\n"]
    for tool in tools:
        out.append(f"// {tool.description or ''}\ntype {tool.name} = ")
        parameters = tool.parameters or {}
        properties = parameters.get("properties")
        if not properties:
            out.append("() => any;\n\n")
            continue
        required = parameters.get("required") or []
        out.append("(_: {\n")
        for name, spec in properties.items():
            if spec.get("description"):
                out.append(f"// {spec['description']}\n")
            optional = "" if name in required else "?"
            out.append(f"{name}{optional}: {typescript_type(spec)}{_default_suffix(spec)},\n")
        out.append("}) => any;\n\n")
    out.append(f"}} // namespace {namespace}")
    return "".join(out)
