"""Feed one model output to fresh parsers in different splits and compare the results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hypothesis import strategies as st

from resin.recipe import (
    ParseResult,
    ReasoningDelta,
    RenderedPrompt,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallEnd,
    ToolCallStart,
)


@dataclass(frozen=True)
class Outcome:
    text: str
    reasoning: str
    calls: tuple[tuple[str, str], ...]
    finish_reason: str
    has_error: bool


def outcome(result: ParseResult, deltas: list[Any]) -> Outcome:
    """The totals, after checking that the streamed deltas agree with them."""
    everything = [*deltas, *result.deltas]
    assert "".join(d.text for d in everything if isinstance(d, TextDelta)) == result.text
    assert "".join(d.text for d in everything if isinstance(d, ReasoningDelta)) == result.reasoning
    starts = [d for d in everything if isinstance(d, ToolCallStart)]
    ends = [d for d in everything if isinstance(d, ToolCallEnd)]
    assert [s.index for s in starts] == list(range(len(result.tool_calls)))
    assert [e.index for e in ends] == [s.index for s in starts]
    for call in result.tool_calls:
        index = next(s.index for s in starts if s.id == call.id)
        fragments = [d.fragment for d in everything if isinstance(d, ToolCallArgsDelta)]
        args = "".join(
            d.fragment for d in everything if isinstance(d, ToolCallArgsDelta) and d.index == index
        )
        assert args == call.arguments, fragments
    return Outcome(
        result.text,
        result.reasoning,
        tuple((c.name, c.arguments) for c in result.tool_calls),
        result.finish_reason,
        result.error is not None,
    )


def run_ids(
    recipe: Any,
    prompt: RenderedPrompt,
    ids: list[int],
    splits: list[int],
    reason: Literal["stop", "length"] = "stop",
    tools: Any = None,
) -> Outcome:
    parser = recipe.create_parser(prompt, tools=tools)
    deltas: list[Any] = []
    start = 0
    for end in [*sorted(set(splits)), len(ids)]:
        deltas.extend(parser.feed(ids[start:end]))
        start = end
    return outcome(parser.finish(reason), deltas)


def run_text(
    recipe: Any,
    prompt: RenderedPrompt,
    text: str,
    splits: list[int],
    reason: Literal["stop", "length"] = "stop",
    tools: Any = None,
) -> Outcome:
    parser = recipe.create_parser(prompt, tools=tools)
    deltas: list[Any] = []
    start = 0
    for end in [*sorted(set(splits)), len(text)]:
        deltas.extend(parser.feed_text(text[start:end]))
        start = end
    return outcome(parser.finish(reason), deltas)


def split_points(size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, size), max_size=min(size, 30))


def check_all_splits(
    recipe: Any,
    prompt: RenderedPrompt,
    output: str,
    data: st.DataObject,
    *,
    stop: bool = True,
    reason: Literal["stop", "length"] = "stop",
    tools: Any = None,
) -> Outcome:
    """Whole, token by token, random token splits and random text splits agree; returns it."""
    ids = recipe.tokenizer.encode(output)
    if stop:
        ids = [*ids, recipe.stop_token_ids[0]]
    whole = run_ids(recipe, prompt, ids, [], reason, tools)
    assert run_ids(recipe, prompt, ids, list(range(1, len(ids))), reason, tools) == whole
    splits = data.draw(split_points(len(ids)), label="token splits")
    assert run_ids(recipe, prompt, ids, splits, reason, tools) == whole
    text_splits = data.draw(split_points(len(output)), label="text splits")
    assert run_text(recipe, prompt, output, text_splits, reason, tools) == whole
    return whole
