"""The output items of one answer, as the parser's deltas build them.

A text or reasoning piece extends the open item of its kind or opens a new one; a tool call opens
its own item and its argument pieces extend it (the deltas' contract: a call's argument pieces
follow its start). Opening an item closes the one before; the answer's finish closes the last, as
`cut` when the finish was the length limit (Responses: status `incomplete`). The Responses and
Messages routes render each change as their stream events and the items as their final output; chat
completions reads the items of each choice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from resin.recipe.deltas import Delta, ReasoningDelta, TextDelta, ToolCallArgsDelta, ToolCallStart

Kind = Literal["text", "reasoning", "tool_call"]
Change = Literal["open", "grow", "close"]


@dataclass(slots=True)
class Item:
    kind: Kind
    index: int
    """Position in the answer (Responses' `output_index`, Anthropic's block index)."""
    text: str = ""
    """The text, the reasoning, or the tool call's JSON arguments so far."""
    call_id: str = ""
    name: str = ""
    done: bool = False
    cut: bool = False
    """Closed by the length limit, unfinished."""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


class Items:
    def __init__(self) -> None:
        self.all: list[Item] = []
        self._calls: dict[int, Item] = {}

    def feed(
        self, deltas: Iterable[Delta], last: bool, cut: bool = False
    ) -> Iterator[tuple[Change, Item, str]]:
        """(change, item, piece) for each delta; `last` closes the open item at the end (`cut`:
        the answer hit its length limit, so that item is unfinished)."""
        for d in deltas:
            yield from self._feed(d)
        if last:
            yield from self._close(cut)

    def add(self, deltas: Iterable[Delta], last: bool = False, cut: bool = False) -> Items:
        for _ in self.feed(deltas, last, cut):
            pass
        return self

    def of(self, kind: Kind) -> list[Item]:
        return [it for it in self.all if it.kind == kind]

    def text(self, kind: Kind) -> str:
        return "".join(it.text for it in self.of(kind))

    def _open(
        self, kind: Kind, call_id: str = "", name: str = ""
    ) -> Iterator[tuple[Change, Item, str]]:
        yield from self._close()
        self.all.append(Item(kind, len(self.all), call_id=call_id, name=name))
        yield "open", self.all[-1], ""

    def _close(self, cut: bool = False) -> Iterator[tuple[Change, Item, str]]:
        if self.all and not self.all[-1].done:
            self.all[-1].done = True
            self.all[-1].cut = cut
            yield "close", self.all[-1], ""

    def _feed(self, d: Delta) -> Iterator[tuple[Change, Item, str]]:
        if isinstance(d, ToolCallStart):
            yield from self._open("tool_call", d.id, d.name)
            self._calls[d.index] = self.all[-1]
            return
        if isinstance(d, ToolCallArgsDelta):
            item = self._calls.get(d.index)
            piece = d.fragment
            if item is None or item is not self.all[-1] or item.done:
                return
        elif isinstance(d, TextDelta | ReasoningDelta) and d.text:
            kind: Kind = "text" if isinstance(d, TextDelta) else "reasoning"
            if not self.all or self.all[-1].done or self.all[-1].kind != kind:
                yield from self._open(kind)
            item, piece = self.all[-1], d.text
        else:
            return
        item.text += piece
        yield "grow", item, piece
