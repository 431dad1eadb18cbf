"""Per-family response conventions the Jinja recipe needs: stop tokens, parser markers, how
the template wants tool-call arguments and reasoning. Detected from the template's text."""

from __future__ import annotations

from dataclasses import dataclass, field

from resin.recipe.deepseek import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END
from resin.recipe.tagged import TagSpec
from resin.recipe.toolcall_formats import (
    parse_deepseek_call,
    parse_glm_call,
    parse_pythonic_calls,
)


@dataclass(frozen=True)
class Family:
    """`spec` None means the harmony parser (gpt-oss)."""

    name: str
    stop_tokens: tuple[str, ...]
    spec: TagSpec | None = field(default_factory=TagSpec)
    string_arguments: bool = False
    reasoning_key: str = "reasoning_content"


_CHATML_STOPS = ("<|im_end|>", "<|endoftext|>")
FAMILIES: dict[str, Family] = {
    "qwen3": Family("qwen3", _CHATML_STOPS),
    "chatml": Family("chatml", _CHATML_STOPS),
    "llama3": Family(
        "llama3",
        ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        TagSpec(None, None, None, None, bare_json_tools=True),
    ),
    "deepseek_v3": Family(
        "deepseek_v3",
        ("<｜end▁of▁sentence｜>",),
        TagSpec(
            tool_start=CALL_BEGIN,
            tool_end=CALL_END,
            tool_body=parse_deepseek_call,
            ignored=(CALLS_BEGIN, CALLS_END),
        ),
        string_arguments=True,
    ),
    "lfm2": Family(
        "lfm2",
        _CHATML_STOPS,
        TagSpec(
            tool_start="<|tool_call_start|>",
            tool_end="<|tool_call_end|>",
            tool_body=parse_pythonic_calls,
        ),
    ),
    "gpt_oss": Family("gpt_oss", ("<|return|>", "<|call|>"), None, reasoning_key="thinking"),
    "glm4_moe": Family(
        "glm4_moe",
        ("<|endoftext|>", "<|user|>", "<|observation|>"),
        TagSpec(tool_body=parse_glm_call, strip_leading_newlines=True),
    ),
    "gemma": Family("gemma", ("<end_of_turn>", "<eos>")),
    "generic": Family("generic", ()),
}

# (marker in the template, family), most specific first.
_SIGNATURES = (
    ("<|channel|>", "gpt_oss"),
    ("<｜tool▁calls▁begin｜>", "deepseek_v3"),
    ("<｜Assistant｜>", "deepseek_v3"),
    ("<|tool_list_start|>", "lfm2"),
    ("<arg_key>", "glm4_moe"),
    ("<|start_header_id|>", "llama3"),
    ("<think>", "qwen3"),
    ("<|im_start|>", "chatml"),
    ("<start_of_turn>", "gemma"),
)


def detect_family(template: str) -> str:
    """The family whose markers the template uses; "generic" when none."""
    for marker, family in _SIGNATURES:
        if marker in template:
            return family
    return "generic"
