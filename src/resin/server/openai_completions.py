"""POST /v1/completions: text or token-id prompts (one or a batch), echo + prompt logprobs.

lm-evaluation-harness scores multiple-choice tasks with `echo=true, logprobs=k,
max_tokens=0`: the answer is the prompt with each token's logprob; `max_tokens=0` still runs
one engine step (the engine always samples) and drops the generated token.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, cast

from fastapi import APIRouter, Request
from pydantic import Field
from starlette.responses import JSONResponse, Response

from resin.frontend.generation import TokenLogprob, Update
from resin.frontend.intake import Generations
from resin.recipe.deltas import TextDelta
from resin.recipe.plain import PlainTextParser
from resin.server.asgi import SSEResponse, until_disconnect
from resin.server.errors import ApiError
from resin.server.openai_chat import openai_sse, sampling_of, usage
from resin.server.schemas_openai import CompletionRequest as _Base
from resin.server.service import Service
from resin.server.structured import apply, openai_fields
from resin.server.unsupported import COMPLETIONS, refuse_unsupported

router = APIRouter()
MAX_PROMPTS = 64


class CompletionRequest(_Base):
    max_tokens: int | None = Field(16, ge=0)

    @property
    def prompts(self) -> list[str] | list[list[int]]:
        """`prompt` as a list of prompts (texts, or token-id lists); known before tokenizing."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [cast(list[int], p)]
        return cast("list[str] | list[list[int]]", p)


async def tokenized(svc: Service, prompts: list[str] | list[list[int]]) -> list[list[int]]:
    """Text prompts tokenized; every prompt checked to be non-empty and in the vocabulary."""
    if texts := [p for p in prompts if isinstance(p, str)]:
        svc.check_text(texts, "prompt")
    batch = [await svc.encode(p) if isinstance(p, str) else p for p in prompts]
    vocab = svc.tokenizer.vocab_size
    for given, ids in zip(prompts, batch, strict=True):
        if not ids:
            raise ApiError(400, "prompt is empty", "prompt")
        # the tokenizer's own ids are in its vocabulary; a client's are checked (a 4k-token
        # prompt's scan in Python is ~0.3 ms of the frontend's time to first token)
        if not isinstance(given, str) and any(t < 0 or t >= vocab for t in ids):
            raise ApiError(400, f"token ids must be in [0, {vocab})", "prompt")
    return batch


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    svc: Service = request.app.state.service
    svc.check_model(body.model)
    refuse_unsupported(body, COMPLETIONS)
    stops = body.stop_strings()
    svc.check_stops(stops)
    if body.stream and body.echo and body.max_tokens == 0:
        raise ApiError(400, "max_tokens=0 needs stream=false", "max_tokens")
    if body.suffix:
        raise ApiError(400, "suffix is not supported", "suffix")
    if not 1 <= len(body.prompts) <= MAX_PROMPTS:
        raise ApiError(400, f"between 1 and {MAX_PROMPTS} prompts", "prompt")
    replica = svc.requested_replica(request, body)
    with svc.reserve(body.n * len(body.prompts), request) as ticket:
        prompts = await tokenized(svc, body.prompts)
        structured = openai_fields(body)
        sampling = sampling_of(body, body.logprobs, body.logprobs if body.echo else None)
        eos = () if sampling["ignore_eos"] else svc.tokenizer.eos_token_ids
        max_tokens = None if body.max_tokens is None else max(1, body.max_tokens)
        runs = []
        for ids in prompts:
            params = svc.params(len(ids), max_tokens, sampling, eos)
            runs.append((ids, apply(params, structured, None, body.logit_bias)[0]))
        parser = lambda: PlainTextParser(svc.tokenizer, svc.tokenizer.eos_token_ids)  # noqa: E731
        gens = await svc.launch(
            ticket, runs, parser, stops, structured, replica=replica, request=request
        )
    rid = f"cmpl-{uuid.uuid4().hex}"
    prompt_ids = [ids for ids in prompts for _ in range(body.n)]
    if body.stream:
        include = bool(body.stream_options and body.stream_options.include_usage)
        base = {"id": rid, "object": "text_completion", "created": int(time.time())}
        base["model"] = svc.model
        choice = _chunks(svc, body, prompt_ids)
        return SSEResponse(openai_sse(gens, base, choice, include), on_close=gens.cancel)
    result = await until_disconnect(request, _collect(svc, gens, rid, body, prompt_ids))
    return JSONResponse(result)


def _logprobs(
    svc: Service,
    token_ids: Sequence[int],
    items: Sequence[TokenLogprob | None],
    offset: int,
) -> dict[str, Any]:
    tokens, lps, tops, offsets = [], [], [], []
    pos = offset
    for tid, item in zip(token_ids, items, strict=True):
        text = svc.token_text(tid)
        tokens.append(text)
        lps.append(None if item is None else item.logprob)
        tops.append(
            None
            if item is None
            else {svc.token_text(t.token_id): t.logprob for t in item.top} or None
        )
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


async def _collect(
    svc: Service, gens: Generations, rid: str, body: CompletionRequest, prompts: list[list[int]]
) -> dict[str, Any]:
    """The answer; `max_tokens=0` (scoring the prompt) drops the one generated token."""
    drop = body.max_tokens == 0
    answers = await gens.collect()
    choices = []
    for i, up in enumerate(answers):
        assert up.finish is not None
        text = "" if drop else "".join(d.text for d in up.deltas if isinstance(d, TextDelta))
        if body.echo:
            text = svc.tokenizer.decode(prompts[i], False) + text
        logprobs = None
        if body.logprobs is not None:
            ids: list[int] = [] if drop else list(up.token_ids)
            items: list[TokenLogprob | None] = [] if drop else list(up.logprobs)
            items += [None] * (len(ids) - len(items))
            if body.echo:
                prompt_items: list[TokenLogprob | None] = [None]
                prompt_items += up.prompt_logprobs or [None] * (len(prompts[i]) - 1)
                ids = prompts[i] + ids
                items = prompt_items[: len(prompts[i])] + items
            logprobs = _logprobs(svc, ids, items, 0)
        choices.append(
            {"index": i, "text": text, "logprobs": logprobs, "finish_reason": up.finish.reason}
        )
    use = usage([up.finish for up in answers if up.finish is not None])
    use["prompt_tokens"] = sum(len(p) for p in prompts[:: max(1, body.n)])
    use["total_tokens"] = use["prompt_tokens"] + use["completion_tokens"]
    if drop:
        use["completion_tokens"] = 0
        use["total_tokens"] = use["prompt_tokens"]
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": svc.model,
        "choices": choices,
        "usage": use,
    }


def _chunks(
    svc: Service, body: CompletionRequest, prompts: list[list[int]]
) -> Callable[[int, Update], dict[str, Any]]:
    """The chunk choice of each update: the echoed prompt before the first text, logprobs
    with their running text offset."""
    echoed = [not body.echo] * len(prompts)
    offsets = [0] * len(prompts)

    def choice(i: int, up: Update) -> dict[str, Any]:
        text = "".join(d.text for d in up.deltas if isinstance(d, TextDelta))
        if not echoed[i]:
            text = svc.tokenizer.decode(prompts[i], False) + text
            echoed[i] = True
        logprobs = None
        if body.logprobs is not None and up.logprobs:
            logprobs = _logprobs(svc, [x.token_id for x in up.logprobs], up.logprobs, offsets[i])
            offsets[i] += sum(len(t) for t in logprobs["tokens"])
        finish = None if up.finish is None else up.finish.reason
        return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}

    return choice
