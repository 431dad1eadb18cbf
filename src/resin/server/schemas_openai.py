"""Typed request bodies of the OpenAI routes. Unknown fields are tolerated (load generators
send fields of other servers); known ones the server does not implement are refused
(`server/unsupported.py`); bounds keep one request from asking for too much."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from resin.params import FIELD_TYPES, KNOBS

MAX_N = 16
MAX_MESSAGES = 2048  # messages / input items, counted while parsing (before any conversion)
MAX_TOOLS = 128  # tools (OpenAI's limit)
MAX_LOGIT_BIAS_ENTRIES = 300  # logit_bias entries (OpenAI's limit)
TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
"""Tool names as OpenAI and Anthropic accept them: no markup, nothing a recipe must escape."""


class Loose(BaseModel):
    """Every request body and part (all three APIs): unknown fields are tolerated."""

    model_config = ConfigDict(extra="allow")


class ContentPart(Loose):
    type: str
    text: str | None = None


class FunctionCallIn(Loose):
    name: str
    arguments: str = "{}"


class ToolCallIn(Loose):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(Loose):
    name: str = Field(pattern=TOOL_NAME)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolIn(Loose):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(Loose):
    name: str


class NamedToolChoice(Loose):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(Loose):
    include_usage: bool = False


class BodyFields(Loose):
    """Fields shared by chat and completions, sampling aside."""

    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_LOGIT_BIAS_ENTRIES)
    response_format: dict[str, Any] | None = None
    """Also read (vLLM): structured_outputs, guided_json/regex/choice/grammar (extras)."""


SAMPLING_FIELDS = tuple(k.public_name for k in KNOBS.values() if k.http is not None)
"""The sampling fields of OpenAI bodies: each `SamplingParams` field whose `Knob.http` gives
its bounds, by its public name, optional (None takes the checkpoint's or server's default)."""

if TYPE_CHECKING:  # the fields are built from `KNOBS`; code reads them through `sampling()`
    _WithSampling = BodyFields
else:
    _WithSampling = create_model(
        "_WithSampling",
        __base__=BodyFields,
        __module__=__name__,
        **{
            k.public_name: (FIELD_TYPES[k.name] | None, Field(None, **k.http))
            for k in KNOBS.values()
            if k.http is not None
        },
    )


class SamplingFields(_WithSampling):
    """Fields shared by chat and completions: `BodyFields` and `SAMPLING_FIELDS`."""

    def sampling(self) -> dict[str, Any]:
        """The sampling fields sent, by public name (None: omitted)."""
        return {name: getattr(self, name) for name in SAMPLING_FIELDS}

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return stops


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[ToolIn] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool = False
    """vLLM's: the model continues the last (assistant) message instead of a new turn."""


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None
