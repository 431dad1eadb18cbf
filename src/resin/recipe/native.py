"""`NativeRecipe`: the shared frame of the hand-written recipes.

A subclass writes `render_text` (conversation -> prompt text, exactly as the family's official
template renders it) and `parser_spec`; this base encodes the text, finds the stop ids, refuses
images, and builds the parser with the right starting mode.
"""

from __future__ import annotations

from collections.abc import Sequence

from resin.recipe.prefill import check_prefill, continue_final
from resin.recipe.protocol import RenderedPrompt, ResponseParser
from resin.recipe.tagged import TaggedParser, TagSpec
from resin.recipe.tool_choice import (
    AutoCalls,
    ForcedStructure,
    ToolChoice,
    auto_calls,
    check_tool_choice,
    forced_prefix,
    forced_structures,
)
from resin.recipe.types import Message, ToolDef
from resin.tokenizer import Tokenizer


class NativeRecipe:
    """Base of the native recipes (see module docstring)."""

    name = "native"
    stop_tokens: tuple[str, ...] = ()
    supports_tools = True
    supports_reasoning = False
    supports_images = False

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = self._find_stop_ids()

    def _find_stop_ids(self) -> tuple[int, ...]:
        ids: list[int] = []
        for token in self.stop_tokens:
            token_id = self.tokenizer.token_to_id(token)
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
        for token_id in self.tokenizer.eos_token_ids:
            if token_id not in ids:
                ids.append(token_id)
        if not ids:
            raise ValueError(f"recipe {self.name!r}: the tokenizer has none of {self.stop_tokens}")
        return tuple(ids)

    def token(self, text: str) -> str:
        """A special token's text, checked to exist in the vocabulary."""
        if self.tokenizer.token_to_id(text) is None:
            raise ValueError(f"recipe {self.name!r} needs token {text!r}; the tokenizer lacks it")
        return text

    def render(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[ToolDef] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
        tool_choice: ToolChoice | None = None,
        continue_final_message: bool = False,
    ) -> RenderedPrompt:
        if not messages and not add_generation_prompt:
            raise ValueError("nothing to render: no messages")
        for message in messages:
            if message.images:
                raise ValueError(f"recipe {self.name!r} does not take images")
        tool_list = list(tools) if tools else None

        def render_text(ms: Sequence[Message], generation_prompt: bool) -> str:
            return self.render_text(
                list(ms),
                tools=tool_list,
                add_generation_prompt=generation_prompt,
                enable_thinking=enable_thinking,
            )

        prefill = ""
        if continue_final_message:
            check_prefill(tool_choice)
            text, prefill = continue_final(render_text, messages)
        else:
            text = render_text(messages, add_generation_prompt)
        prefix = ""
        structures: tuple[ForcedStructure, ...] = ()
        auto = None
        if tool_choice is not None:
            check_tool_choice(tool_choice, tools)
            prefix = self.tool_choice_prefix(tool_choice, list(tools or ()))
            text += prefix
            structures = forced_structures(self.parser_spec(tools), tool_choice, tools or ())
        elif tools and not continue_final_message:
            auto = self.auto_calls(list(tools))
        return RenderedPrompt(
            token_ids=self.tokenizer.encode(text),
            text=text,
            forced_prefix=prefix,
            forced_structures=structures,
            auto_calls=auto,
            prefill=prefill,
        )

    def tool_choice_prefix(self, choice: ToolChoice, tools: list[ToolDef]) -> str:
        """The forced start of the assistant turn for `choice` (`resin.recipe.tool_choice`)."""
        return forced_prefix(self.parser_spec(tools), choice)

    def auto_calls(self, tools: list[ToolDef]) -> AutoCalls | None:
        """How a call looks inside free text (`tool_choice` auto), for a grammar; None when
        the format cannot be described (`resin.recipe.tool_choice.auto_calls`)."""
        return auto_calls(self.parser_spec(tools), tools)

    def render_text(
        self,
        messages: list[Message],
        *,
        tools: list[ToolDef] | None,
        add_generation_prompt: bool,
        enable_thinking: bool | None,
    ) -> str:
        raise NotImplementedError

    def parser_spec(self, tools: Sequence[ToolDef] | None) -> TagSpec:
        raise NotImplementedError

    def starts_in_reasoning(self, prompt: RenderedPrompt) -> bool:
        """True when the generation prompt opened the reasoning block (the model continues
        it); a prefill primes the parser past that point itself."""
        spec = self.parser_spec(None)
        start = spec.reasoning_start
        return bool(start) and prompt.head.rstrip().endswith(start or "")

    def create_parser(
        self, prompt: RenderedPrompt, *, tools: Sequence[ToolDef] | None = None
    ) -> ResponseParser:
        parser = TaggedParser(
            self.tokenizer,
            self.stop_token_ids,
            self.parser_spec(tools),
            in_reasoning=not prompt.forced_prefix and self.starts_in_reasoning(prompt),
        )
        parser.prime(prompt.primed)
        return parser
