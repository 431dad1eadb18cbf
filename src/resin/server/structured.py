"""Structured outputs and logit bias: request fields of every API -> the engine's `Constraint`.

- OpenAI chat / completions: `response_format` (`json_object`, `json_schema`), `logit_bias`,
  and vLLM's extras: `structured_outputs` (`json`, `regex`, `choice`, `grammar`,
  `json_object`) and the older `guided_json` / `guided_regex` / `guided_choice` /
  `guided_grammar`; at most one of them per request.
- Responses: `text.format` (`json_object`, `json_schema`).
- Anthropic Messages: `output_format` (`{"type": "json_schema", "schema": ...}`).
- A forced `tool_choice` (required / named, every API): the recipe's forced structures (tool
  name + the tool's parameters schema after the forcing prefix) become a `structural_tag`.
- Tools with `tool_choice` auto (or left out): the recipe's `auto_calls` become a lazily
  triggered `structural_tag` (free text; each call names an offered tool and follows its
  schema), unless the request has one of the fields above.
A spec that is malformed, or that the grammar engine cannot enforce, is a 400 naming the field
(`strict: false` does not turn that into a silent pass). See `docs/constraints.md`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple

from resin.params import Constraint, SamplingParams
from resin.recipe import RenderedPrompt
from resin.recipe.tool_choice import ForcedStructure
from resin.server.errors import ApiError

VLLM_FIELDS = (
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


class Structured(NamedTuple):
    constraint: Constraint | None
    field: str | None


NONE = Structured(None, None)


def openai_fields(body: Any) -> Structured:
    """`response_format` or one of the vLLM extras of a chat / completions body."""
    extra = dict(getattr(body, "model_extra", None) or {})
    given = {k: v for k in ("response_format", *VLLM_FIELDS) if (v := _get(body, extra, k))}
    if isinstance(given.get("response_format"), dict) and given["response_format"].get(
        "type", "text"
    ) in ("text", None):
        given.pop("response_format")
    if len(given) > 1:
        names = ", ".join(sorted(given))
        raise ApiError(400, f"give at most one structured-output field, got {names}", names)
    if not given:
        return NONE
    ((name, value),) = given.items()
    if name == "response_format":
        return Structured(_response_format(value, name), name)
    if name == "structured_outputs":
        return Structured(_vllm_structured(value, name), name)
    kind = name.removeprefix("guided_")
    return Structured(_vllm_one(kind, value, name), name)


def responses_format(text: Any) -> Structured:
    """The Responses API's `text.format`."""
    if not isinstance(text, dict) or not isinstance(text.get("format"), dict):
        return NONE
    fmt = text["format"]
    kind = fmt.get("type", "text")
    if kind == "text":
        return NONE
    if kind == "json_object":
        return Structured(Constraint("json_object"), "text.format")
    if kind == "json_schema":
        return Structured(_schema(fmt.get("schema"), "text.format.schema"), "text.format")
    raise ApiError(400, f"text.format type {kind!r} is not supported", "text.format")


def anthropic_format(output_format: Any) -> Structured:
    """Anthropic's `output_format` (structured outputs): `{"type": "json_schema", "schema"}`."""
    if output_format is None:
        return NONE
    if not isinstance(output_format, dict) or output_format.get("type") != "json_schema":
        raise ApiError(400, "output_format must be {type: json_schema, schema}", "output_format")
    return Structured(_schema(output_format.get("schema"), "output_format.schema"), "output_format")


def tool_structure(rendered: RenderedPrompt) -> Structured:
    """A forced tool call's constraint: the call names an offered tool and its arguments
    follow that tool's parameters schema (empty when the recipe forced nothing it can
    describe as JSON)."""
    structures = getattr(rendered, "forced_structures", ())
    if not structures:
        return NONE
    return _tag(structures, {"at_start": True}, strict=True)


def auto_tool_structure(rendered: RenderedPrompt) -> Structured:
    """Tools with `tool_choice` auto: free text, and wherever the recipe's call trigger
    appears a call that names an offered tool with arguments that follow its schema (empty
    when the recipe cannot describe its calls). Schema keywords the engine cannot enforce
    are ignored here (the client asked for no constraint), not refused."""
    auto = getattr(rendered, "auto_calls", None)
    if auto is None or not auto.structures:
        return NONE
    mode = {"triggers": list(auto.triggers), "anchored": auto.anchored}
    return _tag(auto.structures, mode, strict=False)


def _tag(structures: Sequence[ForcedStructure], mode: dict[str, Any], strict: bool) -> Structured:
    spec = {
        **mode,
        "structures": [
            {"begin": s.begin, "schema": s.schema, "end": s.end, "syntax": s.syntax}
            for s in structures
        ],
    }
    return Structured(Constraint("structural_tag", json.dumps(spec), strict), "tools")


def apply(
    params: SamplingParams,
    structured: Structured,
    rendered: RenderedPrompt | None = None,
    logit_bias: Any = None,
    auto_tools: bool = True,
) -> tuple[SamplingParams, Structured]:
    """`params` with the constraint and the logit bias; 400 naming the field on a bad value.
    A forced tool call wins over a response format (the answer is the call); with tools and
    `tool_choice` auto the calls are constrained (`auto_tools`: the engine has a grammar
    backend) unless the request has a response format (one constraint per request: the
    output path then turns calls to unknown tools into text)."""
    if rendered is not None:
        forced = tool_structure(rendered)
        if forced.constraint is not None:
            structured = forced
        elif structured.constraint is None and auto_tools:
            structured = auto_tool_structure(rendered)
    if logit_bias is not None and not isinstance(logit_bias, Mapping):
        raise ApiError(400, "logit_bias must map token ids to numbers", "logit_bias")
    try:
        bias = replace(params, logit_bias=tuple(logit_bias.items())) if logit_bias else params
    except ValueError as exc:
        raise ApiError(400, str(exc), "logit_bias") from None
    if structured.constraint is None:
        return bias, structured
    return replace(bias, constraint=structured.constraint), structured


def name_field(exc: ApiError, structured: Structured) -> ApiError:
    """An engine refusal at submit, with `param` set to the request field it concerns."""
    if exc.status != 400 or exc.param is not None:
        return exc
    if exc.message.startswith("logit_bias"):
        return ApiError(400, exc.message, "logit_bias")
    if structured.field and exc.message.startswith("constraint "):
        return ApiError(400, f"{structured.field}: {exc.message}", structured.field)
    return exc


# -- one field each ---------------------------------------------------------------------------
def _get(body: Any, extra: dict[str, Any], name: str) -> Any:
    value = getattr(body, name, None)
    return extra.get(name) if value is None else value


def _response_format(value: Any, field: str) -> Constraint | None:
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if not isinstance(value, dict):
        raise ApiError(400, "response_format must be an object", field)
    kind = value.get("type")
    if kind == "json_object":
        return Constraint("json_object")
    if kind == "json_schema":
        inner = value.get("json_schema")
        if not isinstance(inner, dict):
            raise ApiError(400, "response_format.json_schema must be an object", field)
        return _schema(inner.get("schema", inner.get("schema_")), f"{field}.json_schema.schema")
    raise ApiError(400, f"response_format type {kind!r} is not supported", f"{field}.type")


def _vllm_structured(value: Any, field: str) -> Constraint | None:
    if not isinstance(value, dict):
        raise ApiError(400, "structured_outputs must be an object", field)
    given = {k: v for k, v in value.items() if k in ("json", "regex", "choice", "grammar") and v}
    if value.get("json_object"):
        given["json_object"] = True
    if len(given) != 1:
        raise ApiError(400, "structured_outputs needs exactly one of json, regex, choice, "
                       "grammar, json_object", field)  # fmt: skip
    ((kind, spec),) = given.items()
    if kind == "json_object":
        return Constraint("json_object")
    return _vllm_one(kind, spec, f"{field}.{kind}")


def _vllm_one(kind: str, spec: Any, field: str) -> Constraint:
    if kind == "json":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except ValueError as exc:
                raise ApiError(400, f"{field} is not valid JSON: {exc}", field) from None
        return _schema(spec, field)
    if kind == "choice":
        if not isinstance(spec, list) or not spec or not all(isinstance(c, str) for c in spec):
            raise ApiError(400, f"{field} must be a non-empty list of strings", field)
        # One lexeme: as rule alternatives, over 2,000 exceed llguidance's items per row.
        choices = " | ".join(map(encode_basestring_ascii, spec))
        return _constraint("grammar", f"start: CHOICE\nCHOICE: {choices}", field)
    if not isinstance(spec, str) or not spec:
        raise ApiError(400, f"{field} must be a non-empty string", field)
    return _constraint(kind, spec, field)


def _schema(schema: Any, field: str) -> Constraint:
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise ApiError(400, f"{field} must be a JSON schema object", field)
    return _constraint("json_schema", json.dumps(schema), field)


def _constraint(kind: str, spec: str, field: str) -> Constraint:
    try:
        return Constraint(kind, spec)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ApiError(400, f"{field}: {exc}", field) from None
