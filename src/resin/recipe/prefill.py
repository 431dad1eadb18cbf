"""Continuing the final assistant message (an assistant *prefill*).

Anthropic's Messages API continues a conversation whose last message is the assistant's, and
vLLM's `continue_final_message` (transformers' `apply_chat_template` option of that name) does
the same for chat completions: the model's output continues that message instead of a new
turn. The recipe renders the conversation without a generation prompt and cuts the text right
after the final message's content (its text, or its reasoning when it has no text), so the
turn's closing markup is gone and the model goes on from there.

Invariant: `RenderedPrompt.text` ends with `RenderedPrompt.prefill`, the part of the assistant
turn the prompt already holds (from the end of the generation prompt the same conversation
without its final message would get). The parser is primed with it, as with a forced tool-call
prefix: it starts in the state the prefill leaves (inside reasoning, after visible text, ...)
and the client never sees the prefill again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from resin.recipe.tool_choice import ToolChoice
from resin.recipe.types import Message, Reasoning, Role, Text

# (messages, add_generation_prompt) -> prompt text
RenderText = Callable[[Sequence[Message], bool], str]
# Marks the end of the final message's content in the rendered text (a private-use character
# no tokenizer-facing text holds; the space shows whether the template trimmed the content).
_TAG = "\ue002continue\ue002 "


def continue_final(render: RenderText, messages: Sequence[Message]) -> tuple[str, str]:
    """(prompt text, prefill) for `messages` whose last one the model continues.

    As transformers does, the final message's last text block (its reasoning when it has no
    text) gets a tag appended, the conversation is rendered without a generation prompt and
    cut at the tag (trailing spaces go too when the template trimmed them). A final assistant
    message with neither text nor reasoning is dropped (the model answers in a fresh turn, as
    Anthropic does with an empty prefill). `ValueError` when the last message is not the
    assistant's, holds tool calls, or the template drops the tagged content."""
    if not messages or messages[-1].role is not Role.ASSISTANT:
        raise ValueError("continuing the final message needs it to be the assistant's")
    final = messages[-1]
    if final.tool_calls or final.images:
        raise ValueError("an assistant prefill can hold text and reasoning, not tool calls")
    kind = Text if final.text.strip() else Reasoning
    where = [
        (i, b.text) for i, b in enumerate(final.content) if isinstance(b, kind) and b.text.strip()
    ]
    if not where:
        return render(messages[:-1], True), ""
    index, content = where[-1]
    blocks = list(final.content)
    blocks[index] = kind(content + _TAG)
    full = render([*messages[:-1], Message(final.role, blocks)], False)
    at = full.rfind(_TAG.rstrip())
    if at < 0:
        raise ValueError(
            "the chat template drops the final assistant message, so it cannot be continued"
        )
    text = full[:at] if full.startswith(_TAG, at) else full[:at].rstrip()
    try:
        head = render(messages[:-1], True)
    except ValueError:  # a template that refuses to start with the assistant
        head = ""
    if head and text.startswith(head):
        return text, text[len(head) :]
    for tail in (content, content.rstrip()):
        if text.endswith(tail):
            return text, tail
    return text, ""


def check_prefill(tool_choice: ToolChoice | None) -> None:
    """A continued message and a forced tool call both dictate how the answer starts."""
    if tool_choice is not None:
        raise ValueError("an assistant prefill cannot be combined with a forced tool_choice")
