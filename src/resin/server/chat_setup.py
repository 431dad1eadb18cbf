"""The request setup the chat completions, responses and messages routes share.

Each route maps its body onto one `ChatSetup` (messages, tools, tool choice, thinking, token
budget, sampling, structured output, stop strings, generation count) and calls `start_chat`,
which reserves intake slots, renders, builds the SamplingParams (constraint and logit bias
included), creates the recipe's parsers (behind `KnownTools`: no call to a tool the request
did not offer) and starts the generations. Only the answer's shape differs between the
routes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from resin.frontend.intake import Generations
from resin.recipe import Message, RenderedPrompt, ToolDef
from resin.recipe.tool_choice import ToolChoice
from resin.server.media import check_images
from resin.server.service import Sampling, Service
from resin.server.structured import NONE, Structured, apply
from resin.server.tool_choice import KnownTools


@dataclass(frozen=True)
class ChatSetup:
    messages: Sequence[Message]
    tools: Sequence[ToolDef] = ()
    tool_choice: ToolChoice | None = None
    thinking: bool | None = None
    max_tokens: int | None = None
    sampling: Sampling = field(default_factory=dict)
    structured: Structured = NONE
    logit_bias: Mapping[Any, Any] | None = None
    continue_final: bool = False  # the model continues the last (assistant) message


async def start_chat(
    svc: Service,
    request: Request,
    build: Callable[[], ChatSetup],
    n: int = 1,
    stops: Sequence[str] = (),
    body: object = None,
) -> tuple[RenderedPrompt, Generations]:
    """Stop strings are checked and `n` intake slots reserved before `build()` runs (an
    overloaded server refuses cheaply); the rendered prompt and the started batch come back.
    `body`: where a client may name a data-parallel replica (`routed_dp_rank`)."""
    svc.check_stops(stops)
    replica = svc.requested_replica(request, body)
    with svc.reserve(n, request) as ticket:
        s = build()
        check_images(s.messages, svc.recipe.supports_images)
        rendered = await svc.render(
            s.messages, s.tools, s.thinking, s.tool_choice, s.continue_final
        )
        params = svc.params(
            len(rendered.token_ids), s.max_tokens, s.sampling, svc.recipe.stop_token_ids
        )
        params, fmt = apply(params, s.structured, rendered, s.logit_bias, svc.actor.has_grammar)
        tools = list(s.tools) or None
        parser = lambda: KnownTools(svc.recipe.create_parser(rendered, tools=tools), s.tools)  # noqa: E731
        batch = await svc.launch(
            ticket,
            [(rendered.token_ids, params)],
            parser,
            stops,
            fmt,
            rendered.multimodal,
            replica,
            request,
        )
    return rendered, batch
