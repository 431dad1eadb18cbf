"""`JinjaRecipe`: render a checkpoint's own chat template; `load_recipe`: pick a recipe.

The template runs in the sandbox of `resin.recipe.sandbox` with the variables transformers
passes (`messages`, `tools`, `add_generation_prompt`, the special tokens, `enable_thinking`
when given, plus `template_kwargs`). Parsing uses the conventions of the template's family
(`resin.recipe.families`), detected from its markers unless `family` is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from resin.recipe.families import FAMILIES, detect_family
from resin.recipe.generic_tools import tool_history_as_text, with_tool_prompt
from resin.recipe.harmony_parser import HarmonyParser
from resin.recipe.hf_messages import to_hf_messages, to_hf_tools
from resin.recipe.prefill import check_prefill, continue_final
from resin.recipe.protocol import Recipe, RenderedPrompt, ResponseParser
from resin.recipe.registry import get_native_recipe, native_recipe_names
from resin.recipe.tagged import TaggedParser, TagSpec
from resin.recipe.template_limits import TemplateLimits
from resin.recipe.tool_choice import (
    ToolChoice,
    auto_calls,
    check_tool_choice,
    forced_prefix,
    forced_structures,
    unsupported,
)
from resin.recipe.types import Message, ToolCall, ToolDef, ToolResult
from resin.recipe.vision import Gemma3Vision, Vision
from resin.tokenizer import Tokenizer

# Families whose tool-call format is known well enough to force a call by a prompt prefix.
FORCEABLE_FAMILIES = frozenset({"qwen3", "chatml", "llama3", "deepseek_v3", "lfm2"})


class JinjaRecipe:
    """A recipe backed by a Jinja chat template (see module docstring). Gemma 3 templates with
    a tokenizer that has `<image_soft_token>` take images (`resin.recipe.vision`)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: str | None = None,
        family: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        limits: TemplateLimits | None = None,
    ) -> None:
        source = template if template is not None else tokenizer.chat_template
        if not source:
            raise ValueError("the tokenizer has no chat template; pass one or use a native recipe")
        from resin.recipe.sandbox import compile_template  # jinja2 is only needed here

        compile_template(source)  # syntax errors surface now, not at the first request
        family_name = family or detect_family(source)
        if family_name not in FAMILIES:
            raise ValueError(f"unknown template family {family_name!r}: {', '.join(FAMILIES)}")
        self.tokenizer = tokenizer
        self.template = source
        self.family = FAMILIES[family_name]
        self.name = f"jinja:{family_name}"
        self.template_kwargs = dict(template_kwargs or {})
        self.limits = limits or TemplateLimits()
        """What one render may use (`resin.recipe.sandbox`; `resin serve --template-*`)."""
        self.native_tools = "tools" in source
        """The template renders `tools` itself; otherwise `generic_tools.py` may state them."""
        self.generic_tools = not self.native_tools and self.family.spec == TagSpec()
        self.supports_tools = self.native_tools or self.generic_tools
        self.supports_reasoning = "think" in source or self.family.spec is None
        self.stop_token_ids = self._stop_ids()
        self.vision: Vision | None = None
        self.supports_images = False
        if family_name == "gemma" and tokenizer.token_to_id("<image_soft_token>") is not None:
            self.set_vision(Gemma3Vision())

    def set_vision(self, vision: Vision | None) -> None:
        """How this recipe takes images (from the checkpoint, `vision_for`); None refuses them."""
        self.vision = vision
        self.supports_images = vision is not None

    def _stop_ids(self) -> tuple[int, ...]:
        ids: list[int] = []
        for token in self.family.stop_tokens:
            token_id = self.tokenizer.token_to_id(token)
            if token_id is not None and token_id not in ids:
                ids.append(token_id)
        ids.extend(i for i in self.tokenizer.eos_token_ids if i not in ids)
        return tuple(ids)

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
        if any(m.images for m in messages) and not self.supports_images:
            raise ValueError(f"recipe {self.name!r} does not take images")
        if tools and not self.native_tools:
            if not self.generic_tools:
                raise ValueError(
                    f"this model's chat template cannot render tools ({self.name}); "
                    "send the request without tools or serve it with a recipe that has them"
                )
            messages = with_tool_prompt(messages, tools)
            hf_tools = None
        else:
            hf_tools = to_hf_tools(tools)
        if self.generic_tools:
            messages = tool_history_as_text(messages)

        def render_text(ms: Sequence[Message], generation_prompt: bool) -> str:
            return self._render_text(ms, hf_tools, generation_prompt, enable_thinking)

        images = [image for m in messages for image in m.images]
        if continue_final_message:
            check_prefill(tool_choice)
            text, prefill = continue_final(render_text, messages)
            if self.vision is None or not images:
                return RenderedPrompt(self.tokenizer.encode(text), text, prefill=prefill)
            return replace(self.vision.render(self.tokenizer, text, images), prefill=prefill)
        text = render_text(messages, add_generation_prompt)
        spec = self.family.spec
        if tool_choice is not None:
            check_tool_choice(tool_choice, tools)
            if spec is None or self.family.name not in FORCEABLE_FAMILIES:
                raise unsupported(tool_choice)
            prefix = forced_prefix(spec, tool_choice)
            structures = forced_structures(spec, tool_choice, tools or ())
            text += prefix
            return RenderedPrompt(self.tokenizer.encode(text), text, (), prefix, structures)
        auto = auto_calls(spec, tools) if tools and spec is not None else None
        if self.vision is None or not images:
            return RenderedPrompt(self.tokenizer.encode(text), text, auto_calls=auto)
        return replace(self.vision.render(self.tokenizer, text, images), auto_calls=auto)

    def _render_text(
        self,
        messages: Sequence[Message],
        hf_tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        enable_thinking: bool | None,
    ) -> str:
        info = self.tokenizer.info
        variables: dict[str, Any] = {
            "bos_token": info.bos_token or "",
            "eos_token": info.eos_token or "",
            "pad_token": info.pad_token or "",
            **self.template_kwargs,
            "messages": to_hf_messages(
                messages,
                string_arguments=self.family.string_arguments,
                reasoning_key=self.family.reasoning_key,
            ),
            "add_generation_prompt": add_generation_prompt,
        }
        if hf_tools is not None:
            variables["tools"] = hf_tools
        if enable_thinking is not None:
            variables["enable_thinking"] = enable_thinking
        from resin.recipe.sandbox import render_template

        return render_template(self.template, self.limits, **variables)

    def create_parser(
        self, prompt: RenderedPrompt, *, tools: Sequence[ToolDef] | None = None
    ) -> ResponseParser:
        spec = self.family.spec
        if spec is None:
            harmony = HarmonyParser(self.tokenizer, self.stop_token_ids)
            harmony.prime(prompt.prefill)
            return harmony
        if spec.bare_json_tools and not tools:
            spec = type(spec)(None, None, None, None)
        start = spec.reasoning_start
        in_reasoning = bool(start) and prompt.head.rstrip().endswith(start or "")
        parser = TaggedParser(
            self.tokenizer,
            self.stop_token_ids,
            spec,
            in_reasoning=in_reasoning and not prompt.forced_prefix,
        )
        parser.prime(prompt.primed)
        return parser


_PROBE_TOOL = ToolDef("lookup", "Look a word up", {"type": "object", "properties": {}})
# Without and with a system message (templates that add a default system prompt differ), a
# multi-turn chat, and a tool round trip.
_PROBES: tuple[tuple[tuple[Message, ...], bool], ...] = (
    ((Message("user", "Hi there"),), False),
    ((Message("system", "Be brief."), Message("user", "Hi there")), False),
    (
        (
            Message("system", "Be brief."),
            Message("user", "Hi"),
            Message("assistant", "Hello! How can I help?"),
            Message("user", "Define 'gleam'."),
        ),
        False,
    ),
    (
        (
            Message("system", "Be brief."),
            Message("user", "Define 'gleam'."),
            Message("assistant", [ToolCall("c1", "lookup", '{"word": "gleam"}')]),
            Message("tool", [ToolResult("c1", "a flash of light")]),
        ),
        True,
    ),
)


def _renders_alike(native: Recipe, jinja: JinjaRecipe) -> bool:
    """True when the native recipe renders the probe conversations as the template does."""
    for messages, with_tools in _PROBES:
        if with_tools and not jinja.native_tools:
            continue
        tools = [_PROBE_TOOL] if with_tools else None
        try:
            if (
                native.render(messages, tools=tools).text
                != jinja.render(messages, tools=tools).text
            ):
                return False
        except ValueError:
            return False
    return True


def load_recipe(tokenizer: Tokenizer, name: str | None = None) -> Recipe:
    """`name`: a native recipe, "jinja", or None to choose: the native recipe of the template's
    family when it renders the template's way (checked on probe conversations), else the
    template itself; a tokenizer without a template gets ChatML when it has ChatML's tokens."""
    if name is not None and name != "jinja":
        return get_native_recipe(name, tokenizer)
    if name == "jinja" or tokenizer.chat_template:
        jinja = JinjaRecipe(tokenizer)
        if name == "jinja":
            return jinja
        family = jinja.family.name
        if family in native_recipe_names():
            try:
                native = get_native_recipe(family, tokenizer)
            except ValueError:
                return jinja
            if _renders_alike(native, jinja):
                return native
        return jinja
    if tokenizer.token_to_id("<|im_start|>") is not None:
        return get_native_recipe("chatml", tokenizer)
    raise ValueError("the tokenizer has no chat template and no known chat tokens; name a recipe")
